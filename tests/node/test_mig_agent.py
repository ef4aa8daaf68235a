"""MIG end to end: the node agent on a fake A100 node in MIG mode (seven 1g.5gb instances per GPU) behind a
fake kubelet, kubecell's scheduler on the real API server. The scheduler places instances, the device
plugin advertises and serves them by their MIG UUIDs from the records, and a pod that asks for a whole
GPU or a share is told that this node gives MIG instances only."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("grpc", reason="tests/node needs the `node` extra: pip install -e '.[dev,node]' (grpcio)")
pytest.importorskip("grpc_tools", reason="tests/node needs the `node` extra: pip install -e '.[dev,node]' "
                                         "(grpcio-tools)")

from kubecell.kube import pods
from kubecell.kube.names import ANNOTATION_ACK
from kubecell.kube.rest import Kube
from kubecell.testbed.control_plane import ControlPlaneState
from tests.cluster_fixtures import RunningScheduler
from tests.node.test_agent import Running, admit_when_bound, agent_node, view
from tests.support import wait_for


@pytest.fixture
def mig_node(kube: Kube) -> Iterator[Running]:
    with agent_node(kube, "a100-mig-1g", "mig") as running:
        yield running


def make(kube: Kube, namespace: str, name: str, node: str, limits: dict[str, str],
         annotations: dict[str, str]) -> None:
    kube.create(f"/api/v1/namespaces/{namespace}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace,
                                                        "annotations": annotations},
        "spec": {"schedulerName": "kubecell", "nodeSelector": {"kubecell.io/test-node": node},
                 "containers": [{"name": "main", "image": "x", "resources": {"limits": limits}}]}})


def get(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    return kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")


def waits_saying(kube: Kube, namespace: str, name: str, words: str) -> str | None:
    for condition in get(kube, namespace, name)["status"].get("conditions") or []:
        if condition["type"] == "PodScheduled" and words in condition.get("message", ""):
            return str(condition["message"])
    return None


def test_mig_instances_are_placed_served_and_kept_apart(
        testbed: ControlPlaneState, kube: Kube, namespace: str, mig_node: Running,
        start_scheduler: type[RunningScheduler]) -> None:
    r = mig_node
    instances = [m.uuid for device in r.backend.devices() for m in device.mig_instances]
    published = wait_for("the agent's MIG inventory",
                         lambda: view(kube, r.name) if view(kube, r.name).uuids == tuple(instances) else None)
    assert published.isolation == ("mig",)
    assert {gpu.model for gpu in published.node.gpus} == {"MIG-1g.5gb"}
    r.kubelet.wait_for(lambda: r.kubelet.capacity().get("kubecell.io/gpu") == 14, 10, "instances advertised")
    assert not r.kubelet.capacity().get("kubecell.io/gpu-milli")  # an instance is not time-shared

    start_scheduler(testbed)
    names = ["by-profile-0", "by-profile-1", "any-instance"]
    for name in names[:2]:
        make(kube, namespace, name, r.name, {"kubecell.io/gpu": "1"}, {"kubecell.io/gpu-models": "MIG-1g.5gb"})
    make(kube, namespace, names[2], r.name, {"kubecell.io/gpu": "1"}, {"kubecell.io/isolation": "mig"})
    make(kube, namespace, "whole-gpu", r.name, {"kubecell.io/gpu": "1"}, {})
    make(kube, namespace, "bigger", r.name, {"kubecell.io/gpu": "1"}, {"kubecell.io/gpu-models": "MIG-3g.20gb"})
    served = set()
    envs: dict[str, dict[str, str]] = {}
    for _ in names:  # the scheduler binds one at a time here, each after the agent served the one before
        name = wait_for("the next pod bound", lambda: next(
            (n for n in names if n not in envs and get(kube, namespace, n)["spec"].get("nodeName")), None))
        env = envs[name] = admit_when_bound(r, kube, namespace, name, {"kubecell.io/gpu": 1})
        pod = get(kube, namespace, name)
        record = pods.record_of(pod)
        assert record is not None
        assert record.isolation == "mig"
        (instance,) = (gpu.uuid for gpu in record.gpus)
        assert instance in instances
        assert env["NVIDIA_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"] == instance
        assert env["KUBECELL_ISOLATION"] == "mig"
        assert r.kubelet.assignments()[(namespace, name)]["main"]["kubecell.io/gpu"] == (instance,)
        assert pod["metadata"]["annotations"][ANNOTATION_ACK] == record.allocation_id
        served.add(instance)
    assert len(served) == 3
    assert wait_for("a whole-GPU pod told the node gives MIG instances only",
                    lambda: waits_saying(kube, namespace, "whole-gpu", "give GPUs only as MIG instances"))
    assert wait_for("a pod asking for a profile the node lacks told so",
                    lambda: waits_saying(kube, namespace, "bigger", "allows GPU models ['MIG-3g.20gb']"))
    assert not get(kube, namespace, "whole-gpu")["spec"].get("nodeName")
    assert not get(kube, namespace, "bigger")["spec"].get("nodeName")
