"""GPUs the ElasticJob sizer has given a job that the engine does not yet see taken.

The sizer decides on what the engine sees idle, but what it decides is carried out later: a raised target is
pods the job's controller has yet to make and the engine to bind (a second or two), and a move is workers that
must end first (their grace period, 30 s by default) before their replacements are made on the new model. In
between, the engine still sees those GPUs idle, and so would the sizer's next pass, or a later job in the same
pass: it would grow another job into them, and the job they were given to would find no room (a moved job's
gang then starts elsewhere, at a second restart; a raise waits out the pods' grace and is given back).

So every raise, start and move is held here until the job runs that many members on that model, it is lowered,
or the time it may take has passed, and the room the sizer offers any other job on that model is less what the
holds there keep. A hold is the sizer's own bookkeeping, not the engine's: a pod the sizer does not place (a
plain pod of any VC, a guaranteed claim) still takes those GPUs if it comes first, and the holder then starts
where there is room (``elastic_types``, the ``Start`` Event). In memory: a restarted scheduler holds nothing
until it raises or moves again."""

from __future__ import annotations

from dataclasses import dataclass

from kubecell.kube.elasticjobs import ElasticRef


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

    @property
    def gpus(self) -> int:
        return max(self.target - self.runs, 0) * self.member_gpus


class Holds:
    """The sizer's holds, one per ElasticJob (a later decision replaces an earlier one)."""

    def __init__(self) -> None:
        self.held: dict[ElasticRef, Hold] = {}

    def hold(self, ref: ElasticRef, kind: str, model: str, *, target: int, runs: int, member_gpus: int,
             until: float, now: float) -> None:
        """A ``kind`` (raise, start, move) gave ``ref`` ``target`` members of ``member_gpus`` GPUs on ``model``,
        where it runs ``runs``."""
        if target > runs:
            self.held[ref] = Hold(kind, model, target, runs, max(member_gpus, 1), until, now)
        else:
            self.held.pop(ref, None)

    def release(self, ref: ElasticRef) -> None:
        """``ref`` was lowered, or sent elsewhere: what it was given is free again."""
        self.held.pop(ref, None)

    def runs(self, ref: ElasticRef, model: str | None, members: int) -> None:
        """``ref`` runs ``members`` on ``model`` now: a hold there shrinks by what it took (gone once it runs
        them all). A hold on another model stays: a moved job's old gang runs on where it was until it ends."""
        hold = self.held.get(ref)
        if hold is None or hold.model != model:
            return
        if members >= hold.target:
            del self.held[ref]
        else:
            hold.runs = max(hold.runs, members)

    def expire(self, now: float) -> None:
        for ref in [ref for ref, hold in self.held.items() if now > hold.until]:
            del self.held[ref]

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
