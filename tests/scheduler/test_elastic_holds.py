"""What the ElasticJob sizer gave and the engine does not yet see taken is held: a raise's pods being made, a
move's workers ending. No other job is offered it, so two jobs are never sized into the same idle GPUs."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kubecell.kube import elasticjobs
from kubecell.kube.elasticjobs import ElasticRef
from kubecell.kube.kept_holds import KeptHold, decode, encode, entry_key
from kubecell.scheduler.elastic_holds import Holds
from kubecell.scheduler.elastic_sized import Sized
from tests.core.support import engine, make_nodes
from tests.scheduler.elastic_sizer_support import OWNER, RecordingSizer, worker
from tests.scheduler.test_shrink_pods import Loop

BERT, GPT = ElasticRef("ns", "bert", "job-uid"), ElasticRef("ns", "gpt", "gpt-uid")


def test_a_hold_keeps_what_its_job_does_not_run_yet_from_every_other_job() -> None:
    holds = Holds()
    holds.hold(BERT, "move", "A100", target=3, runs=0, member_gpus=2, until=100.0, now=0.0)
    assert holds.kind(BERT, "A100") == "move"
    assert holds.kind(BERT, "V100M32") is None
    assert holds.members("A100", 2, GPT, 10.0) == 3
    assert holds.members("A100", 4, GPT, 10.0) == 2, "6 GPUs are two members of 4 GPUs, rounded up"
    assert holds.members("A100", 2, BERT, 10.0) == 0, "a job's own hold is its room"
    assert holds.members("V100M32", 2, GPT, 10.0) == 0, "only on the model it was given"
    holds.runs(BERT, "V100M32", 4)
    assert holds.members("A100", 2, GPT, 10.0) == 3, "a moved job's old gang runs on elsewhere: still held"
    holds.runs(BERT, "A100", 1)
    assert holds.members("A100", 2, GPT, 10.0) == 2, "it took one member: two are still held"
    holds.runs(BERT, "A100", 3)
    assert holds.members("A100", 2, GPT, 10.0) == 0
    assert not holds.held, "gone once it runs them all"


def test_a_hold_ends_when_its_job_is_lowered_or_its_time_has_passed() -> None:
    holds = Holds()
    holds.hold(BERT, "raise", "A100", target=4, runs=2, member_gpus=1, until=100.0, now=0.0)
    assert holds.members("A100", 1, GPT, 100.0) == 2
    assert holds.members("A100", 1, GPT, 100.5) == 0, "past its time it keeps nothing"
    holds.expire(100.5)
    assert not holds.held
    holds.hold(BERT, "raise", "A100", target=4, runs=2, member_gpus=1, until=100.0, now=0.0)
    holds.release(BERT)
    assert not holds.held
    holds.hold(BERT, "raise", "A100", target=2, runs=2, member_gpus=1, until=100.0, now=0.0)
    assert not holds.held, "nothing given beyond what it runs: nothing held"
    holds.hold(BERT, "raise", "A100", target=4, runs=2, member_gpus=1, until=100.0, now=5.0)
    assert holds.made_since(5.0)
    assert not holds.made_since(5.5)


def gpt_worker(index: int) -> dict[str, Any]:
    body = copy.deepcopy(worker(index, vc="a", size=1))
    meta = body["metadata"]
    meta["name"], meta["uid"] = f"gpt-worker-{index}", f"gpt-{index}"
    meta["annotations"]["kubecell.io/group"] = "gpt"
    meta["ownerReferences"] = [{**OWNER, "name": "gpt", "uid": "gpt-uid"}]
    return body


class SizerByJob(RecordingSizer):
    def __init__(self) -> None:
        super().__init__()
        self.targets: dict[str, int] = {}

    def _write(self, sized: Sized, target: int, reason: str) -> bool:
        self.targets[sized.ref.name] = target
        return super()._write(sized, target, reason)


def test_two_jobs_raised_in_one_pass_are_not_given_the_same_idle_gpus() -> None:
    """Before any step report a job takes the idle capacity. Two such jobs in one pass each saw all of it:
    both were raised into the same GPUs, and the one whose pods came second waited out the pods' grace
    period and was given back. Now the second is offered what the first was not given."""
    eng = engine(make_nodes(2), {"a": {"gpus": 16}}, resize_min_interval_seconds=0)
    loop, sizer = Loop(eng), SizerByJob()
    loop.add(worker(0, vc="a", size=1), gpt_worker(0))  # one worker of 4 GPUs each: 8 of 16 GPUs idle
    loop.cycle(1)
    assert len(eng.running) == 2
    sizer.grow(loop.state, loop.mirror, 2)
    raised = {name: target - 1 for name, target in sizer.targets.items()}
    assert sum(raised.values()) == 2, f"8 idle GPUs are two more members of 4 GPUs in all, not each: {raised}"
    assert len(sizer.holds.held) == len(raised)
    sizer.grow(loop.state, loop.mirror, 3)
    assert sum(target - 1 for target in sizer.targets.values()) == 2, "nor at the next pass, while pods are made"


def test_every_hold_made_or_ended_is_kept_once() -> None:
    """Each hold made or ended is told to ``keep`` (the holds' ConfigMap), but not one made again as it was:
    a waiting gang's start is held again at every plan, and each would be two API calls."""
    kept: list[tuple[str, Any]] = []
    holds = Holds(keep=lambda ref, hold: kept.append((ref.name, None if hold is None else hold.target)))
    holds.hold(BERT, "start", "A100", target=3, runs=0, member_gpus=2, until=100.0, now=0.0)
    holds.hold(BERT, "start", "A100", target=3, runs=0, member_gpus=2, until=110.0, now=10.0)
    assert kept == [("bert", 3)], "held again as it was, and its end moved less than 30 s: not kept again"
    holds.hold(BERT, "start", "A100", target=3, runs=0, member_gpus=2, until=140.0, now=40.0)
    holds.hold(BERT, "start", "A100", target=4, runs=0, member_gpus=2, until=140.0, now=40.0)
    assert kept == [("bert", 3), ("bert", 3), ("bert", 4)]
    holds.runs(BERT, "A100", 4)
    holds.hold(GPT, "raise", "A100", target=2, runs=1, member_gpus=2, until=100.0, now=0.0)
    holds.release(GPT)
    holds.release(GPT)
    assert kept[3:] == [("bert", None), ("gpt", 2), ("gpt", None)], "ended once each"
    holds.restore(BERT, "move", "A100", target=2, member_gpus=2, until=100.0, now=50.0)
    assert len(kept) == 6, "a hold taken on from the status is not written back"
    holds.expire(101.0)
    assert kept[-1] == ("bert", None), "one that runs out is taken off the status"


LLAMA = ElasticRef("ns", "llama", "llama-uid")


def restarted(kept: dict[str, str]) -> tuple[Loop, SizerByJob]:
    """bert and gpt run one member of 4 GPUs each (8 of 16 GPUs idle), under a sizer that has just started and
    finds ``kept`` in the holds' ConfigMap."""
    eng = engine(make_nodes(2), {"a": {"gpus": 16}}, resize_min_interval_seconds=0)
    loop, sizer = Loop(eng), SizerByJob()
    loop.add(worker(0, vc="a", size=1), gpt_worker(0))
    loop.cycle(1)
    sizer.store.data = dict(kept)
    return loop, sizer


def test_a_restarted_sizer_offers_nobody_what_the_last_one_held() -> None:
    """A move's replacements are made only once its old workers end. A scheduler that restarts meanwhile sees
    the GPUs the move was given idle; it must not grow another job into them. It takes on the holds the last
    one kept before it sizes anything."""
    now = 1_796_090_400.0
    moved = KeptHold(LLAMA, "move", "V100M32", 2, 4, now + 60)  # llama's two members of 4 GPUs
    loop, sizer = restarted({entry_key(LLAMA): encode(moved)})
    sizer.grow(loop.state, loop.mirror, now)
    assert sizer.targets == {}, "the 8 idle GPUs are llama's: nobody is raised into them"
    assert sizer.store.writes == [], "taken on as it was: not written back"
    sizer.grow(loop.state, loop.mirror, now + 61)
    assert sum(target - 1 for target in sizer.targets.values()) == 2, "once it has run out, they are offered"
    assert entry_key(LLAMA) not in sizer.store.data, "and it is taken out of the ConfigMap"


def test_a_restarted_sizer_counts_what_a_held_job_runs_by_then() -> None:
    """A raise kept before the restart and run since holds nothing more."""
    now = 1_796_090_400.0
    raised = KeptHold(ElasticRef("ns", "gpt", "gpt-uid"), "raise", "V100M32", 1, 4, now + 60)
    loop, sizer = restarted({"ns.gpt": encode(raised)})
    sizer.grow(loop.state, loop.mirror, now)
    assert "ns.gpt" not in sizer.store.data, "gpt runs its one member: its hold ended"
    assert sum(target - 1 for target in sizer.targets.values()) == 2


def test_a_kept_hold_of_a_job_deleted_meanwhile_is_let_go() -> None:
    now = 1_796_090_400.0
    loop, sizer = restarted({entry_key(LLAMA): encode(KeptHold(LLAMA, "move", "V100M32", 2, 4, now + 60))})
    sizer.deleted.add("llama")
    sizer.grow(loop.state, loop.mirror, now)
    assert sum(target - 1 for target in sizer.targets.values()) == 2
    assert entry_key(LLAMA) not in sizer.store.data, "and taken out"


@pytest.mark.parametrize("kept", [
    {"ns.llama": "not a hold"},
    {"ns.llama": encode(KeptHold(LLAMA, "move", "V100M32", 2, 4, 1_796_090_400.0 - 1))},  # ran out before
    {"ns.llama": encode(KeptHold(LLAMA, "move", "A100", 2, 4, 1_796_090_400.0 + 60))},  # GPUs of another model
], ids=["unreadable", "ran-out", "another-model"])
def test_a_kept_hold_that_holds_nothing_here_is_let_go(kept: dict[str, str]) -> None:
    now = 1_796_090_400.0
    loop, sizer = restarted(kept)
    sizer.grow(loop.state, loop.mirror, now)
    assert sum(target - 1 for target in sizer.targets.values()) == 2
    assert ("ns.llama" in sizer.store.data) == ("A100" in kept["ns.llama"]), \
        "what ran out or fails a check is taken out; a hold elsewhere stays until it ends"


def test_a_kept_hold_lasts_no_longer_than_any_hold_the_sizer_makes() -> None:
    now = 1_796_090_400.0
    kept = KeptHold(LLAMA, "move", "V100M32", 2, 4, now + 10 * 365 * 86400)
    loop, sizer = restarted({entry_key(LLAMA): encode(kept)})
    sizer.grow(loop.state, loop.mirror, now)
    assert sizer.targets == {}
    sizer.grow(loop.state, loop.mirror, now + elasticjobs.MAX_GRACE_SECONDS + sizer.pending_grace_seconds + 1)
    assert sum(target - 1 for target in sizer.targets.values()) == 2, "a move's longest: a day's grace and the pods'"


def test_every_hold_the_sizer_makes_or_ends_is_kept() -> None:
    eng = engine(make_nodes(2), {"a": {"gpus": 16}}, resize_min_interval_seconds=0)
    loop, sizer = Loop(eng), SizerByJob()
    loop.add(worker(0, vc="a", size=1), gpt_worker(0))
    loop.cycle(1)
    sizer.grow(loop.state, loop.mirror, 2)
    kept = {key: decode(key, text) for key, text in sizer.store.data.items()}
    assert {key: (k.kind, k.replicas, k.member_gpus) for key, k in kept.items() if k is not None} == {
        f"ns.{name}": ("raise", target, 4) for name, target in sizer.targets.items()}, kept
