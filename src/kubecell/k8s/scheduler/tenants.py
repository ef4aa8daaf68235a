"""Which tenants are in force, and what the scheduler remembers between rebuilds to decide it.

The order: the VirtualCluster objects when any exist (a refused set keeps the accepted one in force), else
the tenant ConfigMap (an invalid edit keeps the ConfigMap's tenants last accepted in force, with a Warning
Event on it), else the whole-cluster default (one VC owns every GPU).

Tenants are judged against the cluster; the cluster changes too. Guarantees the operator did not change are
never dropped because nodes left: tenants that fit the cluster as it was when they were accepted (the nodes
of today plus ghosts of the nodes lost since, ``kubecell.k8s.scheduler.accepted``) stay in force, and the
engine holds the ghosts as failed nodes, so the cells they held are doomed (HiveD's bad-hardware rule) rather
than silently promised or taken from everyone. Changed tenants must fit the real cluster.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubecell.core.errors import InvalidInputError
from kubecell.core.model import Node
from kubecell.core.tenancy.config import Tenants
from kubecell.core.topology import CellForest
from kubecell.inputs.tenants import parse_tenants
from kubecell.inputs.yaml_document import YamlDocument
from kubecell.k8s import virtualclusters
from kubecell.k8s.rest import Kube
from kubecell.k8s.scheduler.accepted import AcceptedCluster, ghosts
from kubecell.k8s.scheduler.actions import Actions
from kubecell.k8s.scheduler.cluster import Mirror, whole_cluster_tenants

log = logging.getLogger("kubecell.scheduler")


@dataclass(frozen=True)
class InForce:
    """The tenants a rebuild uses, the forest they were judged on and the ghost nodes it holds (failed)."""

    tenants: Tenants
    forest: CellForest
    ghosts: tuple[Node, ...] = ()
    source: str = "default"


@dataclass
class TenantSources:
    """The scheduler's memory of tenants across rebuilds (the API holds the rest: the objects' conditions and
    the accepted cluster)."""

    kube: Kube
    actions: Actions
    component: str
    namespace: str
    configmap: str
    key: str
    default_vc: str
    tenants_text: str | None = None
    """The ConfigMap's text at the last rebuild (to tell an edit from a node change)."""
    accepted_text: str | None = None
    """The ConfigMap's tenants as last accepted: an invalid edit leaves them in force."""
    virtual_clusters: virtualclusters.VirtualClusterSource = field(init=False)
    accepted: AcceptedCluster = field(init=False)

    def __post_init__(self) -> None:
        self.virtual_clusters = virtualclusters.VirtualClusterSource(self.kube, self.component)
        self.accepted = AcceptedCluster(self.kube, self.namespace)

    def text(self, mirror: Mirror) -> str | None:
        found = ((mirror.tenants or {}).get("data") or {}).get(self.key)
        return str(found) if found is not None else None

    def changed(self, mirror: Mirror) -> bool:
        """Whether the ConfigMap's text or a VirtualCluster's spec changed since the last rebuild."""
        return self.text(mirror) != self.tenants_text or self.virtual_clusters.changed(mirror.virtualclusters.values())

    def in_force(self, mirror: Mirror, nodes: list[Node]) -> InForce:
        forest = CellForest(nodes)
        lost_forest: list[tuple[CellForest, list[Node]] | None] = []

        def lost() -> tuple[CellForest, list[str]] | None:
            """The cluster as accepted: today's nodes and ghosts of the lost ones (None: nothing was lost)."""
            if not lost_forest:
                missing = ghosts(self.accepted.load(), nodes)
                lost_forest.append((CellForest([*nodes, *missing]), missing) if missing else None)
            found = lost_forest[0]
            return (found[0], [node.name for node in found[1]]) if found is not None else None

        text = self.text(mirror)
        reported = text == self.tenants_text and not self.virtual_clusters.in_force
        self.tenants_text = text
        objects = list(mirror.virtualclusters.values())
        from_objects = self.virtual_clusters.tenants(objects, forest, lost=lost)
        if from_objects is not None:
            return self._chosen(from_objects, forest, lost_forest, self.virtual_clusters.on_ghosts, "virtualclusters",
                                nodes)
        if not text:
            self.accepted_text = None  # no configuration (deleted or emptied): the default, on purpose
            return InForce(whole_cluster_tenants(forest, self.default_vc), forest)
        return self._from_configmap(mirror, text, forest, lost, lost_forest, reported, nodes)

    def _chosen(self, tenants: Tenants, forest: CellForest, lost_forest: list[Any], on_ghosts: bool, source: str,
                nodes: list[Node]) -> InForce:
        if on_ghosts and lost_forest and lost_forest[0] is not None:
            ghost_forest, missing = lost_forest[0]
            log.warning("tenants (%s) kept in force on the cluster as accepted: %d node(s) lost since (%s) are held "
                        "as failed, their cells doomed", source, len(missing),
                        ", ".join(node.name for node in missing[:5]))
            return InForce(tenants, ghost_forest, tuple(missing), source)
        self.accepted.record(nodes)  # they fit the cluster as it is: this is now the cluster they were accepted on
        return InForce(tenants, forest, (), source)

    def _from_configmap(self, mirror: Mirror, text: str, forest: CellForest, lost: Any, lost_forest: list[Any],
                        reported: bool, nodes: list[Node]) -> InForce:
        source = f"configmap {self.namespace}/{self.configmap} key {self.key}"

        def parse(body: str, on: CellForest) -> Tenants:
            return parse_tenants(YamlDocument(Path(source), body), on)

        try:
            tenants = parse(text, forest)
            self.accepted_text = text
            return self._chosen(tenants, forest, lost_forest, False, "configmap", nodes)
        except InvalidInputError as error:
            refused = error
        unchanged = self.accepted_text is None or text == self.accepted_text  # a restart knows no earlier text
        previous = lost() if unchanged else None
        if previous is not None:
            try:
                tenants = parse(text, previous[0])
                self.accepted_text = text
                return self._chosen(tenants, forest, lost_forest, True, "configmap", nodes)
            except InvalidInputError:
                pass
        kept = self.accepted_text
        if kept is not None and kept != text:
            for on, ghostly in ((forest, False), *(((found[0], True),) if (found := lost()) is not None else ())):
                try:
                    tenants = parse(kept, on)
                except InvalidInputError:
                    continue
                self._refused(mirror, refused, "the tenants last accepted from it stay in force", reported)
                return self._chosen(tenants, forest, lost_forest, ghostly, "configmap", nodes)
        self.accepted_text = None
        outcome = ("the tenants last accepted no longer fit the cluster; using the whole-cluster default" if kept
                   else "none was accepted before; using the whole-cluster default")
        self._refused(mirror, refused, outcome, reported)
        return InForce(whole_cluster_tenants(forest, self.default_vc), forest)

    def _refused(self, mirror: Mirror, refused: InvalidInputError, outcome: str, reported: bool) -> None:
        log.error("tenant configuration rejected, %s: %s", outcome, refused)
        if not reported and mirror.tenants is not None:
            self.actions.configuration_refused(mirror.tenants, "InvalidTenants", f"{refused} ({outcome})")
