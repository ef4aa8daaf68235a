"""A job's name is its own, whatever its pods name their gang: without a cluster, a gang named after another pod's
job (``<pod>@<uid8>``) or another gang's (``<group>#<n>``) never takes that job's pods, place or records, at intake
or at a restart; a restored gang's name that carries no generation is restored all the same; and a job whose
name no allocation record holds is refused before it is placed (or evicts anyone for it)."""

from __future__ import annotations

import datetime
from typing import Any

from kubecell.core.engine.job import JobClass, JobPhase
from kubecell.core.model import MILLI_PER_GPU, Allocation, Request
from kubecell.kube.names import ANNOTATION_ALLOCATION
from kubecell.kube.records import record_for
from kubecell.scheduler.intake import Intake
from kubecell.scheduler.restore import Restorer
from kubecell.scheduler.teller import Teller
from kubecell.scheduler.tracking import Tracking
from tests.core.support import engine, make_nodes
from tests.scheduler.test_shrink_pods import Loop
from tests.scheduler.trust_support import pod_body

VICTIM_UID = "abcd1234-0000-0000-0000-000000000000"
NAMED_AFTER_VICTIM = {"kubecell.io/group": "victim@abcd1234", "kubecell.io/group-size": "1"}


def pending(name: str, uid: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    body = pod_body("ns", name, {"nvidia.com/gpu": "8"}, annotations=annotations)
    body["metadata"].update(uid=uid, creationTimestamp="1970-01-01T00:00:00Z")
    body["status"] = {"phase": "Pending"}
    return body


def forge(loop: Loop, body: dict[str, Any], job: str, node: str, *, member: int = 0) -> None:
    """A well-formed record of 8 whole GPUs on ``node`` written by the pod's owner (no admission policy)."""
    allocation = Allocation(Request("forged", gpu_count=8, gpu_milli=MILLI_PER_GPU), node, tuple(range(8)),
                            MILLI_PER_GPU, 0)
    meta = body["metadata"]
    record = record_for(allocation, loop.state.views[node], pod=f"ns/{meta['name']}", pod_uid=meta["uid"], attempt=0,
                        job=job, vc="b", job_class=JobClass.GUARANTEED, member=member, scheduler="forged",
                        created_at=datetime.datetime.now(datetime.UTC))
    meta["annotations"][ANNOTATION_ALLOCATION] = record.to_annotation()
    loop.mirror.pods[meta["uid"]] = body


def restart(loop: Loop) -> Tracking:
    """A new scheduler process: a fresh engine and intake restored from the pods in the API server."""
    state = Tracking(engine(make_nodes(2), {"b": {"gpus": 16}}), loop.state.views)
    intake = Intake(loop.mirror, Teller(loop.actions, quiet=True),  # type: ignore[arg-type]
                    scheduler_name="kubecell", default_vc="b")
    Restorer(loop.mirror, loop.actions, intake, loop.binder.gate,  # type: ignore[arg-type]
             frozenset({"kubecell"})).restore(state)
    return state


def node_of(loop: Loop, uid: str) -> str | None:
    return loop.mirror.pods[uid]["spec"].get("nodeName")  # type: ignore[no-any-return]


def test_a_gang_named_after_a_waiting_pods_job_never_takes_that_job_or_its_place() -> None:
    for attacker_first in (False, True):
        loop = Loop(engine(make_nodes(1), {"b": {"gpus": 8}}))
        loop.add(pending("blocker", "uid-blocker"))
        loop.cycle(1)
        if attacker_first:  # the gang takes the name the pod's job is formed under again
            loop.add(pending("attacker", "uid-attacker", NAMED_AFTER_VICTIM))
        loop.add(pending("victim", VICTIM_UID))
        loop.cycle(2)
        loop.intake.renew(loop.state, loop.state.pod_job[VICTIM_UID])  # a node changed in place: formed again
        loop.intake.reconcile(loop.state, loop.mirror.take_changed()[0], False, 3)
        if not attacker_first:  # the gang comes after and names the pod's new job
            loop.add(pending("attacker", "uid-attacker", NAMED_AFTER_VICTIM))
        victim_job, attacker_job = loop.state.pod_job[VICTIM_UID], loop.state.pod_job["uid-attacker"]
        assert victim_job != attacker_job
        assert loop.state.tracked[victim_job].pod_uids == [VICTIM_UID]
        assert loop.state.tracked[attacker_job].pod_uids == ["uid-attacker"]
        jobs = loop.state.engine.jobs
        assert jobs[victim_job].phase == jobs[attacker_job].phase == JobPhase.PENDING
        loop.mirror.pods["uid-blocker"]["status"]["phase"] = "Succeeded"
        loop.intake.reconcile(loop.state, {"uid-blocker": None}, False, 4)
        loop.cycle(5)  # one of them runs, as its own job
        bound = [uid for uid in (VICTIM_UID, "uid-attacker") if node_of(loop, uid)]
        assert len(bound) == 1
        for job, uid in ((victim_job, VICTIM_UID), (attacker_job, "uid-attacker")):
            assert set(loop.state.tracked[job].members.values()) <= {uid}
            assert (loop.state.engine.jobs[job].phase == JobPhase.RUNNING) == (uid in bound)


def test_a_forged_record_naming_another_pods_job_never_joins_it_at_a_restart() -> None:
    loop = Loop(engine(make_nodes(2), {"b": {"gpus": 16}}))
    loop.add(pending("victim", VICTIM_UID))
    loop.cycle(1)
    victim_job = loop.state.pod_job[VICTIM_UID]
    forge(loop, pending("attacker", "uid-attacker", NAMED_AFTER_VICTIM), victim_job, "n1", member=1)
    state = restart(loop)
    assert state.tracked[victim_job].pod_uids == [VICTIM_UID]
    assert state.engine.jobs[victim_job].spec.members == 1
    assert "uid-attacker" not in state.pod_job
    assert node_of(loop, "uid-attacker") is None
    assert ANNOTATION_ALLOCATION not in loop.mirror.pods["uid-attacker"]["metadata"]["annotations"]


def test_a_forged_record_naming_another_gangs_job_never_joins_it_at_a_restart() -> None:
    loop = Loop(engine(make_nodes(2), {"b": {"gpus": 16}}))
    elastic = {"kubecell.io/group": "a", "kubecell.io/group-size": "1", "kubecell.io/group-min": "1",
               "kubecell.io/group-max": "2"}  # room for a second member
    loop.add(pending("a-0", "uid-a-0", elastic))
    loop.cycle(1)
    gang_job = loop.state.pod_job["uid-a-0"]
    assert gang_job == "ns/a#1"
    forge(loop, pending("b-0", "uid-b-0", {"kubecell.io/group": "a#1", "kubecell.io/group-size": "1"}), gang_job,
          "n1", member=1)
    state = restart(loop)
    assert state.tracked[gang_job].pod_uids == ["uid-a-0"]
    assert "uid-b-0" not in state.pod_job
    assert node_of(loop, "uid-b-0") is None


def test_a_restored_gang_whose_name_has_no_generation_is_restored_whole() -> None:
    loop = Loop(engine(make_nodes(2), {"b": {"gpus": 16}}))
    forge(loop, pending("g-0", "uid-g-0", {"kubecell.io/group": "a#b", "kubecell.io/group-size": "1"}), "ns/a#b", "n1")
    state = restart(loop)
    assert state.tracked["ns/a#b"].bound == {"uid-g-0"}
    assert node_of(loop, "uid-g-0") == "n1"


def test_a_job_whose_name_no_record_holds_is_refused_before_it_evicts_anyone() -> None:
    long_namespace = "n" * 63  # a namespace and a pod or group name both at their longest Kubernetes names
    for notes, name in (({"kubecell.io/vc": "a"}, "p" * 253),
                              ({"kubecell.io/vc": "a", "kubecell.io/group": "g" * 253, "kubecell.io/group-size": "1"},
                               "gang-0")):
        loop = Loop(engine(make_nodes(2), {"a": {"gpus": 8}, "b": {"gpus": 8}}))
        borrowers = [pending(f"borrower-{i}", f"uid-borrower-{i}", {"kubecell.io/vc": "b"}) for i in range(2)]
        loop.add(*borrowers)
        loop.cycle(1)
        assert all(node_of(loop, f"uid-borrower-{i}") for i in range(2))
        body = pending(name, "uid-long", notes)
        body["metadata"]["namespace"] = long_namespace
        loop.add(body)
        for now in (2, 3):
            loop.cycle(now)
        assert loop.actions.evicted == []
        assert "uid-long" not in loop.state.pod_job
        assert node_of(loop, "uid-long") is None
