"""What the cluster holds, as kubecell sees it: the report behind ``kubecell inspect``.

Built from plain API objects (Node and Pod dicts as the API server returns them, the VirtualCluster objects
and the tenant ConfigMap) with no API calls, so every number the command prints is unit-testable. The books
are the pods' allocation records (``kubecell.io/allocation``): per GPU, the milli-GPU and MiB held and by
whom; pods another scheduler bound hold their GPUs as whole GPUs (``other``), exactly as kubecell's
scheduler accounts them. A record the scheduler would not believe (``scheduler.trust``: unreadable, copied,
edited, naming another node) is listed with its error and its pod counted as ``other``, as the scheduler
holds it; ended pods (Succeeded, Failed) hold nothing, terminating ones hold until they are gone. Per virtual
cluster, the GPUs in use by class (guaranteed, borrowed, opportunistic; a deleted VC's as opportunistic)
beside its guarantee, from the tenants the scheduler runs (the same rule: ``tenant_source``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubecell.core.errors import InvalidInputError
from kubecell.core.model import MILLI_PER_GPU, Node
from kubecell.core.tenancy.config import Tenants
from kubecell.kube.accepted import AcceptedVc
from kubecell.kube.dialects import DemandError, pod_demand
from kubecell.kube.tenant_source import SourceKind, TenantInputs, TenantMemory, choose_tenants

__all__ = ["OTHER", "GpuReport", "InspectReport", "NodeReport", "TenantSource", "build_report"]
from kubecell.kube import pods
from kubecell.kube.gpu_faults import GpuFaultsError, RecordedFault, parse_faults
from kubecell.kube.inventory import NodeView, node_view
from kubecell.kube.names import ANNOTATION_GPU_FAULTS
from kubecell.kube.records import AllocationRecord, RecordError
from kubecell.kube.trust import forfeited, placement_disagreement, standing_disagreement
from kubecell.scheduler.foreign_holds import foreign_hold

OTHER = "other"
"""The VC, class and isolation of GPUs held by pods another scheduler bound."""

CLASSES = ("guaranteed", "borrowed", "opportunistic")


@dataclass
class GpuReport:
    index: int
    uuid: str
    model: str
    healthy: bool
    memory_total_mib: int
    milli_allocated: int = 0
    memory_allocated_mib: int = 0
    pods: list[str] = field(default_factory=list)
    milli_total: int = MILLI_PER_GPU
    fault: str = ""
    """Why the node agent took it out of service (``kubecell.io/gpu-faults``: the XID and when); empty if none."""


@dataclass
class NodeReport:
    name: str
    gpus: list[GpuReport]
    excluded: str = ""
    """Why kubecell places nothing here (cordoned, not Ready, unreadable inventory); empty when it does."""
    other_gpus: int = 0
    """Whole GPUs held by pods another scheduler bound (which GPUs, kubecell cannot see)."""

    @property
    def models(self) -> list[str]:
        return sorted({gpu.model for gpu in self.gpus})

    @property
    def unhealthy(self) -> int:
        return sum(not gpu.healthy for gpu in self.gpus)

    @property
    def milli_total(self) -> int:
        return sum(gpu.milli_total for gpu in self.gpus)

    @property
    def milli_allocated(self) -> int:
        return sum(gpu.milli_allocated for gpu in self.gpus) + self.other_gpus * MILLI_PER_GPU

    @property
    def memory_total_mib(self) -> int:
        return sum(gpu.memory_total_mib for gpu in self.gpus)

    @property
    def memory_allocated_mib(self) -> int:
        return sum(gpu.memory_allocated_mib for gpu in self.gpus)


@dataclass(frozen=True)
class PodReport:
    pod: str
    node: str
    gpus: tuple[int, ...] = ()
    milli: int = 0
    """Per GPU (1000 for whole GPUs)."""
    memory_mib: int = 0
    """Per GPU."""
    isolation: str = ""
    vc: str = ""
    job_class: str = ""
    scheduler: str = ""
    error: str = ""
    """Why the pod's record was not counted; its GPUs are then unknown."""


@dataclass(frozen=True)
class PendingReport:
    pod: str
    scheduler: str
    ask: str
    reason: str


@dataclass
class VcReport:
    name: str
    guaranteed_gpus: int = 0
    in_use_milli: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CLASSES, 0))
    pods: int = 0

    @property
    def in_use_gpus(self) -> float:
        return sum(self.in_use_milli.values()) / MILLI_PER_GPU

    @property
    def borrowed_share(self) -> float:
        """Of what the VC uses, the part above its guarantee that it borrows (0 when it uses nothing)."""
        total = sum(self.in_use_milli.values())
        return self.in_use_milli["borrowed"] / total if total else 0.0


