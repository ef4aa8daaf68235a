"""What the cluster holds, as kubecell sees it: the report behind ``kubecell inspect``.

Built from plain API objects (Node and Pod dicts as the API server returns them, the VirtualCluster objects
and the tenant ConfigMap) with no API calls, so every number the command prints is unit-testable. The books
are the pods' allocation records (``kubecell.io/allocation``): per GPU, the milli-GPU and MiB held and by
whom; pods another scheduler bound hold their GPUs as whole GPUs (``other``), exactly as kubecell's
scheduler accounts them. A record that cannot be trusted is listed with its error, never guessed; ended pods
(Succeeded, Failed, being deleted) hold nothing. Per virtual cluster, the GPUs in use by class (guaranteed,
borrowed, opportunistic) beside its guarantee, from the tenant configuration the scheduler reads, in its
order: the VirtualCluster objects when any exist (judged by the scheduler's own ``virtualclusters.resolve``),
else the ConfigMap, else the whole-cluster default; the report names the source in force (``TenantSource``).

What inspect cannot see is the scheduler's memory: a refused VirtualCluster set or an invalid ConfigMap
leaves the scheduler on the configuration it last accepted. For a refused VirtualCluster set, the objects
whose ``Accepted`` condition is True at their current generation are that set's unchanged part and are
shown; for an invalid ConfigMap (or a refused set none of whose objects is still accepted), the report shows
what a scheduler started now would run, and says so in a warning.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kubecell.core.errors import InvalidInputError
from kubecell.core.model import MILLI_PER_GPU
from kubecell.core.tenancy.config import Tenants, resolve_tenants
from kubecell.core.topology import CellForest
from kubecell.inputs.tenants import parse_tenants
from kubecell.inputs.yaml_document import YamlDocument
from kubecell.k8s import virtualclusters
from kubecell.k8s.dialects import DemandError, pod_demand
from kubecell.k8s.inventory import NodeView, node_view
from kubecell.k8s.records import RecordError
from kubecell.k8s.scheduler import pods
from kubecell.k8s.scheduler.cluster import whole_cluster_tenants
from kubecell.k8s.scheduler.intake import foreign_hold

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
    """Where the VCs and guarantees of the report come from, as the scheduler decides it."""

    kind: Literal["virtualclusters", "configmap", "default", "none"]
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
    tenants: TenantSource = TenantSource("none", "no schedulable node")

    def to_data(self) -> dict[str, Any]:
        """Plain data with stable camelCase keys (``-o json|yaml``)."""
        return {
            "nodes": [{
                "name": n.name, "models": n.models, "excluded": n.excluded,
                "milliTotal": n.milli_total, "milliAllocated": n.milli_allocated,
                "memoryTotalMiB": n.memory_total_mib, "memoryAllocatedMiB": n.memory_allocated_mib,
                "otherSchedulerGpus": n.other_gpus,
                "gpus": [{"index": g.index, "uuid": g.uuid, "model": g.model, "healthy": g.healthy,
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


def _in_force(obj: Mapping[str, Any]) -> bool:
    """Whether the scheduler said the object is in force as written (``Accepted=True`` at its generation)."""
    found = virtualclusters.current_condition(obj)
    generation = virtualclusters.generation_of(obj)
    return found is not None and found.get("status") == "True" and found.get("observedGeneration") == generation


def _from_virtualclusters(objects: Sequence[Mapping[str, Any]], forest: CellForest,
                          warnings: list[str]) -> tuple[Tenants, TenantSource] | None:
    """The tenants the scheduler runs from the VirtualCluster objects, or None when it falls back (as
    ``VirtualClusterSource.tenants``): the set judged as the scheduler judges it; a refused set shows its
    still-accepted part, the scheduler's last accepted set minus what changed since."""
    items = sorted(objects, key=virtualclusters.name_of)
    kept = [obj for obj in items if _in_force(obj)]
    in_force = {virtualclusters.name_of(obj): virtualclusters.canonical_spec(obj) for obj in kept}
    resolution = virtualclusters.resolve(items, forest, in_force)
    if resolution.tenants is not None:
        return resolution.tenants, TenantSource("virtualclusters", f"{len(items)} VirtualCluster"
                                                                   f"{'s' if len(items) > 1 else ''} (accepted)")
    refused = "; ".join(f"{v.name}: {v.message}" for v in resolution.verdicts
                        if not v.accepted and v.reason != virtualclusters.REASON_NOT_APPLIED)
    if kept:
        try:
            tenants = resolve_tenants(virtualclusters.tenant_document(kept), forest, locate=virtualclusters.locate)
        except InvalidInputError as error:
            warnings.append(f"VirtualClusters refused ({refused}), and the accepted ones no longer fit the cluster "
                            f"({error}); shown: what a scheduler started now would run")
            return None
        others = sorted({virtualclusters.name_of(obj) for obj in items} - set(in_force))
        warnings.append(f"VirtualClusters refused, the scheduler keeps the set it last accepted: {refused}. Shown: "
                        f"{', '.join(sorted(in_force))} (Accepted); {', '.join(others)} not in force as written "
                        "(an earlier accepted spec of theirs, which only the scheduler knows, may be)")
        return tenants, TenantSource("virtualclusters", f"{len(kept)} of {len(items)} VirtualClusters "
                                                        "(set refused; the accepted ones stay in force)")
    warnings.append(f"VirtualClusters refused: {refused}. None is accepted, so the scheduler runs the ConfigMap "
                    "or the whole-cluster default, shown here (one that accepted a set earlier keeps that set)")
    return None


