"""Node objects for the testbed, generated from the cluster descriptions the simulator uses.

A node carries what a real GPU node would show the scheduler: CPU, memory and pod capacity, the GPU
resources (``nvidia.com/gpu`` as NVIDIA's device plugin advertises it, and kubecell's share resources),
GPU Feature Discovery labels, rack and zone labels, and the node agent's inventory annotation. The
scheduler reads them back through :mod:`kubecell.kube.inventory`, so a testbed node and a real node
take the same path.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from kubecell.core.errors import InvalidInputError
from kubecell.core.model import MILLI_PER_GPU, Node, make_node
from kubecell.inputs.cluster import load_cluster
from kubecell.kube.clock import rfc3339
from kubecell.kube.inventory import inventory_of
from kubecell.kube.names import (
    ANNOTATION_INVENTORY,
    GFD_COUNT,
    GFD_MEMORY,
    GFD_PRODUCT,
    LABEL_RACK,
    LABEL_ZONE,
    NVIDIA_GPU,
    RESOURCE_GPU,
    RESOURCE_GPU_MEMORY,
    RESOURCE_GPU_MILLI,
    k8s_name,
)
from kubecell.testbed.paths import K8S_VERSION

PODS_PER_NODE = 110
"""The kubelet's default ``maxPods``."""

TESTBED_LABEL = "kubecell.io/testbed"
"""Marks nodes the testbed created (its fake kubelet manages exactly these)."""

SYNTHETIC_RACK = 20
"""Nodes per rack in a synthetic cluster (a common 8-GPU server rack)."""


def synthetic_cluster(count: int, *, gpus: int = 8, model: str = "A100") -> list[Node]:
    """``count`` identical 8-GPU servers (two NVLink quads, two NUMA nodes) in racks of 20."""
    if count < 1:
        raise InvalidInputError(f"--nodes {count}: a cluster needs at least one node", field="nodes",
                                accepted="a whole number >= 1")
    digits = max(4, len(str(count - 1)))
    half = gpus // 2
    groups = [list(range(half)), list(range(half, gpus))] if gpus > 1 else []
    return [make_node(f"node-{i:0{digits}d}", cpu_milli=96_000, memory_mib=786_432, gpu_count=gpus,
                      gpu_model=model, nvlink_groups=groups, numa_groups=groups,
                      rack=f"rack-{i // SYNTHETIC_RACK:03d}") for i in range(count)]




def node_manifest(node: Node) -> dict[str, Any]:
    """The Node object (metadata, spec and status) for a core node."""
    labels = {
        "kubernetes.io/hostname": k8s_name(node.name),
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        TESTBED_LABEL: "true",
        **node.labels,
    }
    if node.rack:
        labels[LABEL_RACK] = node.rack
    if node.zone:
        labels[LABEL_ZONE] = node.zone
    capacity: dict[str, str] = {
        "cpu": f"{node.cpu_milli}m",
        "memory": f"{node.memory_mib}Mi",
        "pods": str(PODS_PER_NODE),
        "ephemeral-storage": "500Gi",
    }
    annotations: dict[str, str] = {}
    if node.gpus:
        labels.update({GFD_PRODUCT: node.gpu_model, GFD_COUNT: str(node.gpu_count),
                       GFD_MEMORY: str(node.gpus[0].memory_mib), "nvidia.com/gpu.present": "true"})
        capacity.update({
            NVIDIA_GPU: str(node.gpu_count),
            RESOURCE_GPU: str(node.gpu_count),
            RESOURCE_GPU_MILLI: str(node.gpu_count * MILLI_PER_GPU),
            RESOURCE_GPU_MEMORY: str(sum(gpu.memory_mib for gpu in node.gpus)),
        })
        annotations[ANNOTATION_INVENTORY] = inventory_of(node, agent="kubecell-testbed").to_annotation()
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": k8s_name(node.name), "labels": labels, "annotations": annotations},
        "spec": {},
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "conditions": [ready_condition()],
            "addresses": [{"type": "Hostname", "address": k8s_name(node.name)}],
            "nodeInfo": {"kubeletVersion": K8S_VERSION, "kubeProxyVersion": K8S_VERSION, "architecture": "amd64",
                         "operatingSystem": "linux", "containerRuntimeVersion": "fake://kubecell-testbed",
                         "osImage": "kubecell testbed", "kernelVersion": "", "machineID": "", "systemUUID": "",
                         "bootID": ""},
        },
    }


def ready_condition(now: str | None = None) -> dict[str, str]:
    stamp = now or rfc3339()
    return {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubecell testbed fake kubelet",
            "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}


def load_cluster_nodes(cluster: str, nodes: int | None = None) -> list[Node]:
    """Nodes of ``openb`` (the openb node list in ../shared/data, else the bundled openb-format
    example), ``philly`` (the bundled Philly cluster), ``synthetic`` (needs ``nodes``) or a file: a
    cluster YAML or an openb node CSV. ``nodes`` keeps the first N nodes of a description."""
    from kubecell.sim.traces.openb import load_nodes

    key = cluster.strip().lower()
    if key == "synthetic":
        if nodes is None:
            raise InvalidInputError("--cluster synthetic needs --nodes N", field="nodes")
        return synthetic_cluster(nodes)
    if key == "openb":
        shared = Path("../shared/data/alibaba-gpu-v2023-openb/csv/openb_node_list_gpu_node.csv")
        source = shared if shared.is_file() else _bundled("nodes.csv")
        found = load_nodes(source)
    elif key == "philly":
        found = _load_yaml_cluster(_bundled("philly/cluster.yaml"))
    else:
        path = Path(cluster)
        if path.suffix.lower() in (".yaml", ".yml"):
            found = _load_yaml_cluster(path)
        elif path.suffix.lower() == ".csv":
            found = load_nodes(path)
        else:
            raise InvalidInputError(f"unknown cluster {cluster!r}", field="cluster",
                                    accepted="openb, philly, synthetic (with --nodes), a cluster YAML or a node CSV")
    if nodes is not None:
        if nodes < 1:
            raise InvalidInputError(f"--nodes {nodes}", field="nodes", accepted="a whole number >= 1")
        found = found[:nodes]
    counts = Counter(k8s_name(node.name) for node in found)  # (names.count per name: 8.5 s at 20,000 nodes)
    clashes = sorted(name for name, count in counts.items() if count > 1)
    if clashes:
        raise InvalidInputError(f"node names collide once made Kubernetes names: {', '.join(clashes[:5])}",
                                location=cluster)
    return found


def _bundled(relative: str) -> Path:
    from importlib import resources

    return Path(str(resources.files("kubecell.sim.examples") / relative))


def _load_yaml_cluster(path: Path) -> list[Node]:
    return load_cluster(path)
