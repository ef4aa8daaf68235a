"""``kubecell scheduler`` on the real testbed: placements through the engine, records before bindings,
gangs bound all or nothing, restarts that rebuild from the records, bad requests told to their pods."""

from __future__ import annotations

import datetime
import json
import time
from functools import partial
from typing import Any

import pytest

from kubecell.core.engine.job import JobClass
from kubecell.core.model import Allocation, Request
from kubecell.kube.actions import Actions
from kubecell.kube.inventory import node_view
from kubecell.kube.names import ANNOTATION_ALLOCATION
from kubecell.kube.records import AllocationRecord, parse_record, record_for
from kubecell.kube.rest import ApiError, Kube
from kubecell.scheduler.options import SchedulerOptions
from kubecell.testbed.control_plane import ControlPlaneState
from tests.cluster_fixtures import RunningScheduler
from tests.support import wait_for


def make_pod(kube: Kube, namespace: str, name: str, limits: dict[str, str],
             annotations: dict[str, str] | None = None) -> dict[str, Any]:
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}},
            "spec": {"schedulerName": "kubecell",
                     "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}]}}
    return kube.create(f"/api/v1/namespaces/{namespace}/pods", body)


def get_pod(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    return kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")


def bound(kube: Kube, namespace: str, *names: str) -> list[dict[str, Any]] | None:
    found = [get_pod(kube, namespace, name) for name in names]
    return found if all(pod["spec"].get("nodeName") for pod in found) else None


def gpus_of(pod: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(node, GPU index, milli) the pod's record names; the record must be valid for this pod."""
    meta = pod["metadata"]
    record = parse_record(meta["annotations"][ANNOTATION_ALLOCATION], pod=f"{meta['namespace']}/{meta['name']}",
                          uid=meta["uid"])
    assert record.node == pod["spec"]["nodeName"]
    return [(record.node, gpu.index, gpu.milli) for gpu in record.gpus]


def test_fractional_pods_are_packed_onto_shared_gpus(testbed: ControlPlaneState, kube: Kube, namespace: str,
                                                     start_scheduler: type[RunningScheduler]) -> None:
    start_scheduler(testbed)
    names = [f"half-{i}" for i in range(4)]
    for name in names:
        make_pod(kube, namespace, name, {"kubecell.io/gpu-milli": "500"})
    placed = wait_for("four half-GPU pods to be bound", lambda: bound(kube, namespace, *names))
    slots = [slot for pod in placed for slot in gpus_of(pod)]
    assert {milli for _, _, milli in slots} == {500}
    assert len({(node, gpu) for node, gpu, _ in slots}) == 2, f"4 halves should fill 2 GPUs, got {slots}"


def test_a_multi_gpu_pod_lands_inside_one_nvlink_group(testbed: ControlPlaneState, kube: Kube, namespace: str,
                                                       start_scheduler: type[RunningScheduler]) -> None:
    start_scheduler(testbed)
    make_pod(kube, namespace, "quad", {"nvidia.com/gpu": "4"}, {"kubecell.io/topology": "nvlink"})
    (pod,) = wait_for("the pod to be bound", lambda: bound(kube, namespace, "quad"))
    indices = sorted(gpu for _, gpu, _ in gpus_of(pod))
    assert indices in ([0, 1, 2, 3], [4, 5, 6, 7])  # Philly nodes: two NVLink quads


def test_a_gang_is_bound_all_or_nothing(testbed: ControlPlaneState, kube: Kube, namespace: str,
                                        start_scheduler: type[RunningScheduler]) -> None:
    start_scheduler(testbed)
    gang = {"kubecell.io/group": "train", "kubecell.io/group-size": "3"}
    for i in range(2):
        make_pod(kube, namespace, f"worker-{i}", {"nvidia.com/gpu": "8"}, gang)
    time.sleep(2.0)
    assert not any(get_pod(kube, namespace, f"worker-{i}")["spec"].get("nodeName") for i in range(2))
    condition = wait_for("the waiting reason", lambda: next(
        (c for c in get_pod(kube, namespace, "worker-0")["status"].get("conditions") or []
         if c["type"] == "PodScheduled"), None))
    assert condition["status"] == "False"
    make_pod(kube, namespace, "worker-2", {"nvidia.com/gpu": "8"}, gang)
    placed = wait_for("the whole gang to be bound", lambda: bound(kube, namespace, "worker-0", "worker-1", "worker-2"))
    nodes = [pod["spec"]["nodeName"] for pod in placed]
    assert len(set(nodes)) == 3
    assert all(len(gpus_of(pod)) == 8 for pod in placed)


def test_a_restarted_scheduler_rebuilds_from_the_records(testbed: ControlPlaneState, kube: Kube, namespace: str,
                                                         start_scheduler: type[RunningScheduler]) -> None:
    first = start_scheduler(testbed)
    for i in range(3):
        make_pod(kube, namespace, f"quarter-{i}", {"kubecell.io/gpu-milli": "250"})
    placed = wait_for("the pods to be bound", lambda: bound(kube, namespace, *(f"quarter-{i}" for i in range(3))))
    before = sorted(slot for pod in placed for slot in gpus_of(pod))
    first.close()
    second = start_scheduler(testbed)
    engine = second.scheduler.engine
    assert engine is not None
    held = sorted((a.node, g, a.gpu_milli) for a in engine.book.allocations.values()
                  if a.name.startswith(f"{namespace}/") for g in a.gpu_indices)
    assert held == before
    engine.check_invariants()
    make_pod(kube, namespace, "one-more", {"kubecell.io/gpu-milli": "250"})
    (pod,) = wait_for("the new pod to be bound", lambda: bound(kube, namespace, "one-more"))
    assert gpus_of(pod)[0][:2] == before[0][:2], "the fourth quarter fills the same GPU, never a held slot twice"


def _record(pod: dict[str, Any], node_obj: dict[str, Any], gpus: tuple[int, ...], member: int, batch: int,
            job: str) -> str:
    view = node_view(node_obj)
    allocation = Allocation(Request(f"{job}/{member}", gpu_count=len(gpus), gpu_milli=1000),
                            node_obj["metadata"]["name"], gpus, 1000, 0)
    record = record_for(allocation, view, pod=f"{pod['metadata']['namespace']}/{pod['metadata']['name']}",
                        pod_uid=pod["metadata"]["uid"], attempt=0, job=job, vc="default",
                        job_class=JobClass.GUARANTEED, member=member, scheduler="crashed-instance",
                        created_at=datetime.datetime.now(datetime.UTC), batch=batch)
    return record.to_annotation()


def test_a_gang_interrupted_between_records_and_bindings_is_completed_or_rolled_back(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    """What a scheduler killed mid-bind leaves behind, written by hand, then a scheduler started on it."""
    gang = {"kubecell.io/group": "g", "kubecell.io/group-size": "2"}
    nodes = list(kube.get("/api/v1/nodes")["items"])[-4:]
    pods = {name: make_pod(kube, namespace, name, {"nvidia.com/gpu": "8"},
                           {**gang, "kubecell.io/group": group})
            for name, group in (("done-0", "done"), ("done-1", "done"), ("half-0", "half"), ("half-1", "half"))}
    # "done": both records written (the commit point), one binding made; "half": one record of two written.
    job_done, job_half = f"{namespace}/done#1", f"{namespace}/half#1"  # as the crashed instance named them
    for name, node, member, job in (("done-0", nodes[0], 0, job_done), ("done-1", nodes[1], 1, job_done),
                                    ("half-0", nodes[2], 0, job_half)):
        pod = pods[name]
        text = _record(pod, node, tuple(range(8)), member, 2, job)
        kube.patch(f"/api/v1/namespaces/{namespace}/pods/{name}",
                   {"metadata": {"annotations": {ANNOTATION_ALLOCATION: text}}})
    kube.create(f"/api/v1/namespaces/{namespace}/pods/done-0/binding",
                {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "done-0", "namespace": namespace},
                 "target": {"apiVersion": "v1", "kind": "Node", "name": nodes[0]["metadata"]["name"]}})
    start_scheduler(testbed)
    done = wait_for("the committed gang to be bound the rest of the way", lambda: bound(kube, namespace,
                                                                                       "done-0", "done-1"))
    assert [pod["spec"]["nodeName"] for pod in done] == [n["metadata"]["name"] for n in nodes[:2]]
    assert {json.loads(pod["metadata"]["annotations"][ANNOTATION_ALLOCATION])["scheduler"] for pod in done} == {
        "crashed-instance"}, "a committed decision is completed as recorded, not decided again"
    half = wait_for("the uncommitted gang to be placed afresh", lambda: bound(kube, namespace, "half-0", "half-1"))
    for pod in half:
        record = json.loads(pod["metadata"]["annotations"][ANNOTATION_ALLOCATION])
        assert record["scheduler"] == "kubecell", "the half-written decision must be rolled back and made again"
        assert record["batch"] == 2


def test_an_impossible_request_is_told_to_its_pod_and_blocks_nobody(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    start_scheduler(testbed)
    make_pod(kube, namespace, "too-much", {"kubecell.io/gpu-milli": "1500"})
    make_pod(kube, namespace, "fine", {"kubecell.io/gpu-milli": "100"})
    wait_for("the valid pod to be bound", lambda: bound(kube, namespace, "fine"))

    def told() -> list[str]:
        events = kube.get(f"/api/v1/namespaces/{namespace}/events")["items"]
        return [e["message"] for e in events if e["involvedObject"]["name"] == "too-much" and e["type"] == "Warning"]

    messages = wait_for("a Warning Event on the bad pod", told)
    assert any("kubecell.io/gpu-milli 1500" in message for message in messages)
    assert not get_pod(kube, namespace, "too-much")["spec"].get("nodeName")


def test_gpus_held_by_pods_of_another_scheduler_are_never_given_out(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    node = kube.get("/api/v1/nodes")["items"][5]["metadata"]["name"]
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "foreign", "namespace": namespace},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox",
                                                       "resources": {"limits": {"nvidia.com/gpu": "6"}}}]}}
    kube.create(f"/api/v1/namespaces/{namespace}/pods", body)
    running = start_scheduler(testbed)
    engine = running.scheduler.engine
    assert engine is not None
    held = [a for a in engine.book.allocations.values() if a.name.startswith(f"external:{namespace}/foreign")]
    assert [(a.node, len(a.gpu_indices)) for a in held] == [(node, 6)]
    engine.check_invariants()