def _tenants(nodes: Sequence[NodeView], configmap: Mapping[str, Any] | None,
             virtualcluster_objs: Sequence[Mapping[str, Any]] | None, *, key: str, source: str, configmap_name: str,
             default_vc: str, warnings: list[str]) -> tuple[Tenants | None, TenantSource]:
    """The tenants the scheduler runs, in its order (``Scheduler._tenants``): VirtualCluster objects, the
    ConfigMap, the whole-cluster default; and which of them is in force."""
    core = [view.node for view in nodes if view.node is not None and not view.excluded]
    if not core:
        return None, TenantSource("none", "no schedulable node, no tenants")
    try:
        forest = CellForest(core)
    except InvalidInputError as error:  # nodes whose names and rack labels collide: the scheduler cannot start
        warnings.append(f"the nodes' topology cannot be built, so no tenant is shown: {error}")
        return None, TenantSource("none", "no tenants (the nodes' topology cannot be built)")
    if not forest.roots:  # no schedulable node has a GPU (CPU-only, or every inventory empty or cut to none)
        return None, TenantSource("none", "no GPU on a schedulable node, no tenants")
    if virtualcluster_objs:
        found = _from_virtualclusters(virtualcluster_objs, forest, warnings)
        if found is not None:
            return found
    text = ((configmap or {}).get("data") or {}).get(key)
    if text:
        try:
            return (parse_tenants(YamlDocument(Path(source), text), forest),
                    TenantSource("configmap", f"ConfigMap {configmap_name}"))
        except InvalidInputError as error:
            warnings.append(f"tenant configuration rejected: {error}. The scheduler keeps the tenants it last "
                            "accepted from the ConfigMap, which inspect cannot see (the whole-cluster default if "
                            "it accepted none since it started); shown: the whole-cluster default")
            return (whole_cluster_tenants(forest, default_vc),
                    TenantSource("default", f"whole-cluster default (ConfigMap {configmap_name} refused)"))
    return (whole_cluster_tenants(forest, default_vc),
            TenantSource("default", f"whole-cluster default (VC {default_vc} owns every GPU)"))


def build_report(node_objs: Sequence[Mapping[str, Any]], pod_objs: Sequence[Mapping[str, Any]],
                 tenants_configmap: Mapping[str, Any] | None = None, *, scheduler: str | None = "kubecell",
                 virtualcluster_objs: Sequence[Mapping[str, Any]] | None = None, tenants_key: str = "tenants.yaml",
                 tenants_configmap_name: str = "kubecell-system/kubecell-tenants",
                 tenants_source: str = "configmap kubecell-system/kubecell-tenants",
                 default_vc: str = "default") -> InspectReport:
    """The report from listed objects. ``scheduler``: whose pending pods to list (None: every scheduler's);
    ``virtualcluster_objs``: the VirtualCluster objects (None or empty: none, or the CRD is not installed)."""
    warnings: list[str] = []
    nodes: dict[str, NodeReport] = {}
    usable: list[NodeView] = []
    for obj in sorted(node_objs, key=lambda o: str(o["metadata"]["name"])):
        view, excluded = _hardware(obj)
        usable.append(NodeView(view.name, view.node, excluded))
        gpus = [GpuReport(g.index, view.uuids[g.index] if g.index < len(view.uuids) else "", g.model, g.healthy,
                          g.memory_mib) for g in (view.node.gpus if view.node else ())]
        told = excluded or (f"GPUs not placed: {view.gpu_note}" if view.gpu_note else "")
        nodes[view.name] = NodeReport(view.name, gpus, told)
    tenants, source = _tenants(usable, tenants_configmap, virtualcluster_objs, key=tenants_key, source=tenants_source,
                               configmap_name=tenants_configmap_name, default_vc=default_vc, warnings=warnings)
    vcs = {vc.name: VcReport(vc.name, vc.guaranteed_gpus) for vc in (tenants.vcs if tenants else ())}
    rows: list[PodReport] = []
    pending: list[PendingReport] = []
    for pod in sorted(pod_objs, key=pods.key):
        name, node_name = pods.key(pod), pods.node_of(pod)
        scheduler_name = str((pod.get("spec") or {}).get("schedulerName") or "default-scheduler")
        if pods.is_done(pod):
            continue
        if not node_name:
            if scheduler is None or scheduler_name == scheduler:
                pending.append(PendingReport(name, scheduler_name, _ask(pod), _waiting_reason(pod)))
            continue
        node = nodes.get(node_name)
        try:
            record = pods.record_of(pod)
        except RecordError as error:
            rows.append(PodReport(name, node_name, scheduler=scheduler_name, error=str(error)))
            continue
        if record is None:
            held = foreign_hold(pod, name).gpu_count
            if held:
                rows.append(PodReport(name, node_name, milli=MILLI_PER_GPU, isolation=OTHER, vc=OTHER,
                                      job_class=OTHER, scheduler=scheduler_name))
                if node is not None:
                    node.other_gpus += held
                vc = vcs.setdefault(OTHER, VcReport(OTHER))
                vc.in_use_milli[OTHER] = vc.in_use_milli.get(OTHER, 0) + held * MILLI_PER_GPU
                vc.pods += 1
            continue
        rows.append(PodReport(name, node_name, tuple(g.index for g in record.gpus), record.gpu_milli,
                              record.gpu_memory_mib, record.isolation, record.vc, record.job_class, scheduler_name))
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
            vc.in_use_milli[record.job_class] += sum(grant.milli for grant in record.gpus)
            vc.pods += 1
    return InspectReport(list(nodes.values()), rows, pending, list(vcs.values()), warnings, source)
