"""GPUs the ElasticJob sizer has given a job that the engine does not yet see taken.

The sizer decides on what the engine sees idle, but what it decides is carried out later: a raised target is
pods the job's controller has yet to make and the engine to bind (a second or two), and a move is workers that
must end first (their grace period, 30 s by default) before their replacements are made on the new model. In
between, the engine still sees those GPUs idle, and so would the sizer's next pass, or a later job in the same
pass: it would grow another job into them, and the job they were given to would find no room (a moved job's
gang then starts elsewhere, at a second restart; a raise waits out the pods' grace and is given back).

So every raise, start and move is held here until the job runs that many members on that model, it is lowered, its
ElasticJob is gone (``SizerStatus._let_go_of_deleted``), or the time it may take has passed, and the room the sizer
offers any other job on that model is less what the holds there keep. A hold is the sizer's own bookkeeping, not the
engine's: a pod the sizer does not place (a plain pod of any VC, a guaranteed claim) still takes those GPUs if it
comes first, and the holder then starts where there is room (``elastic_types``, the ``Start`` Event).

**Kept in the API server.** A move's replacements are made only after its old workers end, so a scheduler that
restarts (or a standby that takes over) in that window would otherwise see the GPUs idle and offer them to
another job. Every hold made or ended is told to ``keep`` (the sizer writes it to a ConfigMap of its own
namespace, ``kube.kept_holds``), and a new scheduler ``restore``s what it finds there before it sizes anything."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kubecell.kube.elasticjobs import ElasticRef

KEEP_SLACK_SECONDS = 30.0
"""A hold made again as it was is kept again only once its end moved this much later: a restarted scheduler
may let it go that much sooner, never later."""


@dataclass(slots=True)
class Hold:
    """Members a job was given on a model and does not run there yet."""

    kind: str
    """What gave it: ``raise``, ``start`` or ``move``."""
    model: str
    target: int
    """The members it is to run there."""
    runs: int
    """The members it runs there now."""
    member_gpus: int
    until: float
    made_at: float
    kept_until: float = float("-inf")
    """The ``until`` last told to ``Holds.keep``."""

    @property
    def gpus(self) -> int:
        return max(self.target - self.runs, 0) * self.member_gpus


class Holds:
    """The sizer's holds, one per ElasticJob (a later decision replaces an earlier one)."""

    def __init__(self, keep: Callable[[ElasticRef, Hold | None], None] | None = None) -> None:
        self.held: dict[ElasticRef, Hold] = {}
        self.keep = keep
        """Told each hold made (the hold) or ended (None), to keep it where a restarted scheduler finds it."""

    def hold(self, ref: ElasticRef, kind: str, model: str, *, target: int, runs: int, member_gpus: int,
             until: float, now: float) -> None:
        """A ``kind`` (raise, start, move) gave ``ref`` ``target`` members of ``member_gpus`` GPUs on ``model``,
        where it runs ``runs``."""
        if target > runs:
            previous = self.held.get(ref)
            hold = self.held[ref] = Hold(kind, model, target, runs, max(member_gpus, 1), until, now)
            if previous is not None and (previous.kind, previous.model, previous.target) == (kind, model, target) \
                    and until - previous.kept_until < KEEP_SLACK_SECONDS:
                hold.kept_until = previous.kept_until  # a waiting gang's start is held again at every plan
            elif self.keep is not None:
                hold.kept_until = until
                self.keep(ref, hold)
        else:
            self._end(ref)

    def restore(self, ref: ElasticRef, kind: str, model: str, *, target: int, member_gpus: int, until: float,
                now: float) -> None:
        """A hold a previous scheduler kept, taken on as it was (not kept again); one this scheduler made
        since stays."""
        if ref not in self.held and target > 0 and until >= now:
            self.held[ref] = Hold(kind, model, target, 0, max(member_gpus, 1), until, float("-inf"))

    def release(self, ref: ElasticRef) -> None:
        """``ref`` was lowered, or sent elsewhere: what it was given is free again."""
        self._end(ref)

    def shorten(self, ref: ElasticRef, until: float) -> None:
        """``ref``'s hold ends at ``until`` at the latest (kept so: a restarted scheduler holds no longer)."""
        hold = self.held.get(ref)
        if hold is None or hold.until <= until:
            return
        hold.until = until
        if self.keep is not None:
            hold.kept_until = until
            self.keep(ref, hold)

    def runs(self, ref: ElasticRef, model: str | None, members: int) -> None:
        """``ref`` runs ``members`` on ``model`` now: a hold there shrinks by what it took (gone once it runs
        them all). A hold on another model stays: a moved job's old gang runs on where it was until it ends."""
        hold = self.held.get(ref)
        if hold is None or hold.model != model:
            return
        if members >= hold.target:
            self._end(ref)
        else:
            hold.runs = max(hold.runs, members)

    def expire(self, now: float) -> None:
        for ref in [ref for ref, hold in self.held.items() if now > hold.until]:
            self._end(ref)

    def _end(self, ref: ElasticRef) -> None:
        if self.held.pop(ref, None) is not None and self.keep is not None:
            self.keep(ref, None)

    def members(self, model: str, member_gpus: int, besides: ElasticRef | None, now: float) -> int:
        """Members of ``member_gpus`` GPUs each that the holds on ``model`` (but ``besides``'s own) keep, rounded
        up: no other job is offered them."""
        gpus = sum(hold.gpus for ref, hold in self.held.items()
                   if hold.model == model and ref != besides and now <= hold.until)
        return -(-gpus // max(member_gpus, 1)) if gpus else 0

    def kind(self, ref: ElasticRef, model: str | None) -> str | None:
        """What gave ``ref`` the members it is still held on ``model`` (None: nothing held there)."""
        hold = self.held.get(ref)
        return hold.kind if hold is not None and hold.model == model else None

    def made_since(self, moment: float) -> bool:
        """Whether a hold was made at or after ``moment`` (and is still kept)."""
        return any(hold.made_at >= moment for hold in self.held.values())