@dataclass(frozen=True)
class TenantSource:
    """Where the VCs and guarantees of the report come from, as the scheduler decides it
    (``tenant_source.choose_tenants``)."""

    kind: SourceKind
    summary: str
    """One line for people: ``3 VirtualClusters (accepted)``, ``ConfigMap kubecell-system/kubecell-tenants``,
    ``whole-cluster default (VC default owns every GPU)``."""


@dataclass
class InspectReport:
    nodes: list[NodeReport]
    pods: list[PodReport]
    pending: list[PendingReport]
    vcs: list[VcReport]
    warnings: list[str] = field(default_factory=list)
    tenants: TenantSource = field(default_factory=lambda: TenantSource("none", "no schedulable node"))

    def to_data(self) -> dict[str, Any]:
        """Plain data with stable camelCase keys (``-o json|yaml``)."""
        return {
            "nodes": [{
                "name": n.name, "models": n.models, "excluded": n.excluded,
                "milliTotal": n.milli_total, "milliAllocated": n.milli_allocated,
                "memoryTotalMiB": n.memory_total_mib, "memoryAllocatedMiB": n.memory_allocated_mib,
                "otherSchedulerGpus": n.other_gpus,
                "gpus": [{"index": g.index, "uuid": g.uuid, "model": g.model, "healthy": g.healthy, "fault": g.fault,
                          "milliTotal": g.milli_total, "milliAllocated": g.milli_allocated,
                          "memoryTotalMiB": g.memory_total_mib, "memoryAllocatedMiB": g.memory_allocated_mib,
                          "pods": g.pods} for g in n.gpus]} for n in self.nodes],
            "pods": [{"pod": p.pod, "node": p.node, "gpus": list(p.gpus), "milli": p.milli, "memoryMiB": p.memory_mib,
                      "isolation": p.isolation, "vc": p.vc, "class": p.job_class, "scheduler": p.scheduler,
                      "error": p.error} for p in self.pods],
            "pending": [{"pod": p.pod, "scheduler": p.scheduler, "ask": p.ask, "reason": p.reason}
                        for p in self.pending],
            "virtualClusters": [{"name": v.name, "guaranteedGpus": v.guaranteed_gpus, "inUseGpus": v.in_use_gpus,
                                 "inUseGpusByClass": {c: m / MILLI_PER_GPU for c, m in v.in_use_milli.items()},
                                 "borrowedShare": round(v.borrowed_share, 4), "pods": v.pods} for v in self.vcs],
            "cluster": {"milliTotal": sum(n.milli_total for n in self.nodes),
                        "milliAllocated": sum(n.milli_allocated for n in self.nodes),
                        "memoryTotalMiB": sum(n.memory_total_mib for n in self.nodes),
                        "memoryAllocatedMiB": sum(n.memory_allocated_mib for n in self.nodes)},
            "warnings": self.warnings,
            "tenantSource": {"kind": self.tenants.kind, "summary": self.tenants.summary},
        }


def _hardware(obj: Mapping[str, Any]) -> tuple[NodeView, str]:
    """The node's GPUs even where kubecell places nothing (a cordoned or NotReady node still holds pods),
    and why it is excluded."""
    try:
        excluded = node_view(obj).excluded
        status = dict(obj.get("status") or {}, conditions=[{"type": "Ready", "status": "True"}])
        spec = {k: v for k, v in (obj.get("spec") or {}).items() if k != "unschedulable"}
        return node_view(dict(obj, spec=spec, status=status)), excluded
    except InvalidInputError as error:
        name = str((obj.get("metadata") or {}).get("name", ""))
        return NodeView(name, None, f"unreadable inventory: {error}"), f"unreadable inventory: {error}"


