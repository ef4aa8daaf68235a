"""The ElasticJob sizer's goodput model of each job: kept in the job's status and taken up after a restart,
learned at the batch range the job states (or the batch it reports), and fed only step reports it can trust:
from pods the job controls, of worlds the job can form. Writes are recorded, not sent."""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest

from kubecell.kube.names import ANNOTATION_STEP_REPORT
from kubecell.kube.rest import ApiError
from kubecell.kube.step_reports import build_step_report
from tests.scheduler.elastic_sizer_support import (
    OWNER,
    RecordingSizer,
    report_from_both,
    reporting_job,
)


def test_the_goodput_model_is_kept_in_the_status_when_it_learns_a_placement_and_taken_up_after_a_restart() -> None:
    first = RecordingSizer()
    loop = reporting_job()
    start = time.time()
    report_from_both(loop, start, replicas=2, local=32, step=0.4, var=50.0)
    first.grow(loop.state, loop.mirror, start)
    assert len(first.models_written) == 1, "its first placement is kept at once"
    for later in (40.0, 80.0, 120.0):
        report_from_both(loop, start + later, replicas=2, local=32, step=0.41, var=60.0)
        first.grow(loop.state, loop.mirror, start + later)
    assert len(first.models_written) == 1, "the same placement again: kept at most every 5 minutes"
    report_from_both(loop, start + 160, replicas=2, local=64, step=0.7, var=60.0)
    first.grow(loop.state, loop.mirror, start + 160)
    assert len(first.models_written) == 2, "a new placement shape is kept at once"
    report_from_both(loop, start + 470, replicas=2, local=64, step=0.72, var=70.0)
    first.grow(loop.state, loop.mirror, start + 470)
    assert len(first.models_written) == 3, "the smoothed times and the noise, 5 minutes later"
    first.grow(loop.state, loop.mirror, start + 900)
    assert len(first.models_written) == 3, "nothing learned since: nothing written"
    (ref,) = first.jobs
    old = first.jobs[ref].model
    assert old is not None

    restarted = RecordingSizer()
    restarted.model_kept = first.model_kept
    again = reporting_job()
    for each, sizer in ((loop, first), (again, restarted)):  # both read the report that follows
        report_from_both(each, start + 960, replicas=2, local=64, step=0.75, var=80.0)
        sizer.grow(each.state, each.mirror, start + 960)
    new = restarted.jobs[ref].model
    assert new is not None
    assert new.measurements() == old.measurements(), \
        "all it learned, the placement the pods no longer report included, as if it had not restarted"
    assert new.noise.sums == old.noise.sums
    assert new.noise.known
    assert restarted.events == []


@pytest.mark.parametrize("kept", [{"version": 1, "batchSize": {"min": 64, "max": 1024},
                                   "types": [{"gpuType": "V100M32", "shapes": [[1, 2, 32, 0.4, 0.5]]}]},
                                  {"version": 1, "batchSize": {"min": 64, "max": 2048}, "types": []},
                                  "not a model"])
def test_a_kept_model_that_fails_a_check_is_told_and_the_job_learns_afresh(kept: Any) -> None:
    sizer = RecordingSizer()
    sizer.model_kept = kept  # sync above step; another batch range; not a mapping
    loop = reporting_job()
    start = time.time()
    for later in (0.0, 40.0):
        report_from_both(loop, start + later, replicas=2, local=16, step=0.3, var=10.0)
        sizer.grow(loop.state, loop.mirror, start + later)
    model = next(iter(sizer.jobs.values())).model
    assert model is not None
    assert {row[:3] for row in model.measurements()["V100M32"]} == {(1, 2, 16)}, "only what the pods report"
    assert [reason for reason, _ in sizer.events] == ["GoodputModelDropped"], "told once"
    assert sizer.models_written, "what it learns replaces the value it dropped"
    assert sizer.models_written[-1]["types"][0]["shapes"][0][:3] == [1, 2, 16]


def test_a_job_that_states_no_batch_range_keeps_the_batch_its_model_was_learned_at() -> None:
    first = RecordingSizer(batchSize=None)  # priced at the batch it first reports: 2 x 32
    loop = reporting_job()
    start = time.time()
    report_from_both(loop, start, replicas=2, local=32, step=0.4, var=50.0)
    first.grow(loop.state, loop.mirror, start)
    (sized,) = first.jobs.values()
    assert sized.model is not None
    assert (sized.model.initial_bsz, sized.model.max_bsz) == (64, 64)
    restarted = RecordingSizer(batchSize=None)
    restarted.model_kept = first.model_kept
    loop = reporting_job()
    report_from_both(loop, start + 60, replicas=2, local=16, step=0.3, var=50.0)  # the script halved its batch
    restarted.grow(loop.state, loop.mirror, start + 60)
    (sized,) = restarted.jobs.values()
    assert sized.model is not None
    assert (sized.model.initial_bsz, sized.model.max_bsz) == (64, 64), "the batch it was learned at"
    assert {row[:3] for row in sized.model.measurements()["V100M32"]} == {(1, 2, 32), (1, 2, 16)}
    assert restarted.events == []

    forged = RecordingSizer(batchSize=None)
    forged.model_kept = dict(first.model_kept, batchSize={"min": 16, "max": 16})  # its micro-batch of 32 does not fit
    loop = reporting_job()
    report_from_both(loop, start + 60, replicas=2, local=16, step=0.3, var=50.0)
    forged.grow(loop.state, loop.mirror, start + 60)
    (sized,) = forged.jobs.values()
    assert sized.model is not None
    assert (sized.model.initial_bsz, sized.model.max_bsz) == (32, 32), "a dropped value leaves not even its batch"
    assert [reason for reason, _ in forged.events] == ["GoodputModelDropped"]


