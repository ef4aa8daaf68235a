"""The Kubernetes driver follows a shrink exactly, without a cluster: the pods of the released members (and only
those) are evicted with the engine's reason, the others keep their members, the released pods never hold a
member again, the engine grows the job only into pods the driver has, and a pod that replaces an evicted one
joins the running job and is where the job grows back."""

from __future__ import annotations

import copy
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubecell.core.engine.engine import Engine
from kubecell.core.engine.job import JobPhase, JobSpec, MemberGroup, member_index
from kubecell.core.model import MILLI_PER_GPU, Request
from kubecell.kube import elasticjobs as ej
from kubecell.kube import pods
from kubecell.kube.dialects import pod_demand
from kubecell.kube.inventory import NodeView
from kubecell.kube.names import ANNOTATION_ALLOCATION
from kubecell.kube.records import AllocationRecord
from kubecell.scheduler.binder import Binder
from kubecell.scheduler.cluster import Mirror
from kubecell.scheduler.elastic_ranks import rank_elastic_members
from kubecell.scheduler.intake import Intake
from kubecell.scheduler.jobs import Tracked, groups_for
from kubecell.scheduler.teller import Teller
from kubecell.scheduler.tracking import Tracking
from tests.core.support import engine, make_nodes
from tests.scheduler.trust_support import pod_body


class FakeActions:
    """The writes the binder makes, applied to the mirror as the API server would (no cluster)."""

    def __init__(self, mirror: Mirror) -> None:
        self.mirror = mirror
        self.evicted: list[tuple[str, str]] = []

    def write_record(self, pod: dict[str, Any], record: AllocationRecord) -> None:
        self.mirror.pods[pods.uid(pod)]["metadata"]["annotations"][ANNOTATION_ALLOCATION] = record.to_annotation()

    def clear_record(self, pod: dict[str, Any]) -> None:
        self.mirror.pods[pods.uid(pod)]["metadata"]["annotations"].pop(ANNOTATION_ALLOCATION, None)

    def bind(self, pod: dict[str, Any], node: str, record: AllocationRecord | None = None) -> None:
        if record is not None:
            self.write_record(pod, record)
        self.mirror.pods[pods.uid(pod)]["spec"]["nodeName"] = node

    def bound_to(self, pod: dict[str, Any], node: str) -> bool:
        return bool(self.mirror.pods[pods.uid(pod)]["spec"].get("nodeName") == node)

    def evict(self, pod: dict[str, Any], reason: str) -> None:
        self.evicted.append((pods.uid(pod), reason))
        self.mirror.pods[pods.uid(pod)]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"

    def event(self, *args: Any, **kwargs: Any) -> None:
        pass

    def unschedulable(self, *args: Any, **kwargs: Any) -> None:
        pass


GANG = {"kubecell.io/vc": "b", "kubecell.io/group": "el", "kubecell.io/group-size": "8", "kubecell.io/group-min": "4"}


def gang_pod(name: str) -> dict[str, Any]:
    body = pod_body("ns", name, {"nvidia.com/gpu": "4"}, annotations=GANG)
    body["metadata"].update(uid=f"uid-{name}", creationTimestamp="1970-01-01T00:00:00Z")
    body["status"] = {"phase": "Pending"}
    return body


