"""What the scheduler keeps of API objects: everything scheduling reads, and little else.

The scheduler mirrors every pod of the cluster; keeping whole objects (managed fields, commands,
environments, volumes, kubectl's last-applied copy) is what made 50,000 pods cost more than a GiB.
Trimming must never change a decision, so every demand, constraint and record reads the same from the
trimmed pod as from the whole one.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from kubecell.kube import pods
from kubecell.kube.constraints import allowed_nodes
from kubecell.kube.dialects import pod_demand
from kubecell.scheduler.cluster import trimmed_node
from tests.kube.dialect_support import HIVED, make_pod

BULK = {"managedFields": [{"manager": "kubectl", "operation": "Apply", "fieldsV1": {"f:spec": {"x" * 40: {}}}}] * 20}


def fat(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as a real cluster returns it: managed fields, kubectl's copy, commands, env, volumes."""
    pod = copy.deepcopy(pod)
    pod["metadata"].update(BULK, creationTimestamp="2026-11-23T12:00:00Z", resourceVersion="42")
    pod["metadata"]["annotations"][pods.LAST_APPLIED] = json.dumps(pod) * 3
    for container in pod["spec"]["containers"]:
        container.update(image="pytorch/pytorch:2.5", command=["python", "train.py"] * 10,
                         env=[{"name": f"V{i}", "value": "x" * 50} for i in range(40)],
                         volumeMounts=[{"name": "data", "mountPath": "/data"}])
    pod["spec"].update(volumes=[{"name": "data", "emptyDir": {}}], serviceAccountName="default",
                       affinity={**pod["spec"].get("affinity", {}), "podAntiAffinity": {"x": "y"}})
    pod["status"].update(conditions=[{"type": "PodScheduled", "status": "False", "message": "m" * 500}],
                         qosClass="Burstable")
    return pod


AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]}]}}}

CASES = {
    "kubecell share": make_pod({"kubecell.io/gpu-milli": "250"}, annotations={"kubecell.io/vc": "a"}),
    "hami": make_pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096", "nvidia.com/gpucores": "30"}),
    "hived gang": make_pod(annotations={HIVED: "virtualCluster: a\nleafCellNumber: 2\naffinityGroup: "
                                               "{name: g, members: [{podNumber: 2, leafCellNumber: 2}]}"}),
    "kubeshare": make_pod(labels={"sharedgpu/gpu_request": "0.5", "sharedgpu/gpu_limit": "1.0"}),
    "init and overhead": make_pod({"nvidia.com/gpu": "2"}, overhead={"cpu": "250m"},
                                  initContainers=[{"name": "side", "restartPolicy": "Always",
                                                   "resources": {"requests": {"cpu": "1"}}}]),
    "constrained": make_pod({"nvidia.com/gpu": "1"}, nodeSelector={"zone": "z1"}, affinity=AFFINITY,
                            tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}], priority=100),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_trimmed_pod_asks_for_exactly_what_the_whole_pod_asks_for(name: str) -> None:
    whole = fat(CASES[name])
    kept = pods.trimmed(whole)
    assert pod_demand(kept) == pod_demand(whole)
    nodes = {f"n{i}": {"metadata": {"name": f"n{i}", "labels": {"pool": "a" if i % 2 else "b", "zone": "z1"}},
                       "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}] if i % 3 else []}}
             for i in range(6)}
    assert allowed_nodes(kept, nodes) == allowed_nodes(whole, nodes)
    for read in (pods.key, pods.uid, pods.node_of, pods.phase, pods.is_done, pods.created, pods.record_of):
        assert read(kept) == read(whole)
    assert pods.LAST_APPLIED not in kept["metadata"]["annotations"]
    assert len(json.dumps(kept)) < len(json.dumps(whole)) / 5


def test_a_trimmed_node_keeps_what_inventory_and_constraints_read() -> None:
    node = {"metadata": {"name": "n1", "labels": {"a": "b"}, "annotations": {"kubecell.io/gpu-inventory": "{}",
                                                                           pods.LAST_APPLIED: "{...}"}, **BULK},
            "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]},
            "status": {"allocatable": {"cpu": "8"}, "conditions": [{"type": "Ready", "status": "True"}],
                       "images": [{"names": ["x" * 100], "sizeBytes": 1}] * 50}}
    kept = trimmed_node(node)
    assert kept["spec"] == node["spec"]
    assert kept["status"] == {"allocatable": {"cpu": "8"}, "conditions": [{"type": "Ready", "status": "True"}]}
    assert kept["metadata"] == {"name": "n1", "labels": {"a": "b"}, "annotations": {"kubecell.io/gpu-inventory": "{}"}}
