"""Reading the cluster's nodes for the scheduler: what each is to the engine, and what changed since.

Three kinds of change, three costs. A change of a node's **hardware** (resources, GPUs and their health,
UUIDs, rack, zone: ``cluster.hardware``) changes the engine's shape and rebuilds it. A node that is only
**closed or opened** (cordoned, uncordoned, NotReady, Ready) or whose **labels or taints** changed keeps its
place in the engine: the scheduler updates it in place (``Scheduler._update_nodes``). Anything else a kubelet
posts every few seconds (heartbeats, conditions other than Ready, images) changes nothing at all; a node is
even read again only when its resourceVersion moved, because reading 5,000 nodes for each event batch is what
a scheduler cannot afford.

What a node reports is untrusted like everything else: an inventory kubecell cannot read, or one claiming more
GPUs than the node advertises, is told in a Warning Event on the Node, once per change of what is wrong.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from kubecell.kube.actions import Actions
from kubecell.kube.inventory import NodeView
from kubecell.scheduler.cluster import hardware, node_view_safe

log = logging.getLogger("kubecell.scheduler")

Terms = tuple[Any, ...]
"""Per node, what is updated in place: why it is closed (``NodeView.excluded``) and its labels and taints."""


def placement_terms(node: Mapping[str, Any]) -> tuple[Any, ...]:
    """What of a node decides which pods may use it (its labels and taints): a change makes every waiting job
    evaluate its node constraints again."""
    meta, spec = node.get("metadata") or {}, node.get("spec") or {}
    labels = meta.get("labels") or {}
    taints = spec.get("taints") or []
    return (tuple(sorted(labels.items())),
            tuple((t.get("key"), t.get("value"), t.get("effect")) for t in taints if isinstance(t, Mapping)))


class NodeReader:
    """The node views, their hardware signature and their terms, read incrementally."""

    def __init__(self, actions: Actions) -> None:
        self.actions = actions
        self.reads: dict[str, tuple[str, NodeView, Terms]] = {}
        """Node -> (resourceVersion read, its view, its terms)."""
        self.applied: dict[str, Terms] = {}
        """Node -> the terms the engine was last brought to (at a rebuild or in place)."""
        self.notes: dict[str, str] = {}
        """Node -> what was last told in a Warning Event about its report."""

    def read(self, nodes: Mapping[str, dict[str, Any]]) -> tuple[dict[str, NodeView], tuple[Any, ...]]:
        """Every node as the core sees it, by name, and the hardware signature of them all."""
        views, signature, read = {}, [], {}
        for name, obj in sorted(nodes.items()):
            version = str(obj["metadata"].get("resourceVersion", ""))
            known = self.reads.get(name)
            if known is None or known[0] != version or not version:
                view = node_view_safe(obj)
                known = (version, view, (view.excluded, placement_terms(obj)))
                self._tell(obj, view)
            read[name] = known
            views[name] = known[1]
            signature.append(hardware(known[1]))
        self.reads = read
        return views, tuple(signature)

    def changed(self, views: Mapping[str, NodeView]) -> list[str]:
        """The nodes whose terms differ from what the engine was last brought to."""
        return sorted(name for name in views if self.reads[name][2] != self.applied.get(name))

    def applied_now(self, views: Mapping[str, NodeView]) -> None:
        """The engine now reflects every node's current terms."""
        self.applied = {name: self.reads[name][2] for name in views if name in self.reads}

    def views(self) -> list[NodeView]:
        return [view for _, view, _ in self.reads.values()]

    def _tell(self, obj: dict[str, Any], view: NodeView) -> None:
        unreadable = view.node is None and view.excluded.startswith("unreadable")
        note = view.excluded if unreadable else view.inventory_note
        if note and self.notes.get(view.name) != note:
            log.warning("node %s: %s", view.name, note)
            self.actions.node_warning(obj, "UnreadableNode" if unreadable else "InventoryBeyondCapacity", note)
        if note:
            self.notes[view.name] = note
        else:
            self.notes.pop(view.name, None)
