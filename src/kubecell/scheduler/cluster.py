"""The scheduler's view of the cluster: a mirror of the API objects it watches, the nodes as the core
sees them, and the tenants to use when the operator configured none."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubecell.core.errors import InvalidInputError
from kubecell.kube import pods
from kubecell.kube.inventory import NodeView, node_view
from kubecell.kube.watch import Event

log = logging.getLogger("kubecell.scheduler")


@dataclass
class Mirror:
    """The API objects the scheduler reads, as the watches last reported them."""

    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    podgroups: dict[str, dict[tuple[str, str], Mapping[str, Any]]] = field(default_factory=dict)
    tenants: dict[str, Any] | None = None
    virtualclusters: dict[str, dict[str, Any]] = field(default_factory=dict)
    """VirtualCluster objects by name (cluster-scoped): the tenant configuration when any exist."""
    changed: dict[str, None] = field(default_factory=dict)
    """Uids of the pods added, modified or deleted since the scheduler last took them (``take_changed``):
    what a step has to look at, so that a step's cost follows the change, not the cluster."""
    groups_changed: bool = False
    claims: dict[str, dict[str, Any]] = field(default_factory=dict)
    """ResourceClaims by ``<namespace>/<name>`` (Dynamic Resource Allocation; empty where the API is off)."""
    deviceclasses: dict[str, dict[str, Any]] = field(default_factory=dict)
    slices: dict[str, dict[str, Any]] = field(default_factory=dict)
    """ResourceSlices by name: the devices the nodes' DRA drivers publish."""
    claims_changed: dict[str, None] = field(default_factory=dict)
    """Keys of the claims changed since ``take_claims_changed`` (a pod waiting for its claim looks again)."""
    devices_version: int = 0
    """Counts changes of slices and device classes: what was read from them is read again after one."""
    claims_awaiting_devices: dict[str, None] = field(default_factory=dict)
    """Keys of claims someone else allocated that name devices of kubecell's driver not published (or not
    confirmed) when last looked at (kept by ``ClaimBroker.hold_foreign``): a change of the slices marks them
    changed, so that they are held once their devices are published again. Claims are otherwise looked at only
    when they change, and a claim read while its node's slice was away (the kubelet wipes a driver's slices
    when it starts, a GPU leaves the slice for an XID) was never held after the slice came back."""

    def take_changed(self) -> tuple[dict[str, None], bool]:
        """The pods changed (in the order they first changed) and whether any PodGroup did, since the
        last call (which resets both)."""
        changed, groups = self.changed, self.groups_changed
        self.changed, self.groups_changed = {}, False
        return changed, groups

    def take_claims_changed(self) -> dict[str, None]:
        changed, self.claims_changed = self.claims_changed, {}
        return changed

    def apply(self, event: Event) -> str:
        """Apply one event; returns what kind of change it was (to decide between a rebuild and a cycle)."""
        if event.kind == "resourceclaims":
            if event.type == "SYNC":
                self.claims_changed.update(dict.fromkeys(self.claims))
                self.claims_changed.update(dict.fromkeys(claim_key(obj) for obj in event.objects))
            else:
                self.claims_changed[claim_key(event.obj)] = None
            return self._apply(self.claims, event, claim_key)
        if event.kind in ("resourceslices", "deviceclasses"):
            self.devices_version += 1
            if event.kind == "resourceslices":
                self.claims_changed.update(self.claims_awaiting_devices)
            store = self.slices if event.kind == "resourceslices" else self.deviceclasses
            return self._apply(store, event, lambda o: str(o["metadata"]["name"]))
        if event.kind == "nodes":
            return self._apply(self.nodes, event, lambda o: str(o["metadata"]["name"]))
        if event.kind == "pods":
            if event.type == "SYNC":
                self.changed.update(dict.fromkeys(self.pods))
                self.changed.update(dict.fromkeys(pods.uid(obj) for obj in event.objects))
            else:
                self.changed[pods.uid(event.obj)] = None
            return self._apply(self.pods, event, pods.uid)
        if event.kind == "wake":
            return "wake"
        if event.kind == "tenants":
            if event.type == "SYNC":
                self.tenants = event.objects[0] if event.objects else None
            else:
                self.tenants = None if event.type == "DELETED" else event.obj
            return "tenants"
        if event.kind == "virtualclusters":  # a change of tenants, like the ConfigMap's
            self._apply(self.virtualclusters, event, lambda o: str(o["metadata"]["name"]))
            return "tenants"
        # Only a change of a PodGroup's spec changes what its pods ask for. Every pod waiting is read again when
        # one does; a status update (Volcano's controller writes them often, any tenant may write its own) changed
        # nothing, and read them all again at each (200 ms a step for 2,000 waiting pods; found by a hostile review).
        groups = self.podgroups.setdefault(event.kind, {})
        before = dict(groups) if event.type == "SYNC" else None
        objects = event.objects if event.type == "SYNC" else (event.obj,)
        if event.type == "SYNC":
            groups.clear()
        for obj in objects:
            meta = obj["metadata"]
            where = (meta.get("namespace", "default"), meta["name"])
            if event.type == "DELETED":
                self.groups_changed |= groups.pop(where, None) is not None
            else:
                spec = obj.get("spec") or {}
                self.groups_changed |= before is None and groups.get(where) != spec
                groups[where] = spec
        if before is not None:
            self.groups_changed |= before != groups
        return "podgroups"

    @staticmethod
    def _apply(store: dict[str, dict[str, Any]], event: Event, key: Any) -> str:
        if event.type == "SYNC":
            store.clear()
            store.update({key(obj): obj for obj in event.objects})
        elif event.type == "DELETED":
            store.pop(key(event.obj), None)
        else:
            store[key(event.obj)] = event.obj
        return event.kind

    def all_podgroups(self) -> dict[tuple[str, str], Mapping[str, Any]]:
        merged: dict[tuple[str, str], Mapping[str, Any]] = {}
        for groups in self.podgroups.values():
            merged.update(groups)
        return merged


