"""Which tenants are in force: the one rule the scheduler runs and ``kubecell inspect`` shows.

The order: the VirtualCluster objects when any exist, else the tenant ConfigMap, else the whole-cluster default
(one VC owns every GPU). A refused set of VirtualClusters never replaces the set in force, nor does an invalid
edit of the ConfigMap replace its tenants last accepted: one bad edit never takes every tenant's guarantee.

Guarantees are judged against the cluster, and the cluster changes too. Tenants that did not change since they
were accepted but no longer fit today's nodes are judged on the cluster as it was accepted: today's nodes plus
ghosts of the nodes lost since (``accepted``), which the engine holds as failed nodes, so the cells they held
are doomed (HiveD's bad-hardware rule) instead of every tenant losing its guarantee. Changed tenants must fit the
real cluster.

What the rule needs beyond today's objects is ``TenantMemory``: the VirtualCluster set in force (each as accepted)
and the ConfigMap text last accepted. The scheduler keeps one across rebuilds, and both in the API too
(``accepted``), so that a restart recalls them (``TenantMemory.recalled``): the older spec of a VC whose edit was
refused, and the ConfigMap text last accepted, which a refused edit of the ConfigMap leaves in force; ``inspect``,
and a scheduler without a snapshot it can read, rebuild the part the objects hold (the objects accepted as they
are: their ``Accepted`` condition at their current generation; no earlier ConfigMap text). The rule itself
writes nothing: it returns the verdicts and warnings, which the scheduler writes and inspect shows.

Deleting a VirtualCluster is the operator's decision and applies at once, also while a refused edit keeps the
older set in force (guarantees taken away free cells, so what is left still fits), and whatever a snapshot says:
a VC in force is an object that exists, with the uid it was accepted with.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kubecell.core.errors import InvalidInputError
from kubecell.core.model import Node
from kubecell.core.tenancy.config import Tenants, VirtualCluster, resolve_tenants
from kubecell.core.topology import CellForest
from kubecell.inputs.tenants import parse_tenants
from kubecell.inputs.yaml_document import YamlDocument
from kubecell.kube import virtualclusters as vcs
from kubecell.kube.accepted import AcceptedVc, ghosts

SourceKind = Literal["virtualclusters", "configmap", "default", "none"]


@dataclass
class TenantMemory:
    """What decides the tenants beyond today's objects."""

    vcs_in_force: dict[str, AcceptedVc] = field(default_factory=dict)
    """Name -> the VirtualCluster of the set in force, as accepted (empty: the ConfigMap or the default is)."""
    configmap_text: str | None = None
    """The ConfigMap's text last accepted (None: none, or not known, as for inspect or after a restart without a
    snapshot of it)."""

    @property
    def vc_specs(self) -> dict[str, str]:
        """Name -> canonical spec of the set in force (``virtualclusters.resolve``'s ``in_force``)."""
        return {name: vcs.canonical_spec(vc.as_object()) for name, vc in self.vcs_in_force.items()}

    @property
    def vc_document(self) -> dict[str, Any] | None:
        """The tenants document of that set, to keep it in force when a changed set is refused."""
        return vcs.tenant_document([vc.as_object() for vc in self.vcs_in_force.values()]) if self.vcs_in_force \
            else None

    def adopt(self, objects: Sequence[Mapping[str, Any]]) -> None:
        self.vcs_in_force = {vcs.name_of(obj): AcceptedVc.of(obj) for obj in objects}

    def forget_deleted(self, objects: Sequence[Mapping[str, Any]]) -> None:
        """Drop the VCs in force whose object is gone (or was deleted and created again: another uid)."""
        live = {vcs.name_of(obj): obj for obj in objects}
        self.vcs_in_force = {name: vc for name, vc in self.vcs_in_force.items()
                             if name in live and vc.applies_to(live[name])}

    @classmethod
    def from_objects(cls, objects: Sequence[Mapping[str, Any]]) -> TenantMemory:
        """What the objects say was accepted: those whose ``Accepted`` condition holds at their generation (a spec
        no VirtualCluster could hold was never accepted, whatever its status says)."""
        kept = [obj for obj in objects if vcs.accepted_as_is(obj) and vcs.spec_problem(obj) is None]
        return cls({vcs.name_of(obj): AcceptedVc.of(obj) for obj in kept})

    @classmethod
    def recalled(cls, objects: Sequence[Mapping[str, Any]], snapshot: Sequence[AcceptedVc] | None,
                 configmap_text: str | None = None) -> tuple[TenantMemory, tuple[str, ...]]:
        """What a restarted scheduler (or a new leader) takes as the set in force, and what it found wrong.

        The snapshot the leader kept (``accepted``) when it has one: the specs as accepted, the older spec of a VC
        whose edit was refused included. An entry applies only to the object it was taken from (same uid): a VC
        deleted since stays deleted. At the object's own generation the object's spec is the one accepted (the API
        server moves the generation at every change of the spec; a snapshot that differs then holds a default the
        CRD added since); an entry beyond the object's generation was never the object's, and is not recalled. The
        objects' conditions are not consulted: whoever may write ``virtualclusters/status`` can write them.
        Without a snapshot (none yet, or refused): the objects accepted as they are (``from_objects``), as before
        there was one.

        ``configmap_text``: the ConfigMap text the leader recorded as in force (None: none, or no snapshot of it).
        It is only remembered: the ConfigMap's current text comes first, and the recalled one is put in force only
        when that is refused, judged against the cluster like any other (``choose_tenants``)."""
        if snapshot is None:
            memory = cls.from_objects(objects)
            memory.configmap_text = configmap_text or None
            return memory, ()
        live = {vcs.name_of(obj): obj for obj in objects}
        kept: dict[str, AcceptedVc] = {}
        problems = []
        for vc in snapshot:
            obj = live.get(vc.name)
            if obj is None or not vc.applies_to(obj):
                continue
            generation = vcs.generation_of(obj)
            if vc.generation > generation:
                problems.append(f"the snapshot of VirtualClusters in force has {vc.name} at generation "
                                f"{vc.generation}, beyond the object's ({generation}): not recalled")
                continue
            kept[vc.name] = AcceptedVc.of(obj) if vc.generation == generation else vc
        return cls(kept, configmap_text or None), tuple(problems)


