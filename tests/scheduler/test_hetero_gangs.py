"""Gangs whose members differ, on the real testbed: each pod is recorded with its own ask (issue case 5), a
gang whose members disagree on its size is refused naming both values (case 6), a heterogeneous gang is
bound all or nothing, and Volcano tasks and KAI subgroups give each member group its own minimum."""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from kubecell.kube.rest import Kube
from kubecell.testbed.control_plane import ControlPlaneState
from tests.cluster_fixtures import RunningScheduler
from tests.scheduler.deploy_support import kubectl
from tests.scheduler.trust_support import create_pod, pod, scheduled_condition, warnings_of
from tests.support import wait_for


def bound_node(kube: Kube, namespace: str, name: str) -> str:
    return str(pod(kube, namespace, name)["spec"].get("nodeName") or "")


def gpus_recorded(kube: Kube, namespace: str, name: str) -> list[tuple[int, int]]:
    """(GPU index, milli) of the pod's record, which must name the node the pod runs on."""
    found = pod(kube, namespace, name)
    record = json.loads(found["metadata"]["annotations"]["kubecell.io/allocation"])
    assert record["node"] == found["spec"]["nodeName"]
    return [(gpu["index"], gpu["milli"]) for gpu in record["gpus"]]


def gang(name: str, size: int, **extra: str) -> dict[str, str]:
    return {"kubecell.io/group": name, "kubecell.io/group-size": str(size), **extra}


