"""List and watch API objects into one event queue: the scheduler's only view of the cluster.

Each watched collection runs in its own thread: it lists (taking the list's resourceVersion), pushes a
``SYNC`` carrying every object, then watches from that version with bookmarks, pushing each change. A
watch that ends (its timeout, a dropped connection, an API server restart) is reopened from the last
version seen; ``410 Gone`` (the version was compacted away) or any other error relists after a
back-off, so a flapping API server never makes a thread spin. The scheduler thread alone consumes the
queue, so the scheduler's state needs no locks.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from kubecell.kube.rest import ApiError, Kube

log = logging.getLogger("kubecell.kube.watch")

EventType = Literal["SYNC", "ADDED", "MODIFIED", "DELETED"]
WATCH_TIMEOUT_SECONDS = 300
MAX_BACKOFF_SECONDS = 10.0
LIST_PAGE = 500
"""Objects per list page (the API server's chunking, ``limit`` and ``continue``)."""


@dataclass(frozen=True, slots=True)
class Event:
    """A change of one collection; ``SYNC`` replaces the whole collection with ``objects``."""

    kind: str
    type: EventType
    obj: dict[str, Any] = field(default_factory=dict)
    objects: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class Collection:
    """What to watch: ``kind`` names it in events; ``path`` is its list URL; ``query`` narrows it."""

    kind: str
    path: str
    query: tuple[tuple[str, str], ...] = ()
    optional: bool = False
    """A collection whose API may not be installed (PodGroup CRDs): 404 means "none", checked again later."""
    transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    """Applied to every object before it is queued: what the scheduler keeps of it (as client-go's
    informer transforms strip managedFields). Memory follows what is kept, and a cluster has many pods."""


class Watcher:
    """Feeds ``events`` from one collection until ``stop`` is set."""

    def __init__(self, kube: Kube, collection: Collection, events: queue.Queue[Event], stop: threading.Event) -> None:
        self.kube = kube
        self.collection = collection
        self.events = events
        self.stop = stop
        self.thread = threading.Thread(target=self.run, name=f"watch-{collection.kind}", daemon=True)
        self.synced = threading.Event()

    def start(self) -> None:
        self.thread.start()

    def _list(self) -> str:
        """One consistent list, read a page at a time (a page is trimmed before the next is read, so a
        50,000-pod list never sits in memory whole), then queued as one SYNC."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            listed = self.kube.get(self.collection.path, limit=LIST_PAGE, **{"continue": token},
                                   **dict(self.collection.query))
            items.extend(self._kept(obj) for obj in listed.get("items") or [])
            token = (listed.get("metadata") or {}).get("continue") or None
            if token is None:
                break
        self.events.put(Event(self.collection.kind, "SYNC", objects=tuple(items)))
        self.synced.set()
        return str(listed["metadata"]["resourceVersion"])

    def _kept(self, obj: dict[str, Any]) -> dict[str, Any]:
        transform = self.collection.transform
        return transform(obj) if transform is not None else obj

    def run(self) -> None:
        version = ""
        backoff = 0.5
        while not self.stop.is_set():
            try:
                if not version:
                    version = self._list()
                for event in self.kube.watch(self.collection.path, version, timeout_seconds=WATCH_TIMEOUT_SECONDS,
                                             **dict(self.collection.query)):
                    if self.stop.is_set():
                        return
                    obj = event.get("object") or {}
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        self.events.put(Event(self.collection.kind, event["type"], obj=self._kept(obj)))
                backoff = 0.5
            except ApiError as error:
                if self.stop.is_set():
                    return
                if error.not_found and self.collection.optional:
                    self.events.put(Event(self.collection.kind, "SYNC"))
                    self.synced.set()
                    self.stop.wait(30.0)  # the CRD may be installed later
                elif not error.gone:
                    log.warning("watch of %s failed: %s", self.collection.kind, error)
                    self.stop.wait(backoff)
                    backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)
                version = ""
            except Exception as error:  # (OSError, a body that is not JSON, anything else): the thread never ends
                if self.stop.is_set():
                    return
                log.warning("watch of %s interrupted (%s: %s); relisting", self.collection.kind,
                            type(error).__name__, str(error)[:300])
                self.stop.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)
                version = ""