@dataclass(frozen=True)
class TenantChoice:
    """The tenants in force, the forest they were judged on (with ghosts, if any), and what to tell."""

    tenants: Tenants | None
    forest: CellForest | None
    kind: SourceKind
    summary: str
    """One line for people: ``3 VirtualClusters (accepted)``, ``ConfigMap kubecell-system/kubecell-tenants``."""
    ghosts: tuple[Node, ...] = ()
    verdicts: tuple[vcs.Verdict, ...] = ()
    """The ``Accepted`` condition of each VirtualCluster (the scheduler writes them)."""
    warnings: tuple[str, ...] = ()
    configmap_refused: str | None = None
    """Why the ConfigMap's text was refused and what is in force instead (a Warning Event on it)."""


@dataclass(frozen=True)
class TenantInputs:
    """Today's objects: the VirtualClusters (empty: none, or no CRD), the ConfigMap's tenants text, the cluster
    the tenants were accepted on (``accepted``), and how messages name the ConfigMap."""

    objects: Sequence[Mapping[str, Any]]
    configmap_text: str | None
    accepted_nodes: Callable[[], Sequence[Node]]
    """The cluster the tenants in force were accepted on, read only when today's nodes do not fit them."""
    configmap_name: str = "kubecell-system/kubecell-tenants"
    source: str = "configmap kubecell-system/kubecell-tenants key tenants.yaml"
    default_vc: str = "default"


def whole_cluster_tenants(forest: CellForest, vc: str) -> Tenants:
    """Without a tenant configuration, one VC owns every cell (pinned): kubecell then schedules as a
    single-tenant scheduler whose placements are exactly the placement policy's, as in ``sim packing``
    (fair sharing and reclaim need the operator's guarantees). Without any GPU, it guarantees nothing and
    still runs CPU-only work."""
    if not forest.roots:
        return Tenants((VirtualCluster(vc, 0, {}, (), 1.0, None, 0.0, 0),))
    return resolve_tenants({"virtualClusters": {vc: {"pinnedCells": [cell.id for cell in forest.roots]}}}, forest,
                           source="default tenants")


