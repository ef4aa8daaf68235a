"""Keeps this node's ResourceSlice(s) of ``gpu.kubecell.io`` equal to the agent's inventory.

The agent hands every new inventory to :meth:`SlicePublisher.update` (discovery, an XID, MIG reconfigured);
a thread of its own writes the slices, so the inventory publisher never waits for this API. Besides every
change it looks again every ``interval`` seconds, because others delete these slices: the kubelet wipes a
driver's slices of its node when it starts and when the driver's plugin has been unreachable for a while,
and an operator may delete them by hand. What it does in one pass (:meth:`SlicePublisher.reconcile`):

1. GET the Node (its UID is the slices' owner; a re-registered Node has a new one);
2. LIST this driver's slices of this node (``fieldSelector=spec.nodeName=<node>,spec.driver=gpu.kubecell.io``,
   which the API server indexes for ResourceSlices);
3. when the devices or the owner changed since it last wrote, or a slice is missing or was changed by
   someone else (its ``resourceVersion`` is not the one we wrote), write every slice with the pool's
   ``generation`` one higher than any seen (create, or update with the listed ``resourceVersion``), and
   delete the slices of this driver and node that the layout no longer has.

API errors are logged and retried (at once after a conflict, otherwise after a doubling back-off up to the
interval), never fatal: without slices the node only stops receiving new claims. Slices stay when the agent
stops: a restarting agent (a DaemonSet rollout) must not make the scheduler see the node empty for a
moment; the kubelet removes them if the plugin stays away.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from kubecell.core.errors import KubecellError
from kubecell.kube import dra_names as names
from kubecell.kube.inventory_schema import NodeInventory
from kubecell.kube.rest import ApiError, Kube
from kubecell.node.dra.slices import device_entries, node_slices

log = logging.getLogger("kubecell.node.dra")

DEFAULT_INTERVAL = 30.0
FIRST_BACKOFF = 0.5
MAX_GENERATION = 2**63 - 1
"""The pool generation is an int64: a slice of this node listed at this one (written by anyone who may write
ResourceSlices) leaves no higher one to write, and every pass would be refused."""


def _devices(item: dict[str, Any]) -> list[Any]:
    return list((item.get("spec") or {}).get("devices") or [])


class SlicePublisher:
    """Writes the node's slices; ``start`` runs :meth:`run` in a daemon thread until ``stop``."""

    def __init__(self, kube: Kube, node: str, *, interval: float = DEFAULT_INTERVAL) -> None:
        self.kube = kube
        self.node = node
        self.interval = interval
        self.generation = 0
        """The pool generation last written (0: none yet)."""
        self.writes = 0
        self.failures = 0
        self.last_error = ""
        self._inventory: NodeInventory | None = None
        self._written: tuple[str, str, Any] | None = None
        """(owner UID, layout, devices) of the last successful write."""
        self._versions: dict[str, str] = {}
        """Slice name -> the resourceVersion our last write got back."""
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    def update(self, inventory: NodeInventory) -> None:
        """A new inventory: publish it soon (never blocks on the API)."""
        with self._lock:
            self._inventory = inventory
        self._wake.set()

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, name=f"dra-slices-{self.node}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def run(self) -> None:
        backoff = 0.0
        while not self._stop.is_set():
            self._wake.clear()
            try:
                self.reconcile()
                backoff, pause = 0.0, self.interval
            except ApiError as error:
                backoff = 0.0 if error.conflict else min(self.interval, backoff * 2 or FIRST_BACKOFF)
                pause = backoff
                self._failed(error, pause)
            except (KubecellError, OSError) as error:
                pause = backoff = min(self.interval, backoff * 2 or FIRST_BACKOFF)
                self._failed(error, pause)
            except Exception as error:  # a bug must not end publishing: log it, keep going
                pause = backoff = min(self.interval, backoff * 2 or FIRST_BACKOFF)
                log.exception("ResourceSlices of %s: unexpected error", self.node)
                self._failed(error, pause)
            self._wake.wait(pause)

    def _failed(self, error: BaseException, pause: float) -> None:
        self.failures += 1
        self.last_error = str(error)
        log.warning("ResourceSlices of %s not published (%s); retrying in %.1f s", self.node, error, pause)

    # ------------------------------------------------------------------ one pass
    def listed(self) -> list[dict[str, Any]]:
        """This driver's slices of this node, as the API server has them."""
        selector = f"spec.nodeName={self.node},spec.driver={names.DRIVER}"
        items: list[dict[str, Any]] = self.kube.get(names.RESOURCE_SLICES, fieldSelector=selector)["items"]
        return items

    def reconcile(self) -> bool:
        """One pass; returns whether anything was written or deleted. Raises the API's errors."""
        with self._lock:
            inventory = self._inventory
        if inventory is None:
            return False
        node_uid = str(self.kube.get(f"/api/v1/nodes/{self.node}")["metadata"]["uid"])
        existing = {item["metadata"]["name"]: item for item in self.listed()}
        seen = max((int(((item.get("spec") or {}).get("pool") or {}).get("generation") or 0)
                    for item in existing.values()), default=0)
        devices = device_entries(inventory)
        wanted = node_slices(inventory, self.node, node_uid, self.generation)
        layout = ",".join(item["metadata"]["name"] for item in wanted)
        untouched = (self._written == (node_uid, layout, devices) and set(existing) == set(self._versions)
                     and all(existing[name]["metadata"].get("resourceVersion") == version
                             for name, version in self._versions.items()))
        if untouched:
            return False
        generation = max(self.generation, seen) + 1
        if generation > MAX_GENERATION:
            # No higher generation exists: start the pool again from nothing (the scheduler sees the node
            # without devices between the deletes and the creates, rather than with the other writer's forever).
            log.warning("node %s: a ResourceSlice of this node has pool generation %d, the largest there is; "
                        "deleting this node's slices to publish from generation 1", self.node, seen)
            for name in sorted(existing):
                self._delete(name)
            existing, generation = {}, 1
        wanted = node_slices(inventory, self.node, node_uid, generation)
        versions: dict[str, str] = {}
        for item in wanted:
            name = item["metadata"]["name"]
            current = existing.get(name)
            if current is None:
                written = self.kube.create(names.RESOURCE_SLICES, item)
            else:
                item["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                written = self.kube.replace(f"{names.RESOURCE_SLICES}/{name}", item)
            versions[name] = str(written["metadata"].get("resourceVersion", ""))
        for name in sorted(set(existing) - set(versions)):
            self._delete(name)
        self.generation = generation
        self._written = (node_uid, layout, devices)
        self._versions = versions
        self.writes += 1
        log.info("node %s: ResourceSlice generation %d with %d device(s)", self.node, generation,
                 sum(len(_devices(item)) for item in wanted))
        return True

    def _delete(self, name: str) -> None:
        """Delete one slice of this node; one already gone is fine."""
        try:
            self.kube.delete(f"{names.RESOURCE_SLICES}/{name}")
        except ApiError as error:
            if not error.not_found:
                raise
