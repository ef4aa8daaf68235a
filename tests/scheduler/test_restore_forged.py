"""A restart believes what runs before what a record on a pod not bound yet claims, and a record's time only
within its pod's life. Without the admission policy a tenant writes the records of their own pods, bound or not:

* an unbound record naming the GPUs (or the guarantee) of a job that runs is judged against that job restored,
  whenever the record says it was written: before (found by a hostile review), jobs were restored one at a time
  in the order they were placed, a pod waiting since before the job was placed with such a record came first,
  found the GPUs free and was bound onto them, and the job that ran there could no longer be held;
* a ``createdAt`` in the future (9999-12-31) is believed as now: before, it was the restored job's start, and a
  borrowed job stayed inside its minimum run time for ever, safe from reclaim.

Without a cluster, as ``test_job_names``."""

from __future__ import annotations

import datetime
import json
from typing import Any

from kubecell.core.engine.job import JobClass, JobPhase
from kubecell.core.model import MILLI_PER_GPU, Allocation, Request
from kubecell.kube.names import ANNOTATION_ALLOCATION
from kubecell.kube.records import parse_record, record_for
from kubecell.scheduler.intake import Intake
from kubecell.scheduler.restore import Restorer
from kubecell.scheduler.restore_members import Member, placed_at
from kubecell.scheduler.teller import Teller
from kubecell.scheduler.tracking import Tracking
from tests.core.support import engine, make_nodes
from tests.scheduler.test_job_names import forge, node_of, pending
from tests.scheduler.test_shrink_pods import Loop

EARLY = "2020-01-01T00:00:00+00:00"
LATE = "2020-01-02T00:00:00+00:00"


def written_at(loop: Loop, uid: str, when: str) -> None:
    """Rewrite the record's ``createdAt`` (the pod's owner may, without the admission policy)."""
    annotations = loop.mirror.pods[uid]["metadata"]["annotations"]
    record = parse_record(annotations[ANNOTATION_ALLOCATION], pod=f"ns/{loop.mirror.pods[uid]['metadata']['name']}")
    annotations[ANNOTATION_ALLOCATION] = record.model_copy(
        update={"created_at": datetime.datetime.fromisoformat(when)}).to_annotation()


def restart(loop: Loop, nodes: int, vcs: dict[str, Any], now: float | None = None, **options: Any) -> Tracking:
    """A new scheduler process: a fresh engine and intake restored from the pods in the API server."""
    state = Tracking(engine(make_nodes(nodes), vcs, **options), loop.state.views)
    intake = Intake(loop.mirror, Teller(loop.actions, quiet=True),  # type: ignore[arg-type]
                    scheduler_name="kubecell", default_vc="b")
    restorer = Restorer(loop.mirror, loop.actions, intake, loop.binder.gate,  # type: ignore[arg-type]
                        frozenset({"kubecell"}))
    restorer.restore(state) if now is None else restorer.restore(state, now)
    state.engine.check_invariants()
    return state


def recorded(loop: Loop, uid: str) -> bool:
    return ANNOTATION_ALLOCATION in loop.mirror.pods[uid]["metadata"]["annotations"]


# ---------------------------------------------------------------------------------------- what runs comes first
def test_a_forged_unbound_record_on_the_gpus_of_a_running_job_is_not_carried_out_whenever_it_was_written() -> None:
    loop = Loop(engine(make_nodes(1), {"b": {"gpus": 8}}))
    loop.add(pending("victim", "uid-victim"))
    loop.cycle(1)
    assert node_of(loop, "uid-victim") == "n0"
    loop.mirror.pods["uid-victim"]["status"]["phase"] = "Running"
    written_at(loop, "uid-victim", LATE)
    # waiting since before the victim was placed; its record names the victim's node and GPUs, and its own ask,
    # VC and class, and says it was written first
    forge(loop, pending("attacker", "uid-attacker"), "ns/attacker@uid-atta", "n0")
    written_at(loop, "uid-attacker", EARLY)
    state = restart(loop, 1, {"b": {"gpus": 8}})
    victim = state.engine.jobs[state.pod_job["uid-victim"]]
    assert victim.phase == JobPhase.RUNNING
    assert victim.job_class == JobClass.GUARANTEED
    assert state.tracked[victim.name].bound == {"uid-victim"}
    assert node_of(loop, "uid-attacker") is None, "bound onto the GPUs of a pod that runs there"
    assert "uid-attacker" not in state.pod_job
    assert not recorded(loop, "uid-attacker")
    assert [a.name for a in state.engine.book.allocations.values()] == [f"{victim.name}/0"]


