"""The scheduler's side of the tenants in force: its memory across rebuilds, and the writes the rule asks for.

Which tenants are in force is one rule (``kubecell.kube.tenant_source``), shared with ``kubecell inspect``. The
scheduler adds what only it can do: it remembers what it accepted (``TenantMemory``) from one rebuild to the
next, writes each VirtualCluster's ``Accepted`` condition and the Warning Events of a refusal, and records in the
API (``kubecell.kube.accepted``) the cluster the tenants in force fit, so that nodes lost later become ghosts whose
cells are doomed rather than costing every tenant its guarantee, also after a restart, and the VirtualCluster
set in force as accepted, so that a VC whose edit is refused keeps its older guarantee across a restart too, and
the tenants ConfigMap text last accepted, so that an invalid edit of the ConfigMap keeps it across a restart too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

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
    """Whether ``memory`` was taken from the API yet (at the first rebuild; see ``recall``)."""
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

    @property
    def source(self) -> str:
        """Where the tenants text is read from, as messages (and the snapshot of the text in force) name it."""
        return f"configmap {self.namespace}/{self.configmap} key {self.key}"

    def recall(self, objects: list[dict[str, Any]]) -> None:
        """Take the memory a restarted scheduler (or a new leader) lacks from the API, once: the VirtualCluster set
        the leader recorded as in force, or without a snapshot it can read, the objects accepted as they are
        (``TenantMemory.recalled``), and the ConfigMap text the leader recorded as in force (kept when the current
        text is refused). Without this, one refused object made the whole set "never accepted" (the whole-cluster
        default took over, every accepted object was rewritten NotApplied), without the snapshot a VC whose edit
        was refused lost its older guarantee, and an invalid edit of the ConfigMap put the whole-cluster default
        in force. Raises ``ApiError`` while the API server does not answer: the rebuild is tried again."""
        if self.recalled:
            return
        self.memory, problems = TenantMemory.recalled(objects, self.accepted.load_virtualclusters(),
                                                      self.accepted.load_tenants(self.source))
        self.recalled = True
        for problem in problems:
            log.error("tenants: %s", problem)

    def in_force(self, mirror: Mirror, nodes: list[Node]) -> TenantChoice:
        """The tenants to rebuild with (``choose_tenants``), its verdicts written and its refusals told, and the
        set in force recorded in the API when it changed."""
        objects = list(mirror.virtualclusters.values())
        self.recall(objects)
        text = self.text(mirror)
        reported = text == self.tenants_text and not self.memory.vcs_in_force  # a refusal of this text was told
        self.tenants_text = text
        self.virtual_clusters.used = virtualclusters.signature(objects)
        inputs = TenantInputs(objects, text, self.accepted.load, configmap_name=f"{self.namespace}/{self.configmap}",
                              source=self.source,
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
        self.accepted.record_virtualclusters(self.memory.vcs_in_force.values())  # written only when it changed
        self.accepted.record_tenants(self.source, self.memory.configmap_text)  # likewise; None takes the key out
        return choice
