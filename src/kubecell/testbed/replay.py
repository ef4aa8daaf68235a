"""The packing experiment on a real cluster: the same arrivals, placed by whatever scheduler runs there.

``kubecell sim packing`` replays a pod list through a placement policy in memory. ``replay`` replays
the same seeded arrival sequence (shuffle and inflation drawn exactly as the simulator draws them) as
real Pods, one at a time: each is created, its fate is awaited (bound, or marked unschedulable), a pod
that does not fit is deleted (the protocol gives it no second chance), and the arrived and allocated
GPU milli are recorded as the simulator records them. With kubecell's scheduler given the simulator's
typical pods and node tie-break order (``plan.scheduler_options``), the two must agree: that is the
proof that the policy measured in the simulator is the policy that runs.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kubecell.core.book import AllocationBook
from kubecell.core.errors import KubecellError
from kubecell.core.model import MILLI_PER_GPU, Node
from kubecell.kube.names import ANNOTATION_GPU_MODELS, GFD_PRODUCT, RESOURCE_GPU, RESOURCE_GPU_MILLI, k8s_name
from kubecell.kube.rest import ApiError, Kube
from kubecell.scheduler.options import SchedulerOptions
from kubecell.scheduler.scheduler import Scheduler
from kubecell.sim.packing.experiment import RunRecord, typical_pods_of
from kubecell.sim.packing.workload import arrival_sequence
from kubecell.sim.traces.openb import TracePod

FATE_TIMEOUT = 60.0
"""Seconds a pod may wait for its scheduler's verdict before the replay gives up (a stuck scheduler)."""


class ReplayError(KubecellError):
    """The replay could not go on (a pod got no verdict in time, the API server refused a pod)."""


@dataclass(frozen=True)
class ReplayPlan:
    """One seeded run of the packing protocol: what arrives, in which order, and how ties break."""

    nodes: tuple[Node, ...]
    sequence: tuple[TracePod, ...]
    tie_ranks: dict[str, int]
    typical: tuple[Any, ...]
    seed: int
    cluster_gpu_milli: int

    def scheduler_options(self, placement: str) -> SchedulerOptions:
        """Options under which kubecell's scheduler decides as ``run_packing`` would for this plan."""
        return SchedulerOptions(placement=placement, typical_pods=self.typical, tie_ranks=self.tie_ranks)


def plan(nodes: Sequence[Node], pods: Sequence[TracePod], seed: int, inflate: float = 1.3) -> ReplayPlan:
    """Draw the arrivals and the node tie-break order exactly as ``run_packing`` draws them."""
    rng = np.random.default_rng(seed)
    total = AllocationBook(nodes).total_gpu_milli
    sequence = arrival_sequence(pods, total, inflate, rng)
    tie_rank = rng.permutation(len(nodes)).astype(np.int64)
    return ReplayPlan(tuple(nodes), tuple(sequence), {k8s_name(n.name): int(tie_rank[i]) for i, n in enumerate(nodes)},
                      tuple(typical_pods_of(pods)), seed, total)


KUBECELL = "kubecell"
"""The ``schedulerName`` whose pods ask for kubecell's resources; any other scheduler gets Kubernetes' own."""


@contextlib.contextmanager
def own_scheduler(kube: Kube, options: SchedulerOptions, *, ready_timeout: float = 300.0) -> Iterator[Scheduler]:
    """kubecell's scheduler in a thread of this process for as long as the block runs (a replay against
    kubecell decides with the plan's options, which a scheduler deployed in the cluster would not have)."""
    scheduler = Scheduler(kube, options)
    thread = threading.Thread(target=scheduler.run, name="kubecell-scheduler", daemon=True)
    thread.start()
    try:
        scheduler.ready.wait(ready_timeout)
        yield scheduler
    finally:
        scheduler.shutdown()
        thread.join(timeout=30)


def pod_manifest(pod: TracePod, name: str, namespace: str, scheduler: str) -> dict[str, Any]:
    """The trace pod as a Pod. For kubecell it asks kubecell's resources (a share of one GPU, or whole
    GPUs, and the GPU models as an annotation); for any other scheduler it asks what stock Kubernetes can
    express: whole ``nvidia.com/gpu`` (a share becomes one whole GPU) and the models as required node
    affinity on GPU Feature Discovery's product label."""
    limits: dict[str, str] = {}
    spec: dict[str, Any] = {"schedulerName": scheduler, "terminationGracePeriodSeconds": 0}
    annotations: dict[str, str] = {}
    if pod.gpu_count:
        if pod.gpu_milli >= MILLI_PER_GPU or scheduler != KUBECELL:
            limits[RESOURCE_GPU] = str(pod.gpu_count)
        else:
            limits[RESOURCE_GPU_MILLI] = str(pod.gpu_milli)
    if pod.gpu_models and scheduler == KUBECELL:
        annotations[ANNOTATION_GPU_MODELS] = ",".join(sorted(pod.gpu_models))
    elif pod.gpu_models:
        term = {"matchExpressions": [{"key": GFD_PRODUCT, "operator": "In", "values": sorted(pod.gpu_models)}]}
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [term]}}}
    spec["containers"] = [{"name": "main", "image": "replay",
                           "resources": {"requests": {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi"},
                                         "limits": limits}}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations}, "spec": spec}


def _fate(kube: Kube, path: str) -> str | None:
    pod = kube.get(path)
    if pod["spec"].get("nodeName"):
        return "bound"
    for condition in pod["status"].get("conditions") or []:
        if condition["type"] == "PodScheduled" and condition["status"] == "False":
            return "unschedulable"
    return None


def replay(kube: Kube, plan_: ReplayPlan, *, namespace: str, scheduler: str = "kubecell",
           policy: str = "replay", progress: Callable[[int, int], None] | None = None) -> RunRecord:
    """Create the plan's pods one at a time and record what the cluster's scheduler did with each."""
    started = time.perf_counter()
    count = len(plan_.sequence)
    arrived = np.zeros(count, np.int64)
    allocated = np.zeros(count, np.int64)
    arrived_milli = allocated_milli = failed = 0
    for i, pod in enumerate(plan_.sequence):
        name = f"p{i:06d}"
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        try:
            kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_manifest(pod, name, namespace, scheduler))
        except ApiError as error:
            raise ReplayError(f"pod {i} ({pod.name}) refused by the API server: {error}") from None
        deadline = time.monotonic() + FATE_TIMEOUT
        fate = None
        while fate is None:
            if time.monotonic() > deadline:
                raise ReplayError(f"pod {namespace}/{name} ({pod.name}) got no verdict in {FATE_TIMEOUT:.0f} s")
            fate = _fate(kube, path)
            if fate is None:
                time.sleep(0.01)
        arrived_milli += pod.total_gpu_milli
        if fate == "bound":
            allocated_milli += pod.total_gpu_milli
        else:
            failed += 1
            kube.delete(path, gracePeriodSeconds=0)  # the protocol gives a pod that does not fit no retry
        arrived[i] = arrived_milli
        allocated[i] = allocated_milli
        if progress is not None:
            progress(i + 1, count)
    idle = plan_.cluster_gpu_milli - allocated
    return RunRecord(policy=policy, seed=plan_.seed, cluster_gpu_milli=plan_.cluster_gpu_milli, arrived=arrived,
                     allocated=allocated, fragment=np.full(count, np.nan), idle=idle, placed=count - failed,
                     failed=failed, seconds=time.perf_counter() - started)