def test_a_forged_unbound_record_never_takes_the_guarantee_of_a_running_job() -> None:
    """On free GPUs, a record written 'first' claiming the VC's whole guarantee is judged after the job that runs
    in it: the engine grants it borrowed, not the guaranteed it claims, and it is decided again."""
    vcs = {"b": {"gpus": 8}}
    loop = Loop(engine(make_nodes(2), vcs))
    loop.add(pending("victim", "uid-victim"))
    loop.cycle(1)
    where = node_of(loop, "uid-victim")
    written_at(loop, "uid-victim", LATE)
    other = "n1" if where == "n0" else "n0"
    forge(loop, pending("attacker", "uid-attacker"), "ns/attacker@uid-atta", other)
    written_at(loop, "uid-attacker", EARLY)
    state = restart(loop, 2, vcs)
    assert state.engine.jobs[state.pod_job["uid-victim"]].job_class == JobClass.GUARANTEED
    assert node_of(loop, "uid-attacker") is None
    assert not recorded(loop, "uid-attacker")


GANG = {"kubecell.io/group": "g", "kubecell.io/group-size": "2"}


def test_a_gang_part_bound_binds_the_rest_as_recorded() -> None:
    """A scheduler killed between a gang's Bindings: the next binds the rest where it was recorded, as before."""
    loop = Loop(engine(make_nodes(2), {"b": {"gpus": 16}}))
    loop.add(pending("g-0", "uid-g-0", GANG), pending("g-1", "uid-g-1", GANG))
    loop.cycle(1)
    recorded_on = json.loads(loop.mirror.pods["uid-g-1"]["metadata"]["annotations"][ANNOTATION_ALLOCATION])["node"]
    del loop.mirror.pods["uid-g-1"]["spec"]["nodeName"]  # its Binding was never sent
    state = restart(loop, 2, {"b": {"gpus": 16}})
    job = state.pod_job["uid-g-0"]
    assert state.pod_job["uid-g-1"] == job
    assert state.tracked[job].bound == {"uid-g-0", "uid-g-1"}
    assert node_of(loop, "uid-g-1") == recorded_on
    assert state.engine.jobs[job].job_class == JobClass.GUARANTEED


def test_the_unbound_member_of_a_gang_part_bound_never_takes_the_gpus_of_a_job_placed_after_it() -> None:
    """The gang placed first, its member not bound yet re-recorded onto the GPUs of a job placed after it: that job
    runs there and is restored; the gang keeps its bound member and its other pod is decided again."""
    vcs = {"b": {"gpus": 24}}
    loop = Loop(engine(make_nodes(3), vcs))
    loop.add(pending("g-0", "uid-g-0", GANG), pending("g-1", "uid-g-1", GANG))
    loop.cycle(1)
    loop.add(pending("victim", "uid-victim"))
    loop.cycle(2)
    target = node_of(loop, "uid-victim")
    assert target is not None
    assert target not in {node_of(loop, "uid-g-0"), node_of(loop, "uid-g-1")}
    gang = loop.state.pod_job["uid-g-0"]
    body = loop.mirror.pods["uid-g-1"]
    del body["spec"]["nodeName"]
    allocation = Allocation(Request("forged", gpu_count=8, gpu_milli=MILLI_PER_GPU), target, tuple(range(8)),
                            MILLI_PER_GPU, 0)
    record = record_for(allocation, loop.state.views[target], pod="ns/g-1", pod_uid="uid-g-1", attempt=0, job=gang,
                        vc="b", job_class=JobClass.GUARANTEED, member=1, batch=2, scheduler="forged",
                        created_at=datetime.datetime.fromisoformat(EARLY))
    body["metadata"]["annotations"][ANNOTATION_ALLOCATION] = record.to_annotation()
    written_at(loop, "uid-g-0", EARLY)
    written_at(loop, "uid-victim", LATE)
    state = restart(loop, 3, vcs)
    victim = state.pod_job["uid-victim"]
    assert state.tracked[victim].bound == {"uid-victim"}
    assert node_of(loop, "uid-g-1") is None
    assert not recorded(loop, "uid-g-1")
    assert state.tracked[gang].bound == {"uid-g-0"}
    held = {(a.node, g) for a in state.engine.book.allocations.values() for g in a.gpu_indices}
    assert len(held) == sum(len(a.gpu_indices) for a in state.engine.book.allocations.values()) == 16