class Loop:
    """The scheduler loop's steps that matter here: reconcile, cycle, carry out (``Scheduler.cycle``)."""

    def __init__(self, eng: Engine) -> None:
        self.mirror = Mirror()
        self.actions = FakeActions(self.mirror)
        views = {node.name: NodeView(node.name, node, source="inventory",
                                     uuids=tuple(f"GPU-{node.name}-{i}" for i in range(node.gpu_count)))
                 for node in eng.book.nodes}
        self.state = Tracking(eng, views)
        self.intake = Intake(self.mirror, Teller(self.actions, quiet=True),  # type: ignore[arg-type]
                             scheduler_name="kubecell", default_vc="b")
        self.pool = ThreadPoolExecutor(4)
        self.binder = Binder(self.actions, self.mirror, self.pool, "kubecell",  # type: ignore[arg-type]
                             lambda _: None, scheduled_events=False)

    def add(self, *bodies: dict[str, Any]) -> None:
        for body in bodies:
            self.mirror.pods[pods.uid(body)] = copy.deepcopy(body)
        self.intake.reconcile(self.state, dict.fromkeys(pods.uid(b) for b in bodies), False, 0.0)

    def gone(self, uid: str) -> None:
        del self.mirror.pods[uid]
        self.intake.reconcile(self.state, {uid: None}, False, 0.0)

    def cycle(self, now: float) -> set[str]:
        engine = self.state.engine
        result = engine.schedule(now)
        victims: set[str] = set()
        for cut in result.shrunk:
            victims |= self.binder.shrink(self.state, cut, f"shrunk by kubecell: {cut.reason}")
        for job in result.evicted:
            victims |= self.binder.evict(self.state, job, "preempted")
        self.binder.start(self.state, [*result.started, *result.grown], victims)
        self.binder.wait_in_flight(5)
        for job in list(engine.running.values()):
            if job.phase == JobPhase.RESERVED:
                engine.confirm(job.name, now)
        engine.check_invariants()
        return victims

    def member_pods(self, name: str) -> dict[int, str]:
        return dict(self.state.tracked[name].members)


def test_a_shrink_evicts_exactly_the_released_pods_and_growth_binds_only_pods_the_job_has() -> None:
    eng = engine(make_nodes(4), {"a": {"gpus": 16}, "b": {"gpus": 8}}, resize_min_interval_seconds=0)
    loop = Loop(eng)
    loop.add(*(gang_pod(f"el-{i}") for i in range(8)))
    loop.cycle(1)
    (name,) = list(eng.running)
    job = eng.jobs[name]
    assert job.size == 8
    before = loop.member_pods(name)
    assert sorted(before) == list(range(8))
    guaranteed = pod_body("ns", "g", {"nvidia.com/gpu": "8"}, annotations={"kubecell.io/vc": "a"})
    guaranteed["metadata"].update(uid="uid-g", creationTimestamp="1970-01-01T00:00:00Z")
    guaranteed["status"] = {"phase": "Pending"}
    loop.add(guaranteed)
    victims = loop.cycle(100)  # one 8-GPU member of a: the two newest 4-GPU members go
    released = {before[index] for index in (6, 7)}
    assert victims == released
    assert {uid for uid, _ in loop.actions.evicted} == released
    assert all("shrunk by kubecell: reclaimed for guaranteed job ns/g" in why for _, why in loop.actions.evicted)
    tracked = loop.state.tracked[name]
    assert loop.member_pods(name) == {i: before[i] for i in range(6)}
    assert tracked.released == released
    assert not released & set(tracked.free_pods())
    assert job.spare == (0,)  # no pod left to grow into
    for uid in released:
        loop.gone(uid)  # the kubelet finishes the eviction
    eng.finish(next(n for n in eng.running if n.startswith("ns/g")), 150)
    loop.cycle(150)
    assert job.size == 6, "no pod to bind: the job must not grow"

    loop.add(gang_pod("el-8"))  # a controller replaces an evicted pod: it joins the running job
    assert loop.state.pod_job["uid-el-8"] == name
    assert job.spare == (1,)
    loop.cycle(200)
    assert job.size == 7
    grown = set(loop.member_pods(name).items()) - set(before.items())
    assert [uid for _, uid in grown] == ["uid-el-8"]
    assert loop.mirror.pods["uid-el-8"]["spec"]["nodeName"]
    record = json.loads(loop.mirror.pods["uid-el-8"]["metadata"]["annotations"][ANNOTATION_ALLOCATION])
    assert record["member"] == next(index for index, _ in grown)
    loop.pool.shutdown()


JOB_UID = "0f8d3a52-6c1e-4b7a-9d2f-1a2b3c4d5e6f"


def worker(index: int, uid: str | None = None) -> dict[str, Any]:
    """Worker ``index`` of ElasticJob ns/bert as its controller makes it (owner, index label, elastic gang)."""
    body = pod_body("ns", f"bert-worker-{index}", {"nvidia.com/gpu": "1"}, annotations={
        "kubecell.io/vc": "b", "kubecell.io/group": "bert", "kubecell.io/group-size": "8",
        "kubecell.io/group-min": "1", "kubecell.io/group-max": "8"})
    body["metadata"].update(uid=uid or f"uid-w{index}", creationTimestamp="1970-01-01T00:00:00Z",
                            labels={ej.LABEL_INDEX: str(index)},
                            ownerReferences=[{"apiVersion": ej.API_VERSION, "kind": ej.KIND, "name": "bert",
                                              "uid": JOB_UID, "controller": True}])
    body["status"] = {"phase": "Pending"}
    return body


