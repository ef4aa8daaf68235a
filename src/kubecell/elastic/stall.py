"""How long an ElasticJob has had fewer than minReplicas workers Ready: the clock of its rendezvous deadline
(``rendezvousTimeoutSeconds``), and of how long a worker that exited 0 waits for the others.

Counted on the controller's own observations, never read from the status: whoever may write
``elasticjobs/status`` could move ``lastResizeTime`` or the ``Available`` condition's transition time into the
past, and the job was restarted at once (a counted restart, ``RendezvousTimeout``), or into the future, and a
rendezvous that never completes held its GPUs for ever. The clock starts when this controller first sees the job
short of its minimum in its present run and size (its restart count and target, as the controller recorded them),
starts again when either changes, and stops once the minimum is Ready. It also starts again when minReplicas
workers are first seen started in that run and size: time the gang waited for the scheduler is no stuck
rendezvous (before, a job that queued longer than the timeout was restarted, or failed with ``maxRestarts: 0``,
the first time its workers were seen running but not yet Ready). The price: a controller that restarts
starts the clocks of the jobs stalled then anew, so their deadline comes up to one rendezvous timeout later,
never earlier.
"""

from __future__ import annotations


class StallClocks:
    """Per job (by key), since when it has been short of its minimum in its present run and size."""

    def __init__(self) -> None:
        self._since: dict[str, tuple[float, tuple[str, int, int], bool]] = {}

    def seconds(self, key: str, uid: str, restarts: int, target: int, *, short: bool, started: bool,
                now: float) -> float:
        """Seconds job ``key`` has been ``short`` of its minimum Ready since its run (``restarts``) or size
        (``target``) last changed, or since its minimum first ``started`` (running) in them, as this controller
        saw it; 0 while it is not short."""
        if not short:
            self._since.pop(key, None)
            return 0.0
        mark = (uid, restarts, target)
        held = self._since.get(key)
        if held is None or held[1] != mark or (started and not held[2]):
            held = self._since[key] = (now, mark, started)
        return max(0.0, now - held[0])

    def forget(self, key: str) -> None:
        self._since.pop(key, None)