class _Lost:
    """The cluster as accepted (today's nodes and ghosts of the lost ones), made once when first asked."""

    def __init__(self, nodes: Sequence[Node], accepted: Callable[[], Sequence[Node]]) -> None:
        self.nodes, self.accepted = list(nodes), accepted
        self._made = False
        self.forest: CellForest | None = None
        self.ghosts: tuple[Node, ...] = ()

    def __call__(self) -> CellForest | None:
        if not self._made:
            self._made = True
            missing = ghosts(self.accepted(), self.nodes)
            if missing:
                try:
                    self.forest, self.ghosts = CellForest([*self.nodes, *missing]), tuple(missing)
                except InvalidInputError:
                    self.forest = None
        return self.forest

    def note(self) -> str:
        names = [node.name for node in self.ghosts]
        shown = ", ".join(names[:5]) + (" ..." if len(names) > 5 else "")
        return (f"the cluster has lost {len(names)} node(s) the tenants were accepted on ({shown}): their cells are "
                "doomed until they return or the guarantees change")


def choose_tenants(nodes: Sequence[Node], inputs: TenantInputs, memory: TenantMemory) -> TenantChoice:
    """The tenants in force for the nodes kubecell can read (closed ones included: a cordoned node keeps its
    cells), updating ``memory`` as the scheduler must remember it."""
    if not nodes:
        return TenantChoice(None, None, "none", "no node kubecell can read, no tenants")
    try:
        forest = CellForest(nodes)
    except InvalidInputError as error:  # nodes whose names and rack labels collide
        return TenantChoice(None, None, "none", "no tenants (the nodes' topology cannot be built)",
                            warnings=(f"the nodes' topology cannot be built, so no tenant is in force: {error}",))
    lost = _Lost(nodes, inputs.accepted_nodes)
    if inputs.objects:
        found = _from_virtualclusters(list(inputs.objects), forest, lost, memory)
        if found.tenants is not None:
            return found
        memory_verdicts, memory_warnings = found.verdicts, found.warnings
    else:
        memory.vcs_in_force = {}
        memory_verdicts, memory_warnings = (), ()
    text = inputs.configmap_text
    if not text:
        memory.configmap_text = None  # no configuration (deleted or emptied): the default, on purpose
        return TenantChoice(whole_cluster_tenants(forest, inputs.default_vc), forest, "default",
                            f"whole-cluster default (VC {inputs.default_vc} owns every GPU)",
                            verdicts=memory_verdicts, warnings=memory_warnings)
    choice = _from_configmap(text, forest, lost, inputs, memory)
    return dataclasses.replace(choice, verdicts=memory_verdicts, warnings=(*memory_warnings, *choice.warnings))


def _kept(tenants: Tenants, forest: CellForest, lost: _Lost, on_ghosts: bool, kind: SourceKind, summary: str,
          verdicts: tuple[vcs.Verdict, ...] = (), warnings: tuple[str, ...] = (),
          refused: str | None = None) -> TenantChoice:
    if on_ghosts and lost.forest is not None:
        doomed = f"{summary[:-1]}; lost nodes doomed)" if summary.endswith(")") else f"{summary} (lost nodes doomed)"
        return TenantChoice(tenants, lost.forest, kind, doomed, lost.ghosts, verdicts, (*warnings, lost.note()),
                            refused)
    return TenantChoice(tenants, forest, kind, summary, (), verdicts, warnings, refused)