def gone(kube: Kube, namespace: str, name: str) -> bool:
    return not any(p["metadata"]["name"] == name for p in kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"])


DIALECTS: dict[str, list[tuple[str, dict[str, str], dict[str, str]]]] = {
    # (spelling, container limits, pod labels)
    "half a GPU": [("kubecell", {"kubecell.io/gpu-milli": "500"}, {}),
                   ("hami", {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "50"}, {}),
                   ("kubeshare", {}, {"sharedgpu/gpu_request": "0.5"})],
    "two whole GPUs": [("kubecell", {"kubecell.io/gpu": "2"}, {}), ("nvidia", {"nvidia.com/gpu": "2"}, {}),
                       ("kubeshare", {}, {"sharedgpu/gpu_request": "2", "sharedgpu/gpu_limit": "2"})],
    "4 GiB of GPU memory": [("kubecell", {"kubecell.io/gpu-memory": "4096"}, {}),
                            ("aliyun", {"aliyun.com/gpu-mem": "4"}, {}),
                            ("hami", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096"}, {}),
                            ("kubeshare", {}, {"sharedgpu/gpu_mem": str(4 * 2**30)})],
}


def test_the_same_request_in_each_dialect_lands_identically(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    """Each spelling is placed alone on the same cluster state by a stateless policy (best fit), so
    the same ask must get the same node, GPUs and share whatever dialect wrote it."""
    start_scheduler(testbed, SchedulerOptions(placement="bestfit"))
    for ask, spellings in DIALECTS.items():
        landed: dict[str, tuple[str, list[tuple[int, int, int]]]] = {}
        for dialect, limits, labels in spellings:
            name = f"{dialect}-{len(landed)}-{abs(hash(ask)) % 1000}"
            body = {"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "namespace": namespace, "labels": labels},
                    "spec": {"schedulerName": "kubecell",
                             "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}]}}
            kube.create(f"/api/v1/namespaces/{namespace}/pods", body)
            (pod,) = wait_for(f"{ask} written for {dialect} to be bound", partial(bound, kube, namespace, name))
            meta = pod["metadata"]
            record = parse_record(meta["annotations"][ANNOTATION_ALLOCATION], pod=f"{namespace}/{name}",
                                  uid=meta["uid"])
            landed[dialect] = (record.node, [(g.index, g.milli, g.memory_mib) for g in record.gpus])
            kube.delete(f"/api/v1/namespaces/{namespace}/pods/{name}", gracePeriodSeconds=0)
            wait_for(f"{name} to be gone", partial(gone, kube, namespace, name))
        assert len(set(map(str, landed.values()))) == 1, f"{ask}: {landed}"


def test_node_selector_affinity_and_tolerations_decide_where_pods_go(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    """One node is labelled and tainted, as clusters set aside GPU pools: a pod that selects it and
    tolerates the taint lands there, a pod that selects it without the toleration waits and is told why
    in kube-scheduler's words, and a pod whose affinity excludes the node lands elsewhere."""
    node = kube.get("/api/v1/nodes")["items"][0]["metadata"]["name"]
    kube.patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": {"pool": "special"}},
                                         "spec": {"taints": [{"key": "dedicated", "value": "ml",
                                                              "effect": "NoSchedule"}]}})
    try:
        start_scheduler(testbed)
        toleration = [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]
        away = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["special"]}]}]}}}
        for name, extra in (("chosen", {"nodeSelector": {"pool": "special"}, "tolerations": toleration}),
                            ("intolerant", {"nodeSelector": {"pool": "special"}}),
                            ("elsewhere", {"affinity": away, "tolerations": toleration})):
            body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
                    "spec": {"schedulerName": "kubecell", **extra,
                             "containers": [{"name": "main", "image": "busybox",
                                             "resources": {"limits": {"kubecell.io/gpu-milli": "100"}}}]}}
            kube.create(f"/api/v1/namespaces/{namespace}/pods", body)
        chosen, elsewhere = wait_for("the pods that may run to be bound",
                                     lambda: bound(kube, namespace, "chosen", "elsewhere"))
        assert chosen["spec"]["nodeName"] == node
        assert elsewhere["spec"]["nodeName"] != node

        def told() -> list[str]:
            return [e["message"] for e in kube.get(f"/api/v1/namespaces/{namespace}/events")["items"]
                    if e["involvedObject"]["name"] == "intolerant" and e["reason"] == "FailedScheduling"]

        messages = wait_for("why the intolerant pod waits", told)
        assert any("1 node(s) had untolerated taint {dedicated: ml}" in m for m in messages), messages
        assert not get_pod(kube, namespace, "intolerant")["spec"].get("nodeName")
    finally:
        kube.patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": {"pool": None}}, "spec": {"taints": None}})


