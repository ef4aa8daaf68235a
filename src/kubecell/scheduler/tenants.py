"""The scheduler's side of the tenants in force: its memory across rebuilds, and the writes the rule asks for.

Which tenants are in force is one rule (``kubecell.kube.tenant_source``), shared with ``kubecell inspect``. The
scheduler adds what only it can do: it remembers what it accepted (``TenantMemory``) from one rebuild to the
next, writes each VirtualCluster's ``Accepted`` condition and the Warning Events of a refusal, and records the
cluster the tenants in force fit (``kubecell.kube.accepted``), so that nodes lost later become ghosts whose
cells are doomed rather than costing every tenant its guarantee, also after a restart.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from kubecell.core.model import Node
from kubecell.kube import virtualclusters
from kubecell.kube.accepted import AcceptedCluster
from kubecell.kube.actions import Actions
from kubecell.kube.rest import Kube
from kubecell.kube.tenant_source import TenantChoice, TenantInputs, TenantMemory, choose_tenants
from kubecell.scheduler.cluster import Mirror

log = logging.getLogger("kubecell.scheduler")


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
    memory: TenantMemory = field(default_factory=TenantMemory)
    tenants_text: str | None = None
    """The ConfigMap's text at the last rebuild (to tell an edit from a node change)."""
    recalled: bool = False
    """Whether ``memory`` was taken from the API yet (at the first rebuild; see ``in_force``)."""
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

    def in_force(self, mirror: Mirror, nodes: list[Node]) -> TenantChoice:
        """The tenants to rebuild with (``choose_tenants``), its verdicts written and its refusals told."""
        objects = list(mirror.virtualclusters.values())
        if not self.recalled:
            # A restarted scheduler (or a new leader) starts with no memory: the VirtualClusters accepted as they
            # are (their Accepted condition at their generation) are the set in force, as inspect reads it.
            # Without this, one refused object made the whole set "never accepted": the whole-cluster default
            # took over and every accepted object was rewritten NotApplied.
            self.recalled = True
            self.memory = TenantMemory.from_objects(objects)
        text = self.text(mirror)
        reported = text == self.tenants_text and not self.memory.vc_specs  # a refusal of this text was told
        self.tenants_text = text
        self.virtual_clusters.used = virtualclusters.signature(objects)
        inputs = TenantInputs(objects, text, self.accepted.load, configmap_name=f"{self.namespace}/{self.configmap}",
                              source=f"configmap {self.namespace}/{self.configmap} key {self.key}",
                              default_vc=self.default_vc)
        choice = choose_tenants(nodes, inputs, self.memory)
        if objects:
            self.virtual_clusters.report(objects, choice.verdicts)
        for warning in choice.warnings:
            log.warning("tenants: %s", warning)
        if choice.configmap_refused and not reported and mirror.tenants is not None:
            self.actions.configuration_refused(mirror.tenants, "InvalidTenants", choice.configmap_refused)
        if choice.tenants is not None and not choice.ghosts and choice.kind in ("virtualclusters", "configmap"):
            self.accepted.record(nodes)  # they fit the cluster as it is: this is the cluster they were accepted on
        return choice