def _from_virtualclusters(items: list[Mapping[str, Any]], forest: CellForest, lost: _Lost,
                          memory: TenantMemory) -> TenantChoice:
    """The VirtualCluster set judged together; an unchanged set that no longer fits, on the cluster as accepted;
    a refused set keeps the set in force. ``tenants`` None: the ConfigMap or the default decides."""
    items = sorted(items, key=vcs.name_of)
    label = f"{len(items)} VirtualCluster{'s' if len(items) > 1 else ''}"
    memory.forget_deleted(items)  # a deletion applies at once, even while a refused edit keeps the set in force
    in_force = memory.vc_specs
    resolution = vcs.resolve(items, forest, in_force)
    unchanged = {vcs.name_of(obj): vcs.canonical_spec(obj) for obj in items} == in_force if in_force \
        else all(vcs.accepted_as_is(obj) for obj in items)
    on_ghosts = False
    if resolution.tenants is None and unchanged and lost() is not None:
        judged = vcs.resolve(items, lost.forest, in_force)  # type: ignore[arg-type]
        if judged.tenants is not None:
            note = "; " + lost.note()
            resolution = vcs.Resolution(judged.tenants, tuple(dataclasses.replace(v, message=v.message + note)
                                                              for v in judged.verdicts))
            on_ghosts = True
    if resolution.tenants is not None:
        memory.adopt(items)
        return _kept(resolution.tenants, forest, lost, on_ghosts, "virtualclusters", f"{label} (accepted)",
                     resolution.verdicts)
    refused = "; ".join(f"{v.name}: {v.message}" for v in resolution.verdicts
                        if not v.accepted and v.reason != vcs.REASON_NOT_APPLIED)
    document = memory.vc_document
    if document is not None:
        failure: InvalidInputError | None = None
        for on, ghostly in ((forest, False), (lost(), True)):
            if on is None:
                continue
            try:
                tenants = resolve_tenants(document, on, locate=vcs.locate)
            except InvalidInputError as error:  # the cluster itself changed under the accepted set
                failure = error
                continue
            written = {vcs.name_of(obj): vcs.canonical_spec(obj) for obj in items}
            kept = [name if written[name] == spec else f"{name} (as accepted at generation "
                    f"{memory.vcs_in_force[name].generation})" for name, spec in sorted(in_force.items())]
            others = sorted(set(written) - set(in_force))
            warning = (f"VirtualClusters refused, the set last accepted stays in force: {refused}. In force: "
                       f"{', '.join(kept)}" + (f"; {', '.join(others)} not in force as written" if others else ""))
            return _kept(tenants, forest, lost, ghostly, "virtualclusters",
                         f"{len(kept)} of {len(items)} VirtualClusters (set refused; the accepted ones stay in force)",
                         resolution.verdicts, (warning,))
        memory.vcs_in_force = {}
        return TenantChoice(None, None, "none", "", verdicts=resolution.verdicts,
                            warnings=(f"VirtualClusters refused ({refused}), and the set in force no longer fits the "
                                      f"cluster ({failure}); the ConfigMap or the whole-cluster default is in force",))
    return TenantChoice(None, None, "none", "", verdicts=resolution.verdicts,
                        warnings=(f"VirtualClusters refused: {refused}. None was accepted, so the ConfigMap or the "
                                  "whole-cluster default is in force",))


def _from_configmap(text: str, forest: CellForest, lost: _Lost, inputs: TenantInputs,
                    memory: TenantMemory) -> TenantChoice:
    name = inputs.configmap_name

    def parse(body: str, on: CellForest) -> Tenants:
        return parse_tenants(YamlDocument(Path(inputs.source), body), on)

    try:
        tenants = parse(text, forest)
        memory.configmap_text = text
        return _kept(tenants, forest, lost, False, "configmap", f"ConfigMap {name}")
    except InvalidInputError as error:
        refused = error
    # without a text last accepted (none yet, or a restart without a snapshot of it) the text may be the one accepted
    unchanged = memory.configmap_text is None or text == memory.configmap_text
    if unchanged and lost() is not None:
        try:
            tenants = parse(text, lost.forest)  # type: ignore[arg-type]
            memory.configmap_text = text
            return _kept(tenants, forest, lost, True, "configmap", f"ConfigMap {name}")
        except InvalidInputError:
            pass
    kept = memory.configmap_text
    if kept is not None and kept != text:
        for on, ghostly in ((forest, False), (lost(), True)):
            if on is None:
                continue
            try:
                tenants = parse(kept, on)
            except InvalidInputError:
                continue
            outcome = "the tenants last accepted from it stay in force"
            return _kept(tenants, forest, lost, ghostly, "configmap", f"ConfigMap {name} (edit refused; the tenants "
                         "last accepted stay in force)", warnings=(f"tenant configuration rejected: {refused} "
                                                                   f"({outcome})",), refused=f"{refused} ({outcome})")
    memory.configmap_text = None
    outcome = ("the tenants last accepted no longer fit the cluster; using the whole-cluster default" if kept
               else "none was accepted before; using the whole-cluster default (a scheduler that accepted it before "
                    "it restarted would keep those tenants)")
    return TenantChoice(whole_cluster_tenants(forest, inputs.default_vc), forest, "default",
                        f"whole-cluster default (ConfigMap {name} refused)",
                        warnings=(f"tenant configuration rejected: {refused} ({outcome})",),
                        configmap_refused=f"{refused} ({outcome})")