def claim_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"


def node_view_safe(obj: Mapping[str, Any]) -> NodeView:
    """The node as the engine holds it. A cordoned or NotReady node keeps its hardware (``node``) with
    ``excluded`` saying why nothing new lands there: its running pods still hold their GPUs, and closing it
    is not a change of the cluster's shape. A node whose inventory cannot be read is left out (with the
    reason), never guessed; nothing read from a node ever raises past it."""
    name = str((obj.get("metadata") or {}).get("name") or "")
    try:
        view = node_view(obj)
        if view.node is None and view.excluded in (CORDONED, NOT_READY):
            status = dict(obj.get("status") or {}, conditions=[{"type": "Ready", "status": "True"}])
            spec = {k: v for k, v in (obj.get("spec") or {}).items() if k != "unschedulable"}
            view = dataclasses.replace(node_view(dict(obj, spec=spec, status=status)), excluded=view.excluded)
        return view
    except InvalidInputError as error:
        return NodeView(name, None, f"unreadable inventory: {error}")
    except Exception as error:  # a reader bug must cost this node, never the scheduler
        log.exception("cannot read node %s", name)
        return NodeView(name, None, f"unreadable node ({type(error).__name__}: {str(error)[:200]})")


CORDONED = "cordoned (spec.unschedulable)"
NOT_READY = "not Ready"


def hardware(view: NodeView) -> tuple[Any, ...]:
    """What of a node the engine is built from: its resources, GPUs (with health and UUIDs), topology and
    place. A change here rebuilds the engine; labels, taints and whether it is open change in place."""
    node = view.node
    if node is None:
        return (view.name, None, view.excluded)
    return (view.name, dataclasses.replace(node, labels={}), view.uuids, view.isolation, view.serial_binds,
            view.gpu_note)


def without_managed_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """An object without its managed fields (what scheduling never reads; as client-go's informers drop them)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    return obj


def trimmed_node(node: dict[str, Any]) -> dict[str, Any]:
    """A Node without what scheduling never reads: managed fields, the image list (hundreds of entries on
    a real node), volumes, and kubectl's last-applied copy of the whole object."""
    meta = {key: value for key, value in (node.get("metadata") or {}).items() if key != "managedFields"}
    if meta.get("annotations"):
        meta["annotations"] = {k: v for k, v in meta["annotations"].items() if k != pods.LAST_APPLIED}
    status = {key: value for key, value in (node.get("status") or {}).items()
              if key not in ("images", "volumesInUse", "volumesAttached")}
    return {**node, "metadata": meta, "status": status}