def test_the_micro_batch_limit_a_job_reports_prices_its_larger_batches_as_accumulation() -> None:
    sizer = RecordingSizer()
    loop = reporting_job()
    start = time.time()
    report_from_both(loop, start, replicas=2, local=32, step=0.4, var=5000.0)  # noisy: it wants a large batch
    sizer.grow(loop.state, loop.mirror, start)
    (sized,) = sizer.jobs.values()
    model = sized.model
    assert model is not None
    local, accumulation = model.best_batch("V100M32", 1, 2)  # type: ignore[misc]
    assert (local > 40, accumulation) == (True, 1), "nothing said: one large micro-batch"
    report_from_both(loop, start + 30, replicas=2, local=32, step=0.4, var=5000.0, most=40)
    sizer.grow(loop.state, loop.mirror, start + 30)
    assert model.max_local_bsz == {"V100M32": 40}
    local, accumulation = model.best_batch("V100M32", 1, 2)  # type: ignore[misc]
    assert local <= 40
    assert accumulation > 1
    assert sizer.models_written[-1]["types"][0]["maxLocal"] == 40, "kept for a restarted scheduler"


class FlakySizer(RecordingSizer):
    """The API cannot be reached for the first ``failures`` reads of the job's kept model."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def _read_model(self, ref: Any) -> Any:
        if self.failures > 0:
            self.failures -= 1
            raise ApiError(503, "Service Unavailable", "etcdserver: leader changed", method="GET", path="/apis")
        return super()._read_model(ref)


def test_a_kept_model_the_api_cannot_give_now_is_waited_for_not_overwritten(
        caplog: pytest.LogCaptureFixture) -> None:
    first = RecordingSizer()
    loop = reporting_job()
    start = time.time()
    report_from_both(loop, start, replicas=2, local=32, step=0.4, var=50.0)
    first.grow(loop.state, loop.mirror, start)
    kept = first.model_kept
    assert kept is not None

    flaky = FlakySizer(failures=2)  # two passes, each one read for the job (not one per pod's report)
    flaky.model_kept = kept
    loop = reporting_job()
    report_from_both(loop, start + 60, replicas=2, local=16, step=0.3, var=50.0)
    for now in (start + 60, start + 61):
        flaky.grow(loop.state, loop.mirror, now)
    (sized,) = flaky.jobs.values()
    assert sized.model is None, "no model made without what the status keeps"
    assert flaky.models_written == [], "so nothing overwrites it"
    assert sum("unreadable" in record.message for record in caplog.records) == 1, "told once"
    flaky.grow(loop.state, loop.mirror, start + 62)  # the API answers: the same reports are read again
    assert sized.model is not None
    assert {row[:3] for row in sized.model.measurements()["V100M32"]} == {(1, 2, 32), (1, 2, 16)}


def test_a_report_of_a_world_the_job_can_never_form_is_refused() -> None:
    """A worker writes its own reports: one that states more replicas than the job's most workers can run
    (4 workers of one process here) would lift the model's exploration limit and let the job grow on a claim."""
    loop, sizer = reporting_job(), RecordingSizer()
    now = time.time()
    report_from_both(loop, now, replicas=512, local=32, step=0.4, var=50.0)
    sizer.grow(loop.state, loop.mirror, now)
    (sized,) = sizer.jobs.values()
    assert sizer.jobs[sized.ref].model is None, "nothing learned from it (nor a model made of it)"
    assert [reason for reason, _ in sizer.events] == ["UntrustedReport", "UntrustedReport"], "each pod told once"
    assert "512 replicas on 1 nodes: this job runs at most 4 workers of 1 processes each" in sizer.events[0][1]
    report_from_both(loop, now + 60, replicas=2, local=32, step=0.4, var=50.0)
    sizer.grow(loop.state, loop.mirror, now + 60)
    assert sized.model is not None
    assert sized.model.measurements() != {}, "a world it can form is learned"


def test_reports_of_a_gang_member_another_job_controls_are_not_this_jobs() -> None:
    """Any pod of the namespace may carry the gang's annotations; only pods the ElasticJob controls speak for it,
    and what was read from pods that are gone is let go."""
    loop, sizer = reporting_job(), RecordingSizer()
    now = time.time()
    stranger = copy.deepcopy(loop.mirror.pods["uid-1"])
    stranger["metadata"]["ownerReferences"] = [{**OWNER, "uid": "another-job-uid"}]
    loop.mirror.pods["uid-1"] = stranger
    text = build_step_report(time=now, replicas=2, nodes=1, local_batch=32, accumulation_steps=1, step_seconds=0.4,
                             sync_seconds=0.05, grad_sqr=1.0, grad_var=50.0, steps=10)
    for uid in ("uid-0", "uid-1"):
        body = copy.deepcopy(loop.mirror.pods[uid])
        body["metadata"]["annotations"][ANNOTATION_STEP_REPORT] = text
        loop.mirror.pods[uid] = body
    sizer.grow(loop.state, loop.mirror, now)
    (sized,) = sizer.jobs.values()
    assert set(sized.read) == set(sized.consumed) == {"uid-0"}, "the stranger's report is not read"
    tracked = next(t for t in loop.state.tracked.values() if t.elastic is not None)
    tracked.members = {key: uid for key, uid in tracked.members.items() if uid != "uid-0"}
    sizer.grow(loop.state, loop.mirror, now + 1)
    assert (sized.read, sized.consumed) == ({}, {}), "what was read from a pod no longer a member is let go"
