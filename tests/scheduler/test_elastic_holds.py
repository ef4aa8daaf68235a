"""What the ElasticJob sizer gave and the engine does not yet see taken is held: a raise's pods being made, a
move's workers ending. No other job is offered it, so two jobs are never sized into the same idle GPUs."""

from __future__ import annotations

import copy
from typing import Any

from kubecell.kube.elasticjobs import ElasticRef
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