def test_a_shrink_takes_the_highest_workers_even_after_one_was_replaced() -> None:
    """Worker 0 was lost and replaced: its replacement is the job's newest member. A shrink of two took it (the
    engine gives up its newest members), and the controller, which keeps workers 0..target-1, replaced it again
    and removed worker 7 too. Ranked by worker index, the shrink takes workers 7 and 6."""
    eng = engine(make_nodes(1), {"a": {"gpus": 4}, "b": {"gpus": 4}}, "quota", resize_min_interval_seconds=0)
    loop = Loop(eng)
    blocker = pod_body("ns", "blocker", {"nvidia.com/gpu": "4"}, annotations={"kubecell.io/vc": "b"})
    blocker["metadata"].update(uid="uid-blocker", creationTimestamp="1970-01-01T00:00:00Z")
    blocker["status"] = {"phase": "Pending"}
    loop.add(blocker)
    loop.cycle(0)  # b's guarantee is in use: the job borrows, and grows into what the blocker leaves
    loop.add(*(worker(i) for i in range(8)))
    loop.cycle(1)
    eng.finish(next(n for n in eng.running if "blocker" in n), 1.5)
    loop.gone("uid-blocker")
    loop.cycle(1.5)
    (name,) = list(eng.running)
    job = eng.jobs[name]
    assert job.size == 8
    assert loop.state.tracked[name].elastic is not None
    loop.gone("uid-w0")  # the cluster took worker 0 (not a shrink): the job runs on with 7
    assert job.size == 7
    loop.add(worker(0, uid="uid-w0-again"))  # its controller replaces it; the job grows into it
    loop.cycle(2)
    assert job.size == 8
    newest = member_index(job.running_members[-1])
    assert loop.member_pods(name)[newest] == "uid-w0-again", "the replacement is the newest member"

    claim = pod_body("ns", "g", {"nvidia.com/gpu": "2"}, annotations={"kubecell.io/vc": "a"})
    claim["metadata"].update(uid="uid-g", creationTimestamp="1970-01-01T00:00:00Z")
    claim["status"] = {"phase": "Pending"}
    loop.add(claim)
    rank_elastic_members(loop.state, loop.mirror)  # what the scheduler does before each cycle
    assert loop.cycle(100) == {"uid-w7", "uid-w6"}
    assert "uid-w0-again" in loop.member_pods(name).values()
    loop.pool.shutdown()


def test_groups_for_names_the_member_groups_a_pod_could_join() -> None:
    worker = Request("w", gpu_count=8, gpu_milli=MILLI_PER_GPU)
    launcher = Request("l", cpu_milli=4000)
    spec = JobSpec.gang("x", "a", [MemberGroup("launcher", launcher, 1, 1), MemberGroup("worker", worker, 4, 2)])
    body = pod_body("ns", "p", {"nvidia.com/gpu": "8"})
    body["metadata"]["uid"] = "u"
    assert groups_for(spec, pod_demand(body)) == [1]
    other = pod_body("ns", "q", {"nvidia.com/gpu": "4"})
    other["metadata"]["uid"] = "v"
    assert groups_for(spec, pod_demand(other)) == []


def test_released_pods_are_never_free_and_spare_counts_each_group() -> None:
    tracked = Tracked("x", "ns/x", ["a", "b", "c", "d"], members={0: "a"}, part_of={"a": 0, "b": 1, "c": 1, "d": 1})
    tracked.released.add("c")
    assert tracked.free_pods() == ["b", "d"]
    worker = Request("w", gpu_count=8, gpu_milli=MILLI_PER_GPU)
    spec = JobSpec.gang("x", "a", [MemberGroup("l", Request("l", cpu_milli=1000), 1, 1),
                                   MemberGroup("w", worker, 3, 1)])
    assert tracked.spare(spec) == (0, 2)
    assert tracked.live_pods(1) == 2
    assert tracked.live_pods() == 3
