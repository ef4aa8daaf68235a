"""A gang's generations at a restart. Intake forms a gang's next job (``ns/a#2``) while an earlier one runs when
more pods of its group come, so records of one gang may name several generations: each restores as its own job,
made of its own recorded pods. A record naming a job kubecell never names (the bare ``ns/a``, ``#0``, ``#01``, a
non-ASCII digit) beside a well-formed one is distrusted (a bound pod runs on where it runs, alone and as
opportunistic work, reclaimed first; an unbound one is rolled back). Without a cluster, as ``test_job_names``."""

from __future__ import annotations

from typing import Any

import pytest

from kubecell.core.engine.job import JobClass
from kubecell.kube.names import ANNOTATION_ALLOCATION
from kubecell.scheduler.intake import Intake
from kubecell.scheduler.restore import Restorer
from kubecell.scheduler.teller import Teller
from kubecell.scheduler.tracking import Tracking
from tests.core.support import engine, make_nodes
from tests.scheduler.test_job_names import forge, node_of, pending
from tests.scheduler.test_shrink_pods import Loop

GANG = {"kubecell.io/group": "a", "kubecell.io/group-size": "1"}
LATER = "2026-11-23T12:00:00Z"
"""The forged pod is created after the gang's own (the API server sets ``creationTimestamp``)."""


def restart(loop: Loop) -> tuple[Tracking, Intake]:
    """A new scheduler process restored from the pods in the API server; its intake holds the warnings told."""
    state = Tracking(engine(make_nodes(2), {"b": {"gpus": 16}}), loop.state.views)
    intake = Intake(loop.mirror, Teller(loop.actions, quiet=True),  # type: ignore[arg-type]
                    scheduler_name="kubecell", default_vc="b")
    Restorer(loop.mirror, loop.actions, intake, loop.binder.gate,  # type: ignore[arg-type]
             frozenset({"kubecell"})).restore(state)
    return state, intake


def running_gang() -> Loop:
    loop = Loop(engine(make_nodes(2), {"b": {"gpus": 16}}))
    loop.add(pending("a-0", "uid-a-0", GANG))
    loop.cycle(1)
    assert loop.state.pod_job["uid-a-0"] == "ns/a#1"
    assert node_of(loop, "uid-a-0") is not None
    return loop


def forged_pod(loop: Loop, job: str, *, bound: bool) -> dict[str, Any]:
    body = pending("a-f", "uid-a-f", GANG)
    body["metadata"]["creationTimestamp"] = LATER
    free = "n1" if node_of(loop, "uid-a-0") == "n0" else "n0"
    forge(loop, body, job, free)
    if bound:
        loop.mirror.pods["uid-a-f"]["spec"]["nodeName"] = free
    return loop.mirror.pods["uid-a-f"]


@pytest.mark.parametrize("forged", ["ns/a", "ns/a#0", "ns/a#01", "ns/a#\u0667"])
@pytest.mark.parametrize("bound", [True, False])
def test_a_record_naming_a_job_kubecell_never_names_beside_the_gangs_is_distrusted(forged: str, bound: bool) -> None:
    """Before: each job name became a job, both made of every pod of the gang, and the last one restored took
    the gang's pods in ``pod_job`` (``ns/a#1``'s pod was filed under the forged job): when the forged pod ended,
    its job untracked the real pod, whose job then never finished and held its GPUs for good."""
    loop = running_gang()
    forged_pod(loop, forged, bound=bound)
    state, intake = restart(loop)
    assert {name for name in state.engine.jobs if name.startswith("ns/a#")} == {"ns/a#1"}, "one job for the gang"
    assert state.tracked["ns/a#1"].members == {0: "uid-a-0"}, "only the gang's own pod holds GPUs"
    assert state.tracked["ns/a#1"].bound == {"uid-a-0"}
    assert state.pod_job["uid-a-0"] == "ns/a#1"
    told = intake.record_warnings.get("uid-a-f", "")
    assert repr(forged) in told, told
    annotations = loop.mirror.pods["uid-a-f"]["metadata"]["annotations"]
    if bound:  # it runs on where it runs, alone and as opportunistic work, reclaimed first (its record stays)
        assert ANNOTATION_ALLOCATION in annotations
        assert state.pod_job["uid-a-f"] == "ns/a-f@uid-a-f"
        assert state.engine.jobs["ns/a-f@uid-a-f"].job_class == JobClass.OPPORTUNISTIC
    else:  # rolled back, never bound from the record: a pod of the gang without a record, as any other
        assert ANNOTATION_ALLOCATION not in annotations
        assert node_of(loop, "uid-a-f") is None
    assert intake.generations["ns/a"] == 1, "the next job formed for the gang is #2"


def test_two_generations_of_a_gang_restore_as_two_jobs_each_of_its_own_pods() -> None:
    """A second pod of a one-pod gang forms ``ns/a#2`` while ``ns/a#1`` runs. After a restart both run, each with
    its own pod and no Warning."""
    loop = running_gang()
    loop.add(pending("a-1", "uid-a-1", GANG))
    loop.cycle(2)
    assert loop.state.pod_job["uid-a-1"] == "ns/a#2"
    assert node_of(loop, "uid-a-1") is not None
    state, intake = restart(loop)
    assert set(state.engine.jobs) == {"ns/a#1", "ns/a#2"}
    assert state.pod_job == {"uid-a-0": "ns/a#1", "uid-a-1": "ns/a#2"}
    assert state.tracked["ns/a#1"].members == {0: "uid-a-0"}
    assert state.tracked["ns/a#2"].members == {0: "uid-a-1"}
    assert intake.record_warnings == {}
    assert intake.generations["ns/a"] == 2, "the next job formed for the gang is #3"
    assert {state.engine.jobs[name].phase.name for name in state.engine.jobs} == {"RUNNING"}


def test_a_gang_restored_under_one_name_is_untouched() -> None:
    loop = running_gang()
    state, intake = restart(loop)
    assert set(state.engine.jobs) == {"ns/a#1"}
    assert state.pod_job == {"uid-a-0": "ns/a#1"}
    assert intake.record_warnings == {}