def test_each_member_is_recorded_with_its_own_ask(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    """A PyTorch-style gang: a 1-GPU master, two 8-GPU workers and a launcher without GPUs; and a gang of a
    share beside a whole GPU. Each pod used to be recorded with the first member's shape."""
    start_scheduler(testbed)
    notes = gang("train", 4)
    create_pod(kube, namespace, "launcher", {"cpu": "2"}, annotations=notes)
    create_pod(kube, namespace, "master", {"nvidia.com/gpu": "1"}, annotations=notes)
    for i in range(2):
        create_pod(kube, namespace, f"worker-{i}", {"nvidia.com/gpu": "8"}, annotations=notes)
    mixed = gang("mixed", 2)
    create_pod(kube, namespace, "share", {"kubecell.io/gpu-milli": "300"}, annotations=mixed)
    create_pod(kube, namespace, "whole", {"kubecell.io/gpu": "1"}, annotations=mixed)
    names = ["launcher", "master", "worker-0", "worker-1", "share", "whole"]
    wait_for("every member bound", lambda: all(bound_node(kube, namespace, n) for n in names))
    assert gpus_recorded(kube, namespace, "launcher") == []
    assert [milli for _, milli in gpus_recorded(kube, namespace, "master")] == [1000]
    for i in range(2):
        assert len(gpus_recorded(kube, namespace, f"worker-{i}")) == 8
    assert [milli for _, milli in gpus_recorded(kube, namespace, "share")] == [300]
    assert [milli for _, milli in gpus_recorded(kube, namespace, "whole")] == [1000]
    whole = (bound_node(kube, namespace, "whole"), gpus_recorded(kube, namespace, "whole")[0][0])
    share = (bound_node(kube, namespace, "share"), gpus_recorded(kube, namespace, "share")[0][0])
    assert whole != share, "a whole GPU is never shared"


def test_a_heterogeneous_gang_is_bound_all_or_nothing(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    """Its launcher would fit anywhere; its two 8-GPU workers may only use one 8-GPU node: nothing is bound."""
    start_scheduler(testbed)
    notes = gang("too-big", 3)
    create_pod(kube, namespace, "launcher", {"cpu": "1"}, annotations=notes)
    for i in range(2):
        create_pod(kube, namespace, f"worker-{i}", {"nvidia.com/gpu": "8"},
                   annotations={**notes, "kubecell.io/gpu-models": "P40"},
                   spec={"nodeSelector": {"kubernetes.io/hostname": "philly-040"}})
    wait_for("the gang told why it waits", lambda: (scheduled_condition(kube, namespace, "launcher") or {}).get(
        "message"))
    assert not any(bound_node(kube, namespace, n) for n in ("launcher", "worker-0", "worker-1"))


def test_members_that_disagree_on_the_size_are_refused_naming_both(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    """Issue case 6: two pods said 2, one said 3; two were bound and the third waited forever. Whichever comes
    first, no pod waits for a gang that will never form: every pod that disagrees is told both values."""
    start_scheduler(testbed)
    create_pod(kube, namespace, "c", {"nvidia.com/gpu": "1"}, annotations=gang("g", 3))
    create_pod(kube, namespace, "a", {"nvidia.com/gpu": "1"}, annotations=gang("g", 2))
    create_pod(kube, namespace, "b", {"nvidia.com/gpu": "1"}, annotations=gang("g", 2))

    def told(name: str) -> list[str]:
        return [m for m in warnings_of(kube, namespace, name, "FailedScheduling")
                if "disagree on its headcount" in m and "says 2" in m and "says 3" in m]

    for name in ("a", "b", "c"):
        wait_for(f"{name} told both values", partial(told, name))
    assert not any(bound_node(kube, namespace, n) for n in ("a", "b", "c"))
    kube.delete(f"/api/v1/namespaces/{namespace}/pods/c", gracePeriodSeconds=0)
    wait_for("the agreeing pair bound once the odd pod is gone",
             lambda: bound_node(kube, namespace, "a") and bound_node(kube, namespace, "b"))
    create_pod(kube, namespace, "late", {"nvidia.com/gpu": "1"}, annotations=gang("g", 3))
    wait_for("a late pod disagreeing with the running gang told both values", partial(told, "late"))


def test_members_that_disagree_on_the_vc_are_refused(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    start_scheduler(testbed)
    create_pod(kube, namespace, "a", {"nvidia.com/gpu": "1"}, annotations=gang("v", 2))
    create_pod(kube, namespace, "b", {"nvidia.com/gpu": "1"}, annotations={**gang("v", 2), "kubecell.io/vc": "other"})
    messages = wait_for("the pods told", lambda: warnings_of(kube, namespace, "a", "FailedScheduling"))
    assert any("virtual cluster" in m for m in messages), messages


def test_a_restarted_scheduler_restores_a_heterogeneous_gang_as_it_ran(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    first = start_scheduler(testbed)
    notes = gang("job", 3)
    create_pod(kube, namespace, "launcher", {"cpu": "1"}, annotations=notes)
    for i in range(2):
        create_pod(kube, namespace, f"worker-{i}", {"nvidia.com/gpu": "4"}, annotations=notes)
    names = ["launcher", "worker-0", "worker-1"]
    wait_for("the gang bound", lambda: all(bound_node(kube, namespace, n) for n in names))
    before = {n: (bound_node(kube, namespace, n), gpus_recorded(kube, namespace, n)) for n in names}
    first.close()
    second = start_scheduler(testbed)
    engine = second.scheduler.engine
    assert engine is not None
    (job,) = [j for j in engine.running.values() if j.name.startswith(f"{namespace}/job#")]
    assert job.spec.heterogeneous
    assert sorted(len(a.gpu_indices) for a in engine.queries.allocations_of(job.name)) == [0, 4, 4]
    held = {(a.node, a.gpu_indices) for a in engine.queries.allocations_of(job.name)}
    assert held == {(node, tuple(i for i, _ in gpus)) for node, gpus in before.values()}
    engine.check_invariants()


VOLCANO_CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: podgroups.scheduling.volcano.sh}
spec:
  group: scheduling.volcano.sh
  scope: Namespaced
  names: {kind: PodGroup, plural: podgroups, singular: podgroup}
  versions:
    - name: v1beta1
      served: true
      storage: true
      schema:
        openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
"""
KAI_CRD = VOLCANO_CRD.replace("scheduling.volcano.sh", "scheduling.run.ai").replace("v1beta1", "v2alpha2")


@pytest.fixture(scope="module")
def podgroup_crds(testbed: ControlPlaneState, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """PodGroup CRDs of Volcano and KAI-Scheduler (a schema that keeps any field, enough to store objects);
    removed at the end of the module."""
    path = tmp_path_factory.mktemp("crds") / "podgroups.yaml"
    path.write_text(VOLCANO_CRD + "---" + KAI_CRD)
    kubectl(testbed, "apply", "-f", str(path))
    for crd in ("podgroups.scheduling.volcano.sh", "podgroups.scheduling.run.ai"):
        kubectl(testbed, "wait", "--for=condition=Established", "--timeout=60s", f"customresourcedefinition/{crd}")
    yield
    kubectl(testbed, "delete", "-f", str(path), "--wait=false", check=False)


def podgroup(kube: Kube, api: str, namespace: str, name: str, spec: dict[str, Any]) -> None:
    kube.create(f"/apis/{api}/namespaces/{namespace}/podgroups",
                {"apiVersion": api, "kind": "PodGroup", "metadata": {"name": name, "namespace": namespace},
                 "spec": spec})


def test_volcano_tasks_are_member_groups_with_their_own_minimum(
        testbed: ControlPlaneState, kube: Kube, namespace: str, podgroup_crds: None,
        start_scheduler: type[RunningScheduler]) -> None:
    """A Volcano job: 1 ps (CPU) and 3 workers (8 GPUs) with minMember 3 and minTaskMember {ps: 1, worker: 2}.
    Only two nodes are left to its workers, so it starts with its ps and two workers, never without its ps."""
    podgroup(kube, "scheduling.volcano.sh/v1beta1", namespace, "vj",
             {"minMember": 3, "minTaskMember": {"ps": 1, "worker": 2}})
    first = start_scheduler(testbed)
    pinned = {"nodeSelector": {"kubecell.io/rack": "philly-rack-4"}}
    hogs = [f"hog-{i}" for i in range(6)]
    for name in hogs:  # philly-rack-4 has 8 nodes: 6 taken leaves 2 for the workers
        create_pod(kube, namespace, name, {"nvidia.com/gpu": "8"}, spec=pinned)
    wait_for("the hogs placed", lambda: all(bound_node(kube, namespace, n) for n in hogs))
    # Volcano's job controller creates every pod of a job: a PodGroup's gang is the pods that exist when its
    # minimum does, so the pods are created while no scheduler looks, and the next one sees them all.
    first.close()
    notes = {"scheduling.k8s.io/group-name": "vj"}
    create_pod(kube, namespace, "ps-0", {"cpu": "1"}, annotations={**notes, "volcano.sh/task-spec": "ps"})
    for i in range(3):
        create_pod(kube, namespace, f"worker-{i}", {"nvidia.com/gpu": "8"},
                   annotations={**notes, "volcano.sh/task-spec": "worker"}, spec=pinned)
    start_scheduler(testbed)
    wait_for("the ps and two workers bound", lambda: bound_node(kube, namespace, "ps-0") and sum(
        1 for i in range(3) if bound_node(kube, namespace, f"worker-{i}")) == 2)
    for name in hogs[:1]:
        kube.delete(f"/api/v1/namespaces/{namespace}/pods/{name}", gracePeriodSeconds=0)
    wait_for("the third worker grown into the freed node",
             lambda: all(bound_node(kube, namespace, f"worker-{i}") for i in range(3)))


def test_kai_subgroups_are_member_groups(
        testbed: ControlPlaneState, kube: Kube, namespace: str, podgroup_crds: None,
        start_scheduler: type[RunningScheduler]) -> None:
    podgroup(kube, "scheduling.run.ai/v2alpha2", namespace, "kj",
             {"minMember": 3, "subGroups": [{"name": "leader", "minMember": 1}, {"name": "workers", "minMember": 2}]})
    start_scheduler(testbed)
    annotations = {"pod-group-name": "kj"}
    create_pod(kube, namespace, "leader", {"nvidia.com/gpu": "1"}, annotations=annotations,
               labels={"kai.scheduler/subgroup-name": "leader"})
    for i in range(2):
        create_pod(kube, namespace, f"w-{i}", {"nvidia.com/gpu": "4"}, annotations=annotations,
                   labels={"kai.scheduler/subgroup-name": "workers"})
    names = ["leader", "w-0", "w-1"]
    wait_for("the KAI gang bound", lambda: all(bound_node(kube, namespace, n) for n in names))
    assert [m for _, m in gpus_recorded(kube, namespace, "leader")] == [1000]
    assert all(len(gpus_recorded(kube, namespace, f"w-{i}")) == 4 for i in range(2))


def test_a_hostile_podgroup_is_told_and_blocks_nobody(
        testbed: ControlPlaneState, kube: Kube, namespace: str, podgroup_crds: None,
        start_scheduler: type[RunningScheduler]) -> None:
    """PodGroups are written by tenants too: absurd numbers and wrong types are refused, nothing else stops."""
    podgroup(kube, "scheduling.volcano.sh/v1beta1", namespace, "evil",
             {"minMember": 3, "minTaskMember": {"worker": "9" * 5000, "ps": -4}})
    podgroup(kube, "scheduling.run.ai/v2alpha2", namespace, "evil-kai",
             {"minMember": 2, "subGroups": "not a list"})
    running = start_scheduler(testbed)
    create_pod(kube, namespace, "v", {"nvidia.com/gpu": "1"},
               annotations={"scheduling.k8s.io/group-name": "evil", "volcano.sh/task-spec": "worker"})
    create_pod(kube, namespace, "k", {"nvidia.com/gpu": "1"}, annotations={"pod-group-name": "evil-kai"},
               labels={"kai.scheduler/subgroup-name": "workers"})
    create_pod(kube, namespace, "ok", {"nvidia.com/gpu": "1"})
    wait_for("the ordinary pod bound", lambda: bound_node(kube, namespace, "ok"))
    for name in ("v", "k"):
        wait_for(f"{name} told", partial(warnings_of, kube, namespace, name))
        assert not bound_node(kube, namespace, name)
    assert running.thread.is_alive()


def test_member_groups_of_every_kind_of_difference_are_ordered_without_error() -> None:
    """Pods of one gang that differ only in a model filter or a topology constraint (None beside a value)."""
    from kubecell.kube.dialects import pod_demand
    from kubecell.scheduler.jobs import gang_spec

    def member(name: str, annotations: dict[str, str]) -> tuple[dict[str, Any], Any]:
        body = {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                             "annotations": {**gang("g", 3), **annotations}},
                "spec": {"schedulerName": "kubecell", "containers": [
                    {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}
        return body, pod_demand(body)

    members = [member("a", {}), member("b", {"kubecell.io/gpu-models": "P40"}),
               member("c", {"kubecell.io/topology": "nvlink"})]
    spec, parts = gang_spec("ns/g#1", members, 3, 3, "default", 0.0)
    assert len(spec.member_groups) == 3
    assert sorted(parts.values()) == [0, 1, 2]