GANG_OF_TWO = {"kubecell.io/group": "pair", "kubecell.io/group-size": "2"}


@pytest.mark.parametrize("gang", [False, True], ids=["alone", "gang"])
def test_a_bind_lost_to_an_unavailable_api_server_is_made_after_a_rebuild(
        gang: bool, testbed: ControlPlaneState, kube: Kube, namespace: str,
        start_scheduler: type[RunningScheduler], monkeypatch: pytest.MonkeyPatch) -> None:
    """Every bind attempt for one pod meets a dead API server: the scheduler must not forget the pod (a
    running job whose pod is never bound) but rebuild and bind it: a pod alone is placed again (its
    Binding carried its record, so nothing was written), a gang member from the record already on it."""
    failures = {"left": 6}  # more than one retry() round of 5 attempts
    real_bind = Actions.bind

    def flaky_bind(self: Actions, pod: dict[str, Any], node: str, record: AllocationRecord | None = None) -> None:
        if failures["left"] > 0 and pod["metadata"]["name"] == "unlucky":
            failures["left"] -= 1
            raise ApiError(0, "Unavailable", "connection refused (injected)")
        real_bind(self, pod, node, record)

    monkeypatch.setattr(Actions, "bind", flaky_bind)
    monkeypatch.setattr("kubecell.kube.actions.time.sleep", lambda _seconds: None)
    start_scheduler(testbed)
    names = ["unlucky", "partner"] if gang else ["unlucky"]
    for name in names:
        make_pod(kube, namespace, name, {"kubecell.io/gpu-milli": "200"}, GANG_OF_TWO if gang else None)
    pods = wait_for("the pods to be bound once the API server answers", lambda: bound(kube, namespace, *names))
    assert failures["left"] == 0
    assert all(gpus_of(pod)[0][2] == 200 for pod in pods)


