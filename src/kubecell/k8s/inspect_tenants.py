"""The tenants ``kubecell inspect`` shows: the ones the scheduler runs, decided from the API objects alone.

The scheduler's order (``kubecell.k8s.scheduler.tenants``): the VirtualCluster objects when any exist, else the
tenant ConfigMap, else the whole-cluster default. What inspect cannot see is the scheduler's memory, so it
reads what the scheduler keeps in the API instead: which objects it accepted as they are (their ``Accepted``
condition at their current generation), and the cluster the tenants in force were accepted on (the ConfigMap
``kubecell-accepted-cluster``). Tenants that no longer fit today's nodes are shown as the scheduler keeps
them: on today's nodes plus ghosts of the nodes lost since, with a warning that their cells are doomed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from kubecell.core.errors import InvalidInputError
from kubecell.core.model import Node
from kubecell.core.tenancy.config import Tenants, resolve_tenants
from kubecell.core.topology import CellForest
from kubecell.inputs.tenants import parse_tenants
from kubecell.inputs.yaml_document import YamlDocument
from kubecell.k8s import virtualclusters
from kubecell.k8s.scheduler.accepted import ghosts
from kubecell.k8s.scheduler.cluster import whole_cluster_tenants


@dataclass(frozen=True)
class TenantSource:
    """Where the VCs and guarantees of the report come from, as the scheduler decides it."""

    kind: Literal["virtualclusters", "configmap", "default", "none"]
    summary: str
    """One line for people: ``3 VirtualClusters (accepted)``, ``ConfigMap kubecell-system/kubecell-tenants``,
    ``whole-cluster default (VC default owns every GPU)``."""


@dataclass(frozen=True)
class TenantInputs:
    """What the report reads to decide the tenants (the objects as listed; any may be absent)."""

    configmap: Mapping[str, Any] | None
    virtualcluster_objs: Sequence[Mapping[str, Any]] | None
    accepted_nodes: Sequence[Node] | None
    key: str
    source: str
    configmap_name: str
    default_vc: str


class _Lost:
    """The cluster as the tenants in force were accepted on (today's nodes and ghosts of the lost ones), made
    once when first asked; None when nothing was lost."""

    def __init__(self, nodes: Sequence[Node], accepted: Sequence[Node] | None) -> None:
        self.nodes, self.accepted = list(nodes), list(accepted or ())
        self._made = False
        self._found: tuple[CellForest, list[str]] | None = None

    def __call__(self) -> tuple[CellForest, list[str]] | None:
        if not self._made:
            self._made = True
            missing = ghosts(self.accepted, self.nodes)
            if missing:
                try:
                    self._found = CellForest([*self.nodes, *missing]), [node.name for node in missing]
                except InvalidInputError:
                    self._found = None
        return self._found


def _lost_note(names: list[str]) -> str:
    shown = ", ".join(names[:5]) + (" ..." if len(names) > 5 else "")
    return (f"the cluster has lost {len(names)} node(s) the tenants were accepted on ({shown}); the scheduler "
            "keeps the tenants in force and their cells are doomed until the nodes return")


def _from_virtualclusters(objects: Sequence[Mapping[str, Any]], forest: CellForest, lost: _Lost,
                          warnings: list[str]) -> tuple[Tenants, TenantSource] | None:
    """The tenants the scheduler runs from the VirtualCluster objects, or None when it falls back (as
    ``VirtualClusterSource.tenants``): the set judged as the scheduler judges it; a set accepted as it is that
    no longer fits is judged on the cluster as accepted; a refused set shows its still-accepted part."""
    items = sorted(objects, key=virtualclusters.name_of)
    kept = [obj for obj in items if virtualclusters.accepted_as_is(obj)]
    in_force = {virtualclusters.name_of(obj): virtualclusters.canonical_spec(obj) for obj in kept}
    resolution = virtualclusters.resolve(items, forest, in_force)
    label = f"{len(items)} VirtualCluster{'s' if len(items) > 1 else ''}"
    if resolution.tenants is not None:
        return resolution.tenants, TenantSource("virtualclusters", f"{label} (accepted)")
    previous = lost() if len(kept) == len(items) else None
    if previous is not None:
        judged = virtualclusters.resolve(items, previous[0], in_force)
        if judged.tenants is not None:
            warnings.append(_lost_note(previous[1]))
            return judged.tenants, TenantSource("virtualclusters", f"{label} (accepted; lost nodes doomed)")
    refused = "; ".join(f"{v.name}: {v.message}" for v in resolution.verdicts
                        if not v.accepted and v.reason != virtualclusters.REASON_NOT_APPLIED)
    if kept:
        document = virtualclusters.tenant_document(kept)
        found = lost()
        for on, note in ((forest, None), *(((found[0], _lost_note(found[1])),) if found is not None else ())):
            try:
                tenants = resolve_tenants(document, on, locate=virtualclusters.locate)
            except InvalidInputError as error:
                failure = error
                continue
            others = sorted({virtualclusters.name_of(obj) for obj in items} - set(in_force))
            warnings.append(f"VirtualClusters refused, the scheduler keeps the set it last accepted: {refused}. "
                            f"Shown: {', '.join(sorted(in_force))} (Accepted); {', '.join(others)} not in force "
                            "as written (an earlier accepted spec of theirs, which only the scheduler knows, may be)")
            if note:
                warnings.append(note)
            return tenants, TenantSource("virtualclusters", f"{len(kept)} of {len(items)} VirtualClusters "
                                                            "(set refused; the accepted ones stay in force)")
        warnings.append(f"VirtualClusters refused ({refused}), and the accepted ones no longer fit the cluster "
                        f"({failure}); shown: what a scheduler started now would run")
        return None
    warnings.append(f"VirtualClusters refused: {refused}. None is accepted, so the scheduler runs the ConfigMap "
                    "or the whole-cluster default, shown here (one that accepted a set earlier keeps that set)")
    return None


def tenants_in_force(nodes: Sequence[Node], inputs: TenantInputs,
                     warnings: list[str]) -> tuple[Tenants | None, TenantSource]:
    """The tenants the scheduler runs, in its order: VirtualCluster objects, the ConfigMap, the whole-cluster
    default; and which of them is in force. ``nodes``: every node with readable hardware (closed ones too: a
    cordoned node keeps its cells, as in the scheduler's engine)."""
    if not nodes:
        return None, TenantSource("none", "no node kubecell can read, no tenants")
    try:
        forest = CellForest(nodes)
    except InvalidInputError as error:  # nodes whose names and rack labels collide: the scheduler cannot start
        warnings.append(f"the nodes' topology cannot be built, so no tenant is shown: {error}")
        return None, TenantSource("none", "no tenants (the nodes' topology cannot be built)")
    if not forest.roots:  # no node has a GPU (CPU-only, or every inventory empty or cut to none)
        return None, TenantSource("none", "no GPU on any node, no tenants")
    lost = _Lost(nodes, inputs.accepted_nodes)
    if inputs.virtualcluster_objs:
        found = _from_virtualclusters(inputs.virtualcluster_objs, forest, lost, warnings)
        if found is not None:
            return found
    text = ((inputs.configmap or {}).get("data") or {}).get(inputs.key)
    name = inputs.configmap_name
    if text:
        def parse(on: CellForest) -> Tenants:
            return parse_tenants(YamlDocument(Path(inputs.source), text), on)

        try:
            return parse(forest), TenantSource("configmap", f"ConfigMap {name}")
        except InvalidInputError as error:
            refused = error
        previous = lost()
        if previous is not None:
            try:
                tenants = parse(previous[0])
                warnings.append(_lost_note(previous[1]))
                return tenants, TenantSource("configmap", f"ConfigMap {name} (lost nodes doomed)")
            except InvalidInputError:
                pass
        warnings.append(f"tenant configuration rejected: {refused}. The scheduler keeps the tenants it last "
                        "accepted from the ConfigMap, which inspect cannot see (the whole-cluster default if "
                        "it accepted none since it started); shown: the whole-cluster default")
        return (whole_cluster_tenants(forest, inputs.default_vc),
                TenantSource("default", f"whole-cluster default (ConfigMap {name} refused)"))
    return (whole_cluster_tenants(forest, inputs.default_vc),
            TenantSource("default", f"whole-cluster default (VC {inputs.default_vc} owns every GPU)"))
