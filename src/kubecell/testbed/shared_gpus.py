"""Time-sliced GPUs and their node agent, emulated for the testbed: co-located pods slow each other down.

Why: the fake kubelet ends a pod after a fixed run time whoever shares its GPU, so nothing on the testbed could
show what an interference-aware rule is for. Here a share pod bound to a GPU does its work at the speed a
caller's model gives it beside the other pods on that GPU (read from the allocation record kubecell's binder
wrote: who shares with whom is the scheduler's decision, nothing else), and is marked Succeeded when the work
is done. The node agent's per-pod series are exported as the real agent exports them under time-slicing
(``kubecell_node_gpu_pod_utilization_ratio``, ``kubecell_node_gpu_pod_memory_bytes``,
``kubecell_node_gpu_pod_memory_utilization_ratio``; labels ``pod``, ``namespace``, ``node``, ``gpu``): a pod's
solo utilization times its speed, since a job slowed to 0.7x keeps the GPU busy 0.7 of the time it did alone.
A Prometheus scraping :func:`metrics_endpoint` then gives the profiler what it would read on a cluster.

Pods the caller does not describe, pods not Running, pods being deleted and pods without a readable record are
left to the fake kubelet. Each tick is one list of the namespace's pods; a failed tick is kept and reported, and the
next one goes on.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from prometheus_client import CollectorRegistry, Gauge, start_http_server

from kubecell.kube.names import ANNOTATION_ALLOCATION
from kubecell.kube.records import RecordError, parse_record
from kubecell.kube.rest import ApiError, Kube
from kubecell.testbed.kubelet import succeeded_status

log = logging.getLogger("kubecell.testbed.shared_gpus")

LABELS = ("pod", "namespace", "node", "gpu")
TICK_SECONDS = 0.2
"""How often work advances and who shares with whom is read again (a speed's resolution in time)."""


K = TypeVar("K", bound=Hashable)
"""What a pod's speed is modelled by (a job family's key)."""


@dataclass(frozen=True)
class EmulatedShare(Generic[K]):
    """What the emulated GPU knows of a pod: its ``work`` (seconds at solo speed), the ``key`` its speed is
    modelled by (a job family), and what the agent reports of it alone: ``utilization`` (0..1 of the GPU's
    time), ``memory_bytes`` and ``memory_utilization`` (0..1 of the memory controller's time; None: not
    exported, as by an agent whose driver does not sample it)."""

    work: float
    key: K
    utilization: float
    memory_bytes: float
    memory_utilization: float | None = None


@dataclass
class _Placed(Generic[K]):
    node: str
    gpu: str
    share: EmulatedShare[K]
    pod: Mapping[str, Any]


class SharedGpus(Generic[K]):
    """The namespace's share pods on emulated time-sliced GPUs (see the module); ``shares`` describes a pod by
    its name (None: not one of the caller's)."""

    def __init__(self, kube: Kube, namespace: str, shares: Callable[[str], EmulatedShare[K] | None],
                 speed: Callable[[K, Sequence[K]], float], registry: CollectorRegistry) -> None:
        """``speed``: a pod's speed (over solo) given its key and the keys of the other pods on its GPU (none:
        alone)."""
        self.kube, self.namespace, self.shares, self.speed = kube, namespace, shares, speed
        self.done: dict[str, float] = {}
        """Pod name -> work done, in seconds at solo speed."""
        self.run_seconds = 0.0
        self.shared_seconds = 0.0
        """Pod-seconds run, and of those run beside another pod."""
        self.utilization = Gauge("kubecell_node_gpu_pod_utilization_ratio",
                                 "Share of the GPU's time the pod's processes kept it busy", LABELS, registry=registry)
        self.memory = Gauge("kubecell_node_gpu_pod_memory_bytes", "GPU memory the pod's processes hold", LABELS,
                            registry=registry)
        self.controller = Gauge("kubecell_node_gpu_pod_memory_utilization_ratio", "Share of the memory "
                                "controller's time the pod's processes kept it busy", LABELS, registry=registry)
        self.failures: list[BaseException] = []
        self._labels: dict[str, tuple[str, str, str, str]] = {}

    def _placed(self) -> dict[str, _Placed[K]]:
        placed: dict[str, _Placed[K]] = {}
        for pod in self.kube.get(f"/api/v1/namespaces/{self.namespace}/pods")["items"]:
            meta = pod["metadata"]
            share = self.shares(meta["name"])
            text = (meta.get("annotations") or {}).get(ANNOTATION_ALLOCATION)
            if (share is None or text is None or meta.get("deletionTimestamp")
                    or (pod.get("status") or {}).get("phase") != "Running"):
                continue
            try:
                record = parse_record(text, pod=meta["name"], uid=meta["uid"])
            except RecordError as error:  # a record that is not kubecell's: nothing runs on an emulated GPU
                log.warning("emulated GPUs: %s", error)
                continue
            if record.gpus:
                placed[meta["name"]] = _Placed(record.node, record.gpus[0].uuid, share, pod)
        return placed

    def tick(self, seconds: float) -> None:
        """Advance every running share by ``seconds`` at its speed now; end those whose work is done."""
        placed = self._placed()
        holders: dict[tuple[str, str], list[str]] = {}
        for name, where in placed.items():
            holders.setdefault((where.node, where.gpu), []).append(name)
        for name in [name for name in self._labels if name not in placed]:
            for gauge in (self.utilization, self.memory, self.controller):
                with contextlib.suppress(KeyError):
                    gauge.remove(*self._labels[name])
            del self._labels[name]
        for name, where in placed.items():
            others = [placed[other].share.key for other in holders[where.node, where.gpu] if other != name]
            speed = self.speed(where.share.key, others)
            self.done[name] = self.done.get(name, 0.0) + seconds * speed
            self.run_seconds += seconds
            self.shared_seconds += seconds if others else 0.0
            labels = self._labels[name] = (name, self.namespace, where.node, where.gpu)
            self.utilization.labels(*labels).set(min(1.0, where.share.utilization * speed))
            self.memory.labels(*labels).set(where.share.memory_bytes)
            if where.share.memory_utilization is not None:
                self.controller.labels(*labels).set(min(1.0, where.share.memory_utilization * speed))
            if self.done[name] >= where.share.work:
                with contextlib.suppress(ApiError):  # deleted meanwhile (preempted): nothing to end
                    self.kube.patch(f"/api/v1/namespaces/{self.namespace}/pods/{name}/status",
                                    succeeded_status(where.pod), kind="strategic")

    @contextmanager
    def running(self) -> Iterator[SharedGpus[K]]:
        """Tick in a thread for as long as the block runs."""
        stop = threading.Event()

        def loop() -> None:
            last = time.monotonic()
            while not stop.wait(TICK_SECONDS):
                now = time.monotonic()
                try:
                    self.tick(now - last)
                except Exception as error:  # kept for the caller; the next tick goes on
                    log.warning("emulated GPUs: tick failed: %s", error)
                    self.failures.append(error)
                last = now

        thread = threading.Thread(target=loop, name="shared-gpus", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join(timeout=30)


@contextmanager
def metrics_endpoint(registry: CollectorRegistry) -> Iterator[str]:
    """``registry`` served as the node agent serves ``/metrics``, on a loopback port of the kernel's choice: yields
    ``127.0.0.1:PORT`` (a scrape target for ``testbed.prometheus.serve``)."""
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        yield f"127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
