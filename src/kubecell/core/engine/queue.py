"""The queue of waiting jobs: classes of identical jobs, the order they are tried in, and when to try.

Identical jobs (same VC, priority, member shape, headcount, minimum, constraint, allowed nodes, and
whether they may still borrow; for heterogeneous gangs every group's name, shape, count and minimum)
form a *class*, oldest first. A cycle tries only a class's oldest job:
when it cannot start neither can the rest, so a cycle costs O(classes), not O(waiting jobs). The
class's wait reason is copied to every member when it changes and otherwise only to the jobs that
joined since, so every waiting job can say why at no extra cost.

Order: opportunistic work last; between VCs, the lowest weighted dominant share first (fair share
divides idle capacity); inside a VC, priority, then age (or, with ``queue_order: shortest-expected``, the
expected run time its history gives, then age). Priority therefore never lets one tenant jump
ahead of another (KAI and Kueue: fair share between queues, priority within a queue); with fair
sharing off (the quota baseline) it is priority, then age, across the whole cluster.

A cycle tries every class when something changed that could let any waiting job start (a job stopped,
hardware or configuration changed), and otherwise only the classes that received new jobs and those
whose own wake-up time has passed (a victim-search back-off ends, a protected victim becomes evictable,
a job starts starving): a time-based rule concerns the class it stopped, so it retries that class alone.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator

from kubecell.core.engine.job import Job

ClassKey = tuple[object, ...]
_SUBMITTED = "submitted; waiting for the next scheduling cycle"


UNKNOWN_EXPECTED_SECONDS = 3600.0
"""What ``shortest-expected`` ordering assumes of a job without history: an hour, the order of a typical
median run (Philly, Helios). Neither first (every new family would jump the queue) nor last (it would wait
for the history it can only get by running)."""


def expected_bucket(job: Job) -> int:
    """The job's expected run time in powers of two of seconds: jobs within a factor of two of each other are
    equals, so a noisy estimate does not reorder them and identical jobs stay one class."""
    seconds = job.spec.expected_seconds
    return math.floor(math.log2(max(UNKNOWN_EXPECTED_SECONDS if seconds is None else seconds, 1.0)))


class JobQueue:
    def __init__(self, max_preemptions: int, *, shortest_expected: bool = False) -> None:
        self.max_preemptions = max_preemptions
        self.shortest_expected = shortest_expected
        self.pending: dict[str, Job] = {}
        self._classes: dict[ClassKey, deque[Job]] = {}
        self._class_of: dict[str, ClassKey] = {}
        self._class_reason: dict[ClassKey, str] = {}
        self._unsynced: dict[ClassKey, list[Job]] = {}  # joined a class since it was last tried
        self._new: dict[str, None] = {}  # joined since the last cycle began (ordered)
        self._dirty = True
        self._due: dict[ClassKey, float] = {}  # class -> when to try it again (a time-based rule)

    # ------------------------------------------------------------------ membership
    def class_key(self, job: Job) -> ClassKey:
        spec = job.spec
        shape: object = spec.member.shape
        if spec.heterogeneous:  # the same class only if every group matches (names too: reasons name them)
            shape = tuple((g.name, g.member.shape, g.count, g.minimum) for g in spec.member_groups)
        return (spec.vc, spec.priority, shape, spec.members, spec.minimum, spec.topology,
                job.preemptions >= self.max_preemptions, spec.nodes,
                expected_bucket(job) if self.shortest_expected else 0)

    def enqueue(self, job: Job, now: float, *, since: float | None = None) -> None:
        """Add a waiting job; ``since`` keeps the age it had (a failed bind), else it waits from ``now``."""
        key = self.class_key(job)
        job.queued_at = now if since is None else since
        if job.wait_reason in ("", "not yet considered"):
            job.wait_reason = _SUBMITTED
        self.pending[job.name] = job
        self._class_of[job.name] = key
        queue = self._classes.setdefault(key, deque())
        if queue and since is not None and (queue[-1].queued_at or 0.0) > job.queued_at:
            ordered = sorted([*queue, job], key=lambda j: (j.queued_at or 0.0, j.name))
            queue.clear()
            queue.extend(ordered)
        else:
            queue.append(job)
        self._unsynced.setdefault(key, []).append(job)
        self._new[job.name] = None

    def dequeue(self, job: Job) -> None:
        self.pending.pop(job.name, None)
        self._new.pop(job.name, None)
        key = self._class_of.pop(job.name, None)
        if key is None:
            return
        queue = self._classes[key]
        if queue and queue[0] is job:
            queue.popleft()
        else:
            queue.remove(job)
        if not queue:
            del self._classes[key]
            self._class_reason.pop(key, None)
            self._unsynced.pop(key, None)

    def __contains__(self, name: object) -> bool:
        return name in self.pending

    def __len__(self) -> int:
        return len(self.pending)

    def class_of(self, job: Job) -> ClassKey:
        return self._class_of.get(job.name, (job.name,))

    def head(self, key: ClassKey) -> Job | None:
        queue = self._classes.get(key)
        return queue[0] if queue else None

    def classes(self) -> Iterator[tuple[ClassKey, deque[Job]]]:
        return iter(self._classes.items())

    def is_newcomer(self, name: str) -> bool:
        """Did the job join after the last cycle began (so no cycle has told it anything yet)?"""
        return name in self._new

    # ------------------------------------------------------------------ when and what to try
    def mark_dirty(self) -> None:
        """Something changed that could let any waiting job start: the next cycle tries every class."""
        self._dirty = True

    def wake_later(self, job: Job, when: float) -> None:
        """Try ``job``'s class again at ``when`` (a protection expires, a back-off ends, it starts starving)."""
        key = self.class_of(job)
        if key not in self._due or when < self._due[key]:
            self._due[key] = when

    @property
    def next_wake(self) -> float | None:
        return min(self._due.values(), default=None)

    def begin_cycle(self, now: float) -> list[ClassKey]:
        """The classes this cycle tries: all of them after a change, else the new ones and those due."""
        due = [key for key, when in self._due.items() if when <= now]
        for key in due:
            del self._due[key]
        if self._dirty:
            keys = list(self._classes)
        else:
            fresh = (self._class_of[n] for n in self._new if n in self._class_of)
            keys = list(dict.fromkeys([*fresh, *(key for key in due if key in self._classes)]))
        self._dirty = False
        self._new.clear()
        return keys

    def all_classes(self) -> list[ClassKey]:
        return list(self._classes)

    def order_key(self, job: Job, share: Callable[[str], float]) -> tuple[bool, float, int, int, float, str]:
        expected = expected_bucket(job) if self.shortest_expected else 0
        return (job.spec.opportunistic, share(job.vc), -job.spec.priority, expected, job.queued_at or 0.0, job.name)

    def class_waits(self, key: ClassKey, reason: str) -> None:
        """Every job of a class waits for the same reason. The text goes to every member only when it
        changes; otherwise to the job that was tried and those that joined since the class was last tried."""
        newcomers = self._unsynced.pop(key, [])
        queue = self._classes.get(key)
        if queue is None:
            return
        queue[0].wait_reason = reason
        if self._class_reason.get(key) == reason:
            for job in newcomers:
                if self._class_of.get(job.name) == key:  # still waiting in this class
                    job.wait_reason = reason
            return
        self._class_reason[key] = reason
        for job in queue:
            job.wait_reason = reason
