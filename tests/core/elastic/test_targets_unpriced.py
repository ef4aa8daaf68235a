"""A job with no trusted goodput model (it never reported, or only what the model refuses) is not sized by the
allocator, but what it grew above its minimum (it took the idle room) is what its teammates may grow into: the
members a job of its VC that reports needs beyond the idle slots are taken from it first, before any job that
reports gives, down to its minimum, never inside its resize interval, and never for another VC. Before, such
a job was no candidate at all: what it took was never handed to a teammate's growth."""

from __future__ import annotations

from dataclasses import replace

from kubecell.core.elastic.allocator import KubecellElasticPolicy
from kubecell.core.elastic.targets import GrowthCandidate, GrowthChoice, plan_targets
from tests.core.elastic.test_targets import NOW, Curve, job


def unreported(name: str, *, size: int = 7, shrinkable: int | None = None, attained: float = 0.0,
               node: str = "n1", vc: str = "a", room: int = 0) -> GrowthCandidate:
    """A running job without a goodput model (its estimate answers nothing: it is never read)."""
    return replace(job(name, Curve(knee=1, gpu_type="none"), size=size, room=room, node=node, vc=vc,
                       attained=attained, shrinkable=shrinkable), gpu_type="A100", priced=False)


def plan(candidates: list[GrowthCandidate]) -> dict[str, GrowthChoice]:
    return plan_targets({"a": KubecellElasticPolicy(), "b": KubecellElasticPolicy()}, NOW, candidates)


def test_an_unreported_job_gives_what_it_grew_to_a_teammate_that_reports() -> None:
    """One 8-GPU node: the job that took the room runs 7, the one that reports runs 1 and scales to 8. The
    reporting one grows by what the other gives, exactly, and the reason says why."""
    choices = plan([unreported("quiet", size=7), job("new", Curve(knee=8), size=1, room=0)])
    grown, given = choices["new"].target - 1, 7 - choices["quiet"].target
    assert grown > 0, choices
    assert given == grown, choices
    assert choices["quiet"].target >= 1, "never below its minimum"
    assert "no trusted step reports" in choices["quiet"].reason, choices["quiet"].reason
    assert choices["quiet"].gpu_type is None


def test_it_gives_before_a_job_that_reports_even_a_more_served_one() -> None:
    """Its members' worth is unknown, a reporting job's is measured: the unreported job gives first."""
    served = job("served", Curve(knee=8), size=4, room=0, attained=50 * 3600.0, node="n1")
    quiet = unreported("quiet", size=4, attained=3600.0, node="n2")
    new = job("new", Curve(knee=4), size=1, room=0, node="n3")
    choices = plan([served, quiet, new])
    grown = choices["new"].target - 1
    assert grown == 3, choices
    assert choices["quiet"].target == 1, choices
    assert choices["served"].target == 4, "the reporting job keeps its members"


def test_only_as_many_as_the_teammate_takes() -> None:
    choices = plan([unreported("quiet", size=7), job("new", Curve(knee=2), size=1, room=0)])
    assert (choices["new"].target, choices["quiet"].target) == (2, 6), choices


def test_idle_slots_first_and_nothing_taken_when_nobody_needs_it() -> None:
    assert "quiet" not in plan([unreported("quiet", size=7), job("new", Curve(knee=4), size=1, room=4)])
    assert plan([unreported("quiet", size=7)]) == {}, "alone, it is left to itself (and to the engine)"


def test_nothing_inside_its_resize_interval_nor_for_another_vc() -> None:
    held = plan([unreported("quiet", size=7, shrinkable=0), job("new", Curve(knee=8), size=1, room=0)])
    assert held["new"].target == 1, held
    assert "quiet" not in held, held
    apart = plan([unreported("quiet", size=7, vc="b"), job("new", Curve(knee=8), size=1, room=0)])
    assert apart["new"].target == 1, apart
    assert "quiet" not in apart, apart


def test_it_is_never_grown_by_the_allocator() -> None:
    """Its room is the driver's to give (``take_the_room``): the allocator, which cannot price it, raises it
    nowhere."""
    choices = plan([unreported("quiet", size=2, room=6), job("new", Curve(knee=2), size=1, room=6, node="n2")])
    assert choices.get("quiet", GrowthChoice(2, "")).target <= 2, choices


def test_a_waiting_job_may_start_on_what_it_gives() -> None:
    waiting = replace(job("waiting", Curve(knee=4), size=0, room=0), gpu_type="", rooms={"A100": 0})
    choices = plan([unreported("quiet", size=7), waiting])
    assert choices["waiting"].target >= 1, choices
    assert 7 - choices["quiet"].target == choices["waiting"].target, choices