def _faults(name: str, obj: Mapping[str, Any], warnings: list[str]) -> dict[str, RecordedFault]:
    """The node agent's fault record, read as the agent reads it back (entries it would leave out are left out
    here too); one warning where it cannot be read at all."""
    text = ((obj.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_GPU_FAULTS)
    if text is None:
        return {}
    try:
        return parse_faults(text)[0]
    except GpuFaultsError as error:
        warnings.append(f"node {name}: annotation {ANNOTATION_GPU_FAULTS} {error}")
        return {}


def _ask(pod: Mapping[str, Any]) -> str:
    try:
        request = pod_demand(pod).request
    except DemandError as error:
        return f"refused: {error}"
    if request.gpu_count > 1 or request.gpu_milli >= MILLI_PER_GPU:
        return f"{request.gpu_count} GPU" + ("s" if request.gpu_count > 1 else "")
    parts = [f"{request.gpu_milli} milli"] if request.gpu_milli else []
    parts += [f"{request.gpu_memory_mib} MiB"] if request.gpu_memory_mib else []
    return " + ".join(parts) or "no GPU"


def _waiting_reason(pod: Mapping[str, Any]) -> str:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return str(condition.get("message") or condition.get("reason") or "unschedulable")
    return "not yet considered by the scheduler"


def build_report(node_objs: Sequence[Mapping[str, Any]], pod_objs: Sequence[Mapping[str, Any]],
                 tenants_configmap: Mapping[str, Any] | None = None, *, scheduler: str | None = "kubecell",
                 virtualcluster_objs: Sequence[Mapping[str, Any]] | None = None, tenants_key: str = "tenants.yaml",
                 tenants_configmap_name: str = "kubecell-system/kubecell-tenants",
                 tenants_source: str = "configmap kubecell-system/kubecell-tenants",
                 default_vc: str = "default", accepted_nodes: Sequence[Node] | None = None,
                 accepted_virtualclusters: Sequence[AcceptedVc] | None = None,
                 accepted_tenants_text: str | None = None) -> InspectReport:
    """The report from listed objects. ``scheduler``: whose pending pods to list (None: every scheduler's);
    ``virtualcluster_objs``: the VirtualCluster objects (None or empty: none, or the CRD is not installed);
    ``accepted_nodes``: the cluster the tenants in force were accepted on (``kubecell-accepted-cluster``);
    ``accepted_virtualclusters``: the VirtualCluster set the scheduler keeps in force (the same ConfigMap; None:
    none recorded or unreadable), read as a restarted scheduler reads it, so that a VC whose edit was refused is
    shown with the older guarantee it keeps; ``accepted_tenants_text``: the tenants ConfigMap text it keeps in force
    while an edit of it is refused (the same ConfigMap; None: none recorded)."""
    warnings: list[str] = []
    nodes: dict[str, NodeReport] = {}
    hardware: list[Node] = []
    for obj in sorted(node_objs, key=lambda o: str(o["metadata"]["name"])):
        view, excluded = _hardware(obj)
        if view.node is not None:
            hardware.append(view.node)
        gpus = [GpuReport(g.index, view.uuids[g.index] if g.index < len(view.uuids) else "", g.model, g.healthy,
                          g.memory_mib) for g in (view.node.gpus if view.node else ())]
        faults = _faults(view.name, obj, warnings)
        for report in gpus:
            report.fault = str(faults[report.uuid]) if report.uuid in faults else ""
        told = excluded or (f"GPUs not placed: {view.gpu_note}" if view.gpu_note else "")
        nodes[view.name] = NodeReport(view.name, gpus, told)
    objects = list(virtualcluster_objs or ())
    text = ((tenants_configmap or {}).get("data") or {}).get(tenants_key)
    inputs = TenantInputs(objects, str(text) if text is not None else None, lambda: list(accepted_nodes or ()),
                          configmap_name=tenants_configmap_name, source=tenants_source, default_vc=default_vc)
    memory, problems = TenantMemory.recalled(objects, accepted_virtualclusters, accepted_tenants_text)
    warnings.extend(problems)
    choice = choose_tenants(hardware, inputs, memory)
    tenants, source = choice.tenants, TenantSource(choice.kind, choice.summary)
    warnings.extend(choice.warnings)
    vcs = {vc.name: VcReport(vc.name, vc.guaranteed_gpus) for vc in (tenants.vcs if tenants else ())}
    rows: list[PodReport] = []
    pending: list[PendingReport] = []
    forfeits: list[tuple[Mapping[str, Any], AllocationRecord, str]] = []
    for pod in sorted(pod_objs, key=pods.key):
        name, node_name = pods.key(pod), pods.node_of(pod)
        scheduler_name = str((pod.get("spec") or {}).get("schedulerName") or "default-scheduler")
        if not node_name:
            if not pods.is_done(pod) and (scheduler is None or scheduler_name == scheduler):
                pending.append(PendingReport(name, scheduler_name, _ask(pod), _waiting_reason(pod)))
            continue
        if not pods.holds(pod):  # ended; a terminating pod holds its GPUs until it is gone, as the scheduler counts
            continue
        record, error, forfeit = _believed(pod, default_vc)
        if forfeit and record is not None:  # counted after every record believed as it is, as the scheduler does
            forfeits.append((pod, record, scheduler_name))
            continue
        if record is None:
            _count_other(pod, name, node_name, scheduler_name, error, nodes.get(node_name), rows, vcs)
            continue
        _count_record(name, node_name, record, scheduler_name, tenants, nodes, rows, vcs, warnings)
    for pod, record, scheduler_name in forfeits:
        name, node_name = pods.key(pod), pods.node_of(pod)
        if _taken(record, nodes.get(node_name)):  # the scheduler cannot hold it so: another's pod, as it holds it
            _count_other(pod, name, node_name, scheduler_name, f"allocation record {record.allocation_id} names GPUs "
                         "another pod's record holds", nodes.get(node_name), rows, vcs)
            continue
        _count_record(name, node_name, record, scheduler_name, tenants, nodes, rows, vcs, warnings)
    return InspectReport(list(nodes.values()), rows, pending, list(vcs.values()), warnings, source)


def _believed(pod: Mapping[str, Any], default_vc: str) -> tuple[AllocationRecord | None, str, bool]:
    """The pod's record as the scheduler would count it (``kube.trust``), else None and why not (empty for a pod
    without a record); and whether it is forfeited (a bound pod whose owner edited its gang, VC, isolation or class
    counts as opportunistic work alone, ``forfeited``). Called for bound pods only."""
    try:
        record = pods.record_of(pod)
    except RecordError as error:
        return None, str(error), False
    if record is None:
        return None, "", False
    try:
        demand = pod_demand(pod)
    except DemandError as error:
        return None, f"allocation record {record.allocation_id} cannot be checked: {error}", False
    problem = placement_disagreement(pod, record, demand)
    if problem is not None:
        return None, f"allocation record {record.allocation_id} {problem}", False
    if standing_disagreement(pod, record, demand, default_vc=default_vc) is not None:
        return forfeited(record, pod), "", True
    return record, "", False


def _taken(record: AllocationRecord, node: NodeReport | None) -> bool:
    """Whether a GPU ``record`` names is already counted past what it can take beside the record's share."""
    by_index = {gpu.index: gpu for gpu in node.gpus} if node is not None else {}
    for grant in record.gpus:
        gpu = by_index.get(grant.index)
        if gpu is not None and gpu.milli_allocated + grant.milli > MILLI_PER_GPU:
            return True
    return False


def _count_record(name: str, node_name: str, record: AllocationRecord, scheduler_name: str, tenants: Tenants | None,
                  nodes: Mapping[str, NodeReport], rows: list[PodReport], vcs: dict[str, VcReport],
                  warnings: list[str]) -> None:
    """A pod counted as its record says: its row, its GPUs' use, its VC's."""
    node = nodes.get(node_name)
    job_class = record.job_class if tenants is None or tenants.get(record.vc) is not None else "opportunistic"
    rows.append(PodReport(name, node_name, tuple(g.index for g in record.gpus), record.gpu_milli,
                          record.gpu_memory_mib, record.isolation, record.vc, job_class, scheduler_name))
    by_index = {gpu.index: gpu for gpu in node.gpus} if node is not None else {}
    for grant in record.gpus:
        gpu = by_index.get(grant.index)
        if gpu is None:
            warnings.append(f"pod {name}: its record holds GPU {grant.index} of node {node_name}, "
                            "which the node does not report")
            continue
        gpu.milli_allocated += grant.milli
        gpu.memory_allocated_mib += grant.memory_mib
        gpu.pods.append(name)
    if record.gpus:
        vc = vcs.setdefault(record.vc, VcReport(record.vc))
        vc.in_use_milli[job_class] += sum(grant.milli for grant in record.gpus)
        vc.pods += 1


def _count_other(pod: Mapping[str, Any], name: str, node_name: str, scheduler_name: str, error: str,
                 node: NodeReport | None, rows: list[PodReport], vcs: dict[str, VcReport]) -> None:
    """A bound pod without a record kubecell believes holds its GPUs as whole GPUs of ``other``, as the scheduler
    holds another scheduler's pod: never shown free while the scheduler counts them."""
    held = foreign_hold(pod, name).gpu_count
    if not held and not error:
        return
    rows.append(PodReport(name, node_name, milli=MILLI_PER_GPU if held else 0, isolation=OTHER, vc=OTHER,
                          job_class=OTHER, scheduler=scheduler_name, error=error))
    if not held:
        return
    if node is not None:
        node.other_gpus += held
    vc = vcs.setdefault(OTHER, VcReport(OTHER))
    vc.in_use_milli[OTHER] = vc.in_use_milli.get(OTHER, 0) + held * MILLI_PER_GPU
    vc.pods += 1