# ---------------------------------------------------------------------------------------- a record's time
def member(created: str, written: str) -> Member:
    body = pending("p", "uid-p")
    body["metadata"]["creationTimestamp"] = created
    loop = Loop(engine(make_nodes(1), {"b": {"gpus": 8}}))
    forge(loop, body, "ns/p@uid-p", "n0")
    written_at(loop, "uid-p", written)
    record = parse_record(body["metadata"]["annotations"][ANNOTATION_ALLOCATION], pod="ns/p")
    return Member(body, record, None)  # type: ignore[arg-type]  # placed_at reads no demand


def test_a_records_time_is_believed_within_its_pods_life_only() -> None:
    now = datetime.datetime(2026, 12, 3, tzinfo=datetime.UTC).timestamp()
    created = "2026-01-01T00:00:00Z"
    since = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC).timestamp()
    assert placed_at([member(created, "2026-06-01T00:00:00+00:00")], now) == \
        datetime.datetime(2026, 6, 1, tzinfo=datetime.UTC).timestamp()
    assert placed_at([member(created, "2020-01-01T00:00:00+00:00")], now) == since  # before its pod existed
    assert placed_at([member(created, "9999-12-31T00:00:00+00:00")], now) == now  # from the future


PLACED = "2030-01-01T00:00:00+00:00"
"""When the borrowed job was placed, and the scheduler's clock then."""


def borrowed_job(written: str) -> tuple[Loop, float]:
    """A VC's borrowed job, bound and running; its record's ``createdAt`` rewritten to ``written``."""
    vcs = {"a": {"gpus": 8}, "b": {"gpus": 8}}
    loop = Loop(engine(make_nodes(2), vcs, reclaim_min_runtime_seconds=600))
    t0 = datetime.datetime.fromisoformat(PLACED).timestamp()
    loop.add(pending("first", "uid-first"))
    loop.cycle(t0)
    loop.add(pending("borrower", "uid-borrower"))
    loop.cycle(t0)
    assert loop.state.engine.jobs[loop.state.pod_job["uid-borrower"]].job_class == JobClass.BORROWED
    written_at(loop, "uid-borrower", written)
    return loop, t0


def test_a_record_from_the_future_never_keeps_a_borrowed_job_inside_its_minimum_run_time() -> None:
    vcs = {"a": {"gpus": 8}, "b": {"gpus": 8}}
    for written in (PLACED, "9999-12-31T00:00:00+00:00"):  # as written, and edited by the pod's owner
        loop, t0 = borrowed_job(written)
        new = Loop(engine(make_nodes(2), vcs, reclaim_min_runtime_seconds=600))  # a new scheduler process
        new.mirror.pods.update(loop.mirror.pods)
        Restorer(new.mirror, new.actions, new.intake, new.binder.gate,  # type: ignore[arg-type]
                 frozenset({"kubecell"})).restore(new.state, t0 + 60)
        new.intake.reconcile(new.state, dict.fromkeys(new.mirror.pods), False, t0 + 60)
        job = new.state.engine.jobs[new.state.pod_job["uid-borrower"]]
        assert job.job_class == JobClass.BORROWED
        assert job.started_at is not None
        assert t0 <= job.started_at <= t0 + 60, written
        # the guaranteed VC's owner comes a day later, far past the minimum run time: its GPUs are reclaimed
        new.add(pending("owner", "uid-owner", {"kubecell.io/vc": "a"}))
        new.cycle(t0 + 86_400)
        assert [uid for uid, _ in new.actions.evicted] == ["uid-borrower"], written
