"""What the ElasticJob controller did to one job's Pods and has not seen come back through its watch yet
(client-go's "expectations"): the one thing it keeps in memory, so that a lagging watch never makes it count a
restart twice or create a worker twice. A new controller starts without them and reads everything afresh."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Expectations:
    """What this controller did to one job's Pods and has not seen come back through the watch yet."""

    deleted: dict[str, float] = field(default_factory=dict)
    """Pod UID -> until when it counts as leaving, whatever the cache still says."""
    created: dict[int, float] = field(default_factory=dict)
    """Worker index -> until when it counts as existing, before the cache shows it."""
    owed: set[int] = field(default_factory=set)
    """Indices left missing on purpose (deleted to replace or to shrink, a create that failed): created again
    without a WorkerLost."""

    def expire(self, now: float) -> None:
        self.deleted = {uid: until for uid, until in self.deleted.items() if until > now}
        self.created = {index: until for index, until in self.created.items() if until > now}
