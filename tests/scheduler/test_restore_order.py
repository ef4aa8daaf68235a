"""The order a restart restores jobs in: when they were placed, not their names. Where a VC's guarantee shrank
while the scheduler was away, the restored jobs no longer all fit in it, and the first restored keep its
standing (``GUARANTEED``) while the rest are ``BORROWED``. Before, jobs were restored in name order, so a job
named ``a-...`` took the guarantee from an older ``b-...``. Without a cluster, as ``test_job_names``."""

from __future__ import annotations

import datetime

from kubecell.core.engine.job import JobClass
from kubecell.kube.names import ANNOTATION_ALLOCATION
from kubecell.kube.records import parse_record
from kubecell.scheduler.intake import Intake
from kubecell.scheduler.restore import Restorer
from kubecell.scheduler.teller import Teller
from kubecell.scheduler.tracking import Tracking
from tests.core.support import engine, make_nodes
from tests.scheduler.test_job_names import pending
from tests.scheduler.test_shrink_pods import Loop


def placed_at(loop: Loop, uid: str, when: str) -> None:
    """Rewrite the record's ``createdAt``: the time the scheduler placed the pod."""
    annotations = loop.mirror.pods[uid]["metadata"]["annotations"]
    record = parse_record(annotations[ANNOTATION_ALLOCATION], pod=f"ns/{loop.mirror.pods[uid]['metadata']['name']}")
    moved = record.model_copy(update={"created_at": datetime.datetime.fromisoformat(when)})
    annotations[ANNOTATION_ALLOCATION] = moved.to_annotation()


def classes_after_restart(loop: Loop, guarantee: int) -> dict[str, str]:
    state = Tracking(engine(make_nodes(2), {"b": {"gpus": guarantee}}), loop.state.views)
    intake = Intake(loop.mirror, Teller(loop.actions, quiet=True),  # type: ignore[arg-type]
                    scheduler_name="kubecell", default_vc="b")
    Restorer(loop.mirror, loop.actions, intake, loop.binder.gate,  # type: ignore[arg-type]
             frozenset({"kubecell"})).restore(state)
    return {uid: str(state.engine.jobs[name].job_class) for uid, name in state.pod_job.items()}


def test_where_a_guarantee_shrank_the_job_placed_first_keeps_it() -> None:
    loop = Loop(engine(make_nodes(2), {"b": {"gpus": 16}}))
    loop.add(pending("a-late", "uid-a-late"), pending("b-early", "uid-b-early"))
    loop.cycle(1)
    for uid in ("uid-a-late", "uid-b-early"):
        assert loop.mirror.pods[uid]["spec"].get("nodeName"), "both run within the 16 GPUs guaranteed"
    placed_at(loop, "uid-b-early", "2026-12-02T10:00:00+00:00")
    placed_at(loop, "uid-a-late", "2026-12-02T12:00:00+00:00")
    classes = classes_after_restart(loop, guarantee=8)
    assert classes == {"uid-b-early": str(JobClass.GUARANTEED), "uid-a-late": str(JobClass.BORROWED)}
