"""The node agent's inventory publisher: what the GPUs are, and whether they are healthy, on the Node.

The scheduler never talks to a node agent; it reads the Node. So the agent writes what its
:class:`~kubecell.node.nvml.GpuBackend` discovered into the versioned ``kubecell.io/gpu-inventory``
annotation (the schema :mod:`kubecell.kube.inventory` defines and the scheduler parses) and keeps it fresh:

* when the inventory changes (a GPU hit by a critical XID, MIG reconfigured), at once: the XID waiter
  thread wakes the publisher, so a broken GPU reaches the scheduler in one API round trip;
* otherwise every ``interval`` seconds, with a new ``heartbeat`` timestamp, so a reader can tell a live
  agent from a stale annotation.

The faulted GPUs are kept on the Node too (``kubecell.io/gpu-faults``, :mod:`.fault_record`) and read back before
the first publish, so a restarted agent never publishes a broken GPU healthy; an operator clears them after a
reset (``kubecell.io/gpu-fault-clear``), followed at the next pass.

It also advertises ``kubecell.io/gpu-memory`` (MiB of the healthy GPUs) in the Node's
``status.capacity``/``allocatable``, so the kubelet admits pods that ask for GPU memory without a device
plugin for that resource. API errors are retried with a bounded, doubling back-off and the loop never
dies: a node agent that crashed on a flaky API server would leave the last annotation claiming healthy GPUs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from kubecell import __version__
from kubecell.core.errors import KubecellError
from kubecell.kube.clock import rfc3339
from kubecell.kube.gfd import catalog_model
from kubecell.kube.gpu_faults import describe
from kubecell.kube.inventory_schema import GpuRecord, IsolationMode, MigInstanceRecord, NodeInventory
from kubecell.kube.names import ANNOTATION_INVENTORY, RESOURCE_GPU_MEMORY
from kubecell.kube.rest import ApiError, Kube, json_pointer
from kubecell.node.fault_record import FaultRecord
from kubecell.node.nvml import GpuBackend, GpuDevice, summary
from kubecell.node.xid import HealthTracker

log = logging.getLogger("kubecell.node.inventory")

AGENT = f"kubecell-node-agent/{__version__}"
DEFAULT_INTERVAL = 30.0
"""Seconds between heartbeats when nothing changes."""
MAX_BACKOFF = 30.0
FIRST_BACKOFF = 0.5
XID_WAIT = 1.0
"""How long one ``wait_xid`` call blocks: also how fast the waiter notices ``stop``."""


class InventoryError(KubecellError):
    """The GPUs the backend reports cannot be described within the inventory's bounds (more than 256 GPUs, an
    index or a memory out of range ...): nothing is published, and the reason is logged, not a traceback."""


def build_inventory(devices: Sequence[GpuDevice], health: HealthTracker, *, agent: str = AGENT,
                    heartbeat: str = "") -> NodeInventory:
    """The annotation's content for discovered GPUs: catalog models, topology, MIG, health by UUID; raises
    ``InventoryError`` for what the schema bounds refuse."""
    try:
        return _inventory(devices, health, agent, heartbeat)
    except ValidationError as error:
        found = error.errors()
        what = (f"{'.'.join(str(part) for part in found[0]['loc']) or '?'}: {found[0]['msg']} (input "
                f"{str(found[0].get('input'))[:80]!r})") if found else str(error)[:300]
        raise InventoryError(f"the {len(devices)} GPU(s) the backend reports cannot be published: {error.title} "
                             f"{what}") from None


def _inventory(devices: Sequence[GpuDevice], health: HealthTracker, agent: str, heartbeat: str) -> NodeInventory:
    return NodeInventory(agent=agent, heartbeat=heartbeat, gpus=[
        GpuRecord(index=d.index, uuid=d.uuid, model=catalog_model(d.product, d.memory_mib), product=d.product,
                  memory_mib=d.memory_mib, numa_node=d.numa_node, nvlink_peers=list(d.nvlink_peers),
                  healthy=health.healthy(d.uuid), mig_mode=d.mig_mode,
                  mig_instances=[MigInstanceRecord(uuid=m.uuid, profile=m.profile, memory_mib=m.memory_mib,
                                                   start=m.start, size=m.size) for m in d.mig_instances])
        for d in sorted(devices, key=lambda device: device.index)])


def advertised_isolation(configured: Sequence[IsolationMode], devices: Sequence[GpuDevice]) -> list[IsolationMode]:
    """What the node gives: ``mig`` alone where its GPUs are in MIG mode (CUDA sees only their instances, so a
    whole GPU or a time share of one cannot be given), else the configured modes."""
    if any(device.mig_mode == "enabled" for device in devices):
        return ["mig"]
    return [mode for mode in configured if mode != "mig"]


class InventoryPublisher:
    """Keeps one Node's inventory annotation and GPU-memory capacity in step with a GPU backend.

    ``run`` blocks until ``stop``; ``start`` runs it (and the XID waiter) in daemon threads. Counters
    (``publishes``, ``failures``) and ``last`` (the inventory last written) are for tests and metrics."""

    def __init__(self, kube: Kube, node_name: str, backend: GpuBackend, *, interval: float = DEFAULT_INTERVAL,
                 health: HealthTracker | None = None, agent: str = AGENT, advertise_memory: bool = True,
                 max_backoff: float = MAX_BACKOFF, isolation: Sequence[IsolationMode] = ("accounting",),
                 device_plugin: bool = False, on_change: Callable[[NodeInventory], None] | None = None) -> None:
        self.isolation = list(isolation)
        """The isolation modes this node's agent can give, advertised to the scheduler."""
        self.device_plugin = device_plugin
        """Whether kubecell's device plugin serves this node (the scheduler then binds GPU pods one at a time)."""
        self.on_change = on_change
        """Called with each new inventory (the device plugins follow GPU health from it)."""
        self.kube = kube
        self.node_name = node_name
        self.backend = backend
        self.interval = interval
        self.health = health or HealthTracker()
        self.faults = FaultRecord(kube, self.health)
        """The faulted GPUs kept on the Node, read back before the first publish: a restart forgets none."""
        self.agent = agent
        self.advertise_memory = advertise_memory
        self.max_backoff = max_backoff
        self.stop_event = threading.Event()
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []
        self.last: NodeInventory | None = None
        self._advertised: tuple[int, int] | None = None
        self.publishes = 0
        self.failures = 0
        self.last_error: str = ""

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        for target, name in ((self.run, "inventory-publisher"), (self.watch_xids, "xid-waiter")):
            thread = threading.Thread(target=target, name=f"{name}-{self.node_name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 5.0) -> None:
        self.stop_event.set()
        self._wake.set()
        for thread in self._threads:
            thread.join(timeout=timeout)
        self._threads.clear()

    def wake(self) -> None:
        """Publish now (a health change, an operator's request) instead of at the next heartbeat."""
        self._wake.set()

    # ------------------------------------------------------------------ the loops
    def run(self) -> None:
        """Publish on change and on every heartbeat; back off on errors; return only on ``stop``."""
        next_heartbeat = 0.0
        backoff = 0.0
        published_key: str | None = None
        while not self.stop_event.is_set():
            self._wake.clear()
            try:
                self.faults.sync(self.node_name)
                devices = self.backend.devices()
                if published_key is None:
                    log.info("node %s: %s", self.node_name, summary(devices))
                inventory = build_inventory(devices, self.health, agent=self.agent).model_copy(
                    update={"isolation": advertised_isolation(self.isolation, devices),
                            "device_plugin": self.device_plugin})
                record = self.faults.annotations()
                key = inventory.to_annotation() + str(record)
                if key != published_key and self.on_change is not None:
                    self.on_change(inventory)
                if key != published_key or time.monotonic() >= next_heartbeat:
                    self.publish(inventory, record)
                    published_key = key
                    next_heartbeat = time.monotonic() + self.interval
                if self.advertise_memory:
                    self.advertise(inventory)
                backoff = 0.0
                pause = max(0.0, next_heartbeat - time.monotonic())
            except (KubecellError, OSError) as error:
                pause = backoff = min(self.max_backoff, backoff * 2 or FIRST_BACKOFF)
                self._failed(error, pause)
            except Exception as error:  # a bug must not silence the node: log it, keep publishing
                pause = backoff = min(self.max_backoff, backoff * 2 or FIRST_BACKOFF)
                log.exception("inventory of %s: unexpected error", self.node_name)
                self._failed(error, pause)
            self._wake.wait(pause)

    def _failed(self, error: BaseException, pause: float) -> None:
        self.failures += 1
        self.last_error = str(error)
        log.warning("inventory of %s not published (%s); retrying in %.1f s", self.node_name, error, pause)

    def watch_xids(self) -> None:
        """Wait for XIDs; a critical one marks the GPU unhealthy and wakes the publisher."""
        backoff = 0.0
        while not self.stop_event.is_set():
            try:
                event = self.backend.wait_xid(XID_WAIT)
                backoff = 0.0
            except KubecellError as error:
                backoff = min(self.max_backoff, backoff * 2 or FIRST_BACKOFF)
                log.warning("XID events of %s unavailable (%s); retrying in %.1f s", self.node_name, error, backoff)
                self.stop_event.wait(backoff)
                continue
            if event is None or not event.uuid:
                continue
            if self.health.record(event):
                log.warning("node %s GPU %d (%s): %s, marked unhealthy", self.node_name, event.index, event.uuid,
                            describe(event.code))
                self.wake()
            else:
                log.info("node %s GPU %d: %s (not critical or already unhealthy)", self.node_name, event.index,
                         describe(event.code))

    # ------------------------------------------------------------------ API writes
    def publish(self, inventory: NodeInventory, record: Mapping[str, str | None]) -> None:
        """Write the annotation with a fresh heartbeat, and the fault ``record`` (``FaultRecord.annotations``;
        JSON merge patch: other annotations untouched)."""
        stamped = inventory.model_copy(update={"heartbeat": rfc3339()})
        self.kube.patch(f"/api/v1/nodes/{self.node_name}", {"metadata": {"annotations": {
            ANNOTATION_INVENTORY: stamped.to_annotation(), **record}}})
        self.last = stamped
        self.publishes += 1

    def advertise(self, inventory: NodeInventory) -> None:
        """``kubecell.io/gpu-memory`` on the Node's status: capacity all GPUs, allocatable the healthy ones.

        A JSON patch on the ``/status`` subresource (``add`` replaces an existing key), written only when
        the numbers change: the kubelet keeps extended resources it does not manage."""
        total = sum(gpu.memory_mib for gpu in inventory.gpus)
        healthy = sum(gpu.memory_mib for gpu in inventory.gpus if gpu.healthy)
        if self._advertised == (total, healthy):
            return
        path = f"/api/v1/nodes/{self.node_name}/status"
        ops: list[dict[str, Any]] = [
            {"op": "add", "path": json_pointer("status", "capacity", RESOURCE_GPU_MEMORY), "value": str(total)},
            {"op": "add", "path": json_pointer("status", "allocatable", RESOURCE_GPU_MEMORY), "value": str(healthy)}]
        try:
            self.kube.patch(path, ops, kind="json")
        except ApiError as error:
            if error.status != 422:  # 422: status.capacity itself is absent (a Node nobody reported yet)
                raise
            self.kube.patch(path, {"status": {"capacity": {RESOURCE_GPU_MEMORY: str(total)},
                                              "allocatable": {RESOURCE_GPU_MEMORY: str(healthy)}}})
        self._advertised = (total, healthy)
