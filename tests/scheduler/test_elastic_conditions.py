"""The sizer's conditions on an ElasticJob: bad input only the sizer sees is kept in the job's status while it
lasts, not only told once in an Event. Covered here: a maxReplicas no VC could ever hold, nonsense step reports,
and workers that never report. Each condition is written only when it changes, and True only in place of a
False."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from kubecell.kube.names import ANNOTATION_STEP_REPORT
from kubecell.kube.rest import ApiError
from kubecell.kube.step_reports import build_step_report
from kubecell.scheduler.elastic import ElasticSizer
from kubecell.scheduler.elastic_conditions import (
    CONDITION_MAX_REACHABLE,
    CONDITION_STEP_REPORTS,
    MAX_CONDITIONS,
    ReportsSeen,
    Said,
    merged,
)
from tests.core.support import engine, make_nodes
from tests.scheduler.elastic_sizer_support import RecordingSizer, report_from_both, reporting_job, worker
from tests.scheduler.test_shrink_pods import Loop

WINDOW = 600.0  # the sizer's report_max_age_seconds


def controllers() -> list[dict[str, Any]]:
    return [{"type": "Accepted", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z",
             "reason": "Accepted", "message": "the spec can be run"},
            {"type": "Available", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z",
             "reason": "Running", "message": "2 workers ready"}]


T1, T2, T3 = "2026-12-02T10:00:01Z", "2026-12-02T10:00:02Z", "2026-12-02T10:00:03Z"
"""Write times: real ones, since a transition time the schema would refuse is not carried over."""
FALSE = Said(CONDITION_STEP_REPORTS, False, "UntrustedReport", "pod w-0: stepSeconds -1")
TRUE = Said(CONDITION_STEP_REPORTS, True, "Trusted", "taken")


def test_a_false_condition_is_added_beside_the_controllers_and_a_true_one_only_replaces_it() -> None:
    assert merged(controllers(), TRUE, T1) is None, "a job that reports well carries no condition of it"
    written = merged(controllers(), FALSE, T1)
    assert written is not None
    assert written[:2] == controllers(), "the controller's own are written back as they were"
    assert written[2] == {"type": CONDITION_STEP_REPORTS, "status": "False", "lastTransitionTime": T1,
                          "reason": "UntrustedReport", "message": "pod w-0: stepSeconds -1"}
    assert merged(written, Said(CONDITION_STEP_REPORTS, False, "UntrustedReport", "another pod"), T2) is None, \
        "a new message alone is not a change worth a write"
    stale = merged(written, Said(CONDITION_STEP_REPORTS, False, "StaleReport", "old"), T2)
    assert stale is not None
    assert (stale[2]["reason"], stale[2]["lastTransitionTime"]) == ("StaleReport", T1), \
        "a new reason with the same status keeps the transition time"
    back = merged(stale, TRUE, T3)
    assert back is not None
    assert (back[2]["status"], back[2]["lastTransitionTime"], len(back)) == ("True", T3, 3)


def test_a_full_list_of_conditions_is_not_made_longer_than_the_crd_allows() -> None:
    full = [{"type": f"Other{i}", "status": "True", "lastTransitionTime": "T0", "reason": "R", "message": ""}
            for i in range(MAX_CONDITIONS)]
    assert merged(full, FALSE, T1) is None
    assert merged("not a list", FALSE, T1) == [merged([], FALSE, T1)[0]]  # type: ignore[index]


def test_what_the_reports_condition_says_over_time() -> None:
    seen = ReportsSeen()
    assert seen.condition(None, 1000.0, WINDOW) is None, "not running: nothing to say"
    assert seen.condition(900.0, 1000.0, WINDOW) is None, "a new job's reports may still come"
    never = seen.condition(100.0, 1000.0, WINDOW)
    assert never is not None
    assert never.key == (False, "NoStepReports")
    assert "sized by capacity alone" in never.message
    seen.refused(1000.0, "UntrustedReport", "w-1", "stepSeconds nan")
    refused = seen.condition(100.0, 1200.0, WINDOW)
    assert refused is not None
    assert refused.key == (False, "UntrustedReport")
    assert "w-1: stepSeconds nan" in refused.message
    seen.taken = True
    still = seen.condition(100.0, 1500.0, WINDOW)
    assert still is not None
    assert still.key == (False, "UntrustedReport"), "a refusal within the window counts, reports taken or not"
    trusted = seen.condition(100.0, 1700.0, WINDOW)
    assert trusted is not None
    assert trusted.key == (True, "Trusted")


def nonsense_from_both(loop: Loop, at: float, step: float) -> None:
    """Both workers report a step time of ``step`` (NaN, negative, absurd), as a hand-written script would."""
    report = json.loads(build_step_report(time=at, replicas=2, nodes=1, local_batch=32, accumulation_steps=1,
                                          step_seconds=0.4, sync_seconds=0.05, grad_sqr=1.0, grad_var=50.0, steps=10))
    report["stepSeconds"] = step
    for uid in ("uid-0", "uid-1"):
        body = copy.deepcopy(loop.mirror.pods[uid])
        body["metadata"]["annotations"][ANNOTATION_STEP_REPORT] = json.dumps(report)
        loop.mirror.pods[uid] = body


def test_nonsense_step_reports_are_kept_in_a_condition_until_trusted_ones_come() -> None:
    loop, sizer = reporting_job(), RecordingSizer()
    start = 10_000.0
    loop.cycle(start)
    for step, now in ((float("nan"), start + 10), (-1.0, start + 20), (1e30, start + 30)):
        nonsense_from_both(loop, now, step)
        sizer.grow(loop.state, loop.mirror, now)
    assert sizer.condition(CONDITION_STEP_REPORTS) == ("False", "UntrustedReport")
    assert len(sizer.status_patches) == 2, "NaN is malformed, -1 untrusted: a new reason; 1e30 changed nothing"
    assert sorted(reason for reason, _ in sizer.events) == ["MalformedReport"] * 2 + ["UntrustedReport"] * 2, \
        "each pod told once per kind of problem in an Event"
    now = start + 40
    report_from_both(loop, now, replicas=2, local=32, step=0.4, var=50.0)
    sizer.grow(loop.state, loop.mirror, now)
    assert sizer.condition(CONDITION_STEP_REPORTS) == ("False", "UntrustedReport"), "refused within the window"
    (sized,) = sizer.jobs.values()
    assert sized.model is not None
    assert sized.model.measurements(), "the trusted report is learned all the same"
    now = start + 30 + WINDOW + 1
    report_from_both(loop, now, replicas=2, local=32, step=0.4, var=50.0)
    sizer.grow(loop.state, loop.mirror, now)
    assert sizer.condition(CONDITION_STEP_REPORTS) == ("True", "Trusted")
    assert len(sizer.status_patches) == 3


def test_workers_that_never_report_get_a_condition_once_and_one_that_reports_well_none() -> None:
    loop, sizer = reporting_job(), RecordingSizer()
    start = 10_000.0
    loop.cycle(start)  # (the job started at 1)
    sizer.grow(loop.state, loop.mirror, start)
    sizer.grow(loop.state, loop.mirror, start + 5)
    assert sizer.condition(CONDITION_STEP_REPORTS) == ("False", "NoStepReports")
    assert len(sizer.status_patches) == 1
    assert not sizer.events, "nothing happened: it is a state, not an event"

    loop, sizer = reporting_job(), RecordingSizer()
    for now in (start, start + WINDOW, start + 2 * WINDOW):
        report_from_both(loop, now, replicas=2, local=32, step=0.4, var=50.0)
        sizer.grow(loop.state, loop.mirror, now)
    assert sizer.conditions == [], "a job that reports well carries no condition"
    assert sizer.status_patches == [], "and costs no status write"


def test_a_max_no_vc_could_ever_hold_is_kept_in_a_condition() -> None:
    eng = engine(make_nodes(1), {"a": {"gpus": 4}, "b": {"gpus": 4}}, resize_min_interval_seconds=0)
    loop, sizer = Loop(eng), RecordingSizer()
    loop.add(worker(0, size=1))  # 4 GPUs a worker, at most 4 workers: 16 GPUs on a cluster of 8
    loop.cycle(1)
    sizer.grow(loop.state, loop.mirror, 2)
    assert sizer.condition(CONDITION_MAX_REACHABLE) == ("False", "MaxReplicasUnreachable")
    assert [reason for reason, _ in sizer.events] == ["MaxReplicasUnreachable"]
    sizer.grow(loop.state, loop.mirror, 3)
    assert len(sizer.status_patches) == 1
    assert len(sizer.events) == 1


class Forbidden:
    """An API server that refuses every status patch (RBAC without ``deploy/elastic/rbac.yaml``'s status rule)."""

    def __init__(self) -> None:
        self.patches = 0

    def patch(self, path: str, body: Any) -> Any:
        self.patches += 1
        raise ApiError(403, "Forbidden", "elasticjobs.kubecell.io/status is forbidden", method="PATCH", path=path)


@pytest.mark.parametrize("first", [10_000.0])
def test_a_refused_condition_is_told_once_and_tried_again_a_minute_later(first: float) -> None:
    loop, sizer = reporting_job(), RecordingSizer()
    refused = Forbidden()
    sizer.kube = refused  # type: ignore[assignment]
    sizer._patch_as_read = ElasticSizer._patch_as_read.__get__(sizer)  # type: ignore[method-assign]  # the real one
    loop.cycle(first)
    for now in (first, first + 1, first + 30):
        sizer.grow(loop.state, loop.mirror, now)
    assert refused.patches == 1, "not tried again at every pass"
    assert [reason for reason, _ in sizer.events] == ["ResizeRefused"]
    assert "StepReports of ElasticJob ns/bert" in sizer.events[0][1]
    sizer.grow(loop.state, loop.mirror, first + 61)
    assert refused.patches == 2
    assert len(sizer.events) == 1, "told once"
