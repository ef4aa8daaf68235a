"""What observers read of the scheduler loop: narrow, read-only views it satisfies.

The loop (``kubecell.scheduler.scheduler``) takes snapshots and publishes them, so it imports this
package; this package must not import the loop back. Each observer names here exactly what it reads, as a
``Protocol`` the ``Scheduler`` satisfies structurally: ``capture`` a ``LoopView`` (on the scheduler
thread), the metrics a ``PublishedView`` (from any thread: only what is published or safe to read there).
Tests and benches can hand either a small stand-in instead of a whole scheduler.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from kubecell.core.placement.frag import TypicalPod
from kubecell.scheduler.observe.recorder import Recorder
from kubecell.scheduler.observe.snapshot import Snapshot
from kubecell.scheduler.tracking import Tracking


class LoopView(Protocol):
    """What a snapshot is taken from (read on the scheduler thread, which owns all of it)."""

    @property
    def state(self) -> Tracking | None:
        """The current engine and its pods; None before the first rebuild or without a node."""
        ...

    @property
    def needs_rebuild(self) -> bool:
        """A rebuild is due: the state is about to be replaced (the snapshot says ``rebuilding``)."""
        ...

    @property
    def cycles(self) -> int:
        """Scheduling cycles run so far."""
        ...

    @property
    def mirrored_pods(self) -> Mapping[str, Mapping[str, Any]]:
        """The mirror's pods by uid (who holds each GPU, the pods of each waiting job)."""
        ...

    @property
    def recorder(self) -> Recorder:
        """The counters and the last decisions."""
        ...

    @property
    def typical_pods(self) -> Sequence[TypicalPod]:
        """The configured typical pod shapes (fragmentation's fallback)."""
        ...

    @property
    def api_writes(self) -> int:
        """Writes to the API server that carried decisions so far."""
        ...


class PublishedView(Protocol):
    """What ``/metrics`` reads, from an HTTP thread: the published snapshot and figures safe to read at any
    moment (ints and flags), never the live engine."""

    @property
    def snapshot(self) -> Snapshot | None:
        """The latest published snapshot (replaced whole, never modified)."""
        ...

    @property
    def needs_rebuild(self) -> bool:
        ...

    @property
    def cycles(self) -> int:
        ...

    @property
    def api_writes(self) -> int:
        ...

    @property
    def recorder(self) -> Recorder:
        ...


__all__ = ["LoopView", "PublishedView"]