@pytest.mark.parametrize("gang", [False, True], ids=["alone", "gang"])
def test_a_pod_deleted_while_it_is_being_bound_frees_its_share(
        gang: bool, testbed: ControlPlaneState, kube: Kube, namespace: str,
        start_scheduler: type[RunningScheduler], monkeypatch: pytest.MonkeyPatch) -> None:
    """The pod is deleted between the decision and its Binding (the Binding then finds no pod): the
    scheduler must not count the share as taken once the pod is gone, nor stop placing others."""
    real_bind = Actions.bind

    def deleting_bind(self: Actions, pod: dict[str, Any], node: str, record: AllocationRecord | None = None) -> None:
        if pod["metadata"]["name"] == "doomed":
            kube.delete(f"/api/v1/namespaces/{namespace}/pods/doomed", gracePeriodSeconds=0)
        real_bind(self, pod, node, record)

    monkeypatch.setattr(Actions, "bind", deleting_bind)
    running = start_scheduler(testbed)
    engine = running.scheduler.engine
    assert engine is not None
    before = engine.book.allocated_gpu_milli  # what earlier tests' pods still hold
    names = ["doomed", "survivor"] if gang else ["doomed"]
    for name in names:
        make_pod(kube, namespace, name, {"kubecell.io/gpu-milli": "300"}, GANG_OF_TWO if gang else None)
    wait_for("the doomed pod to be gone", partial(gone, kube, namespace, "doomed"))
    if gang:  # the member whose pod exists is bound; the gang holds its shares while any member runs
        wait_for("the surviving member to be bound", lambda: bound(kube, namespace, "survivor"))
        kube.delete(f"/api/v1/namespaces/{namespace}/pods/survivor", gracePeriodSeconds=0)

    def allocated() -> float | None:
        now = running.scheduler.engine
        return 1.0 if now is not None and now.book.allocated_gpu_milli == before else None

    wait_for("every share to be free again", allocated)
    make_pod(kube, namespace, "next", {"kubecell.io/gpu-milli": "300"})
    (pod,) = wait_for("the next pod to be bound", lambda: bound(kube, namespace, "next"))
    assert gpus_of(pod)[0][2] == 300

    def announced() -> list[str]:
        return [e["message"] for e in kube.get(f"/api/v1/namespaces/{namespace}/events")["items"]
                if e["involvedObject"]["name"] == "next" and e["reason"] == "Scheduled"]

    (message,) = wait_for("the Scheduled event, in kube-scheduler's words", announced)
    assert message == f"Successfully assigned {namespace}/next to {pod['spec']['nodeName']}"


def test_a_pod_naming_a_podgroup_nobody_created_is_told_so_and_waits(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    start_scheduler(testbed)
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "orphan", "namespace": namespace,
                         "labels": {"scheduling.x-k8s.io/pod-group": "nowhere"}},
            "spec": {"schedulerName": "kubecell",
                     "containers": [{"name": "main", "image": "busybox",
                                     "resources": {"limits": {"kubecell.io/gpu-milli": "100"}}}]}}
    kube.create(f"/api/v1/namespaces/{namespace}/pods", body)

    def warned() -> list[str]:
        return [e["message"] for e in kube.get(f"/api/v1/namespaces/{namespace}/events")["items"]
                if e["involvedObject"]["name"] == "orphan" and e["type"] == "Warning"]

    (message,) = wait_for("a Warning naming the missing PodGroup", warned)
    assert message == f"waiting for PodGroup {namespace}/nowhere"
    assert not get_pod(kube, namespace, "orphan")["spec"].get("nodeName")
