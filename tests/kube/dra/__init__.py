"""Builders of the DRA objects the tests of ``kubecell.kube.dra`` read, shaped as the API server stores them.

A node's slice is what kubecell's node agent publishes (``kubecell.kube.dra_names``): one ResourceSlice per
node, owned by the Node, pool named after it; whole GPUs shareable by ``compute`` (1000 milli-GPU, a claim
without capacity requests takes all of it) and ``memory`` (a share names what it needs; nothing by default),
MIG instances exclusive.
"""

from __future__ import annotations

from typing import Any

from kubecell.kube.dra_names import CLASS_GPU, CLASS_GPU_SHARE, CLASS_MIG, DRIVER

A100 = "A100-SXM4-40GB"


def gpu_device(index: int, *, node: str = "node-a", uuid: str | None = None, model: str = A100,
               memory_mib: int = 40960, numa: int | None = 0, nvlink: int | None = 0,
               shareable: bool = True) -> dict[str, Any]:
    """A whole GPU ``gpu-<index>`` as the agent publishes it."""
    attributes: dict[str, Any] = {
        "type": {"string": "gpu"}, "uuid": {"string": uuid or f"GPU-{node}-{index}"}, "model": {"string": model},
        "index": {"int": index},
    }
    if numa is not None:
        attributes["numaNode"] = {"int": numa}
    if nvlink is not None:
        attributes["nvlinkGroup"] = {"int": nvlink}
    device: dict[str, Any] = {"name": f"gpu-{index}", "attributes": attributes}
    if shareable:
        device["allowMultipleAllocations"] = True
        device["capacity"] = {
            "memory": {"value": f"{memory_mib}Mi",
                       "requestPolicy": {"default": "0", "validRange": {"min": "0", "step": "1Mi"}}},
            "compute": {"value": "1000",
                        "requestPolicy": {"default": "1000", "validRange": {"min": "1", "max": "1000", "step": "1"}}},
        }
    else:
        device["capacity"] = {"memory": {"value": f"{memory_mib}Mi"}}
    return device


def mig_device(parent: int, start: int, *, node: str = "node-a", uuid: str | None = None,
               profile: str = "1g.5gb", memory_mib: int = 4864, numa: int = 0) -> dict[str, Any]:
    """A MIG instance ``gpu-<parent>-mig-<start>``: exclusive, memory only."""
    return {
        "name": f"gpu-{parent}-mig-{start}",
        "attributes": {
            "type": {"string": "mig"}, "uuid": {"string": uuid or f"MIG-{node}-{parent}-{start}"},
            "profile": {"string": profile}, "model": {"string": f"MIG-{profile}"}, "parentIndex": {"int": parent},
            "numaNode": {"int": numa},
        },
        "capacity": {"memory": {"value": f"{memory_mib}Mi"}},
    }


def node_slice(node: str, devices: list[dict[str, Any]], *, generation: int = 1, count: int = 1,
               owner: str | None = None, pool: str | None = None, name: str | None = None,
               driver: str = DRIVER) -> dict[str, Any]:
    """The slice of ``node`` (owner, pool and name default to what the agent writes)."""
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name or f"{node}-{driver}-{generation}",
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": owner or node,
                                          "uid": f"uid-{owner or node}", "controller": True}]},
        "spec": {"driver": driver, "nodeName": node,
                 "pool": {"name": pool or node, "generation": generation, "resourceSliceCount": count},
                 "devices": devices},
    }


def device_class(name: str, *selectors: str, config: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": s}} for s in selectors]}
    if config:
        spec["config"] = config
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def _of_type(kind: str) -> str:
    return f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "{kind}"'


CLASSES = {
    CLASS_GPU: device_class(CLASS_GPU, _of_type("gpu")),
    CLASS_GPU_SHARE: device_class(CLASS_GPU_SHARE, _of_type("gpu")),
    CLASS_MIG: device_class(CLASS_MIG, _of_type("mig")),
}
"""The stock device classes (deploy/dra/deviceclasses.yaml's selectors)."""


def request(name: str = "gpu", device_class: str = CLASS_GPU, *, count: int | None = None,
            selectors: tuple[str, ...] = (), capacity: dict[str, str] | None = None, **exactly: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": device_class, **exactly}
    if count is not None:
        body["count"] = count
    if selectors:
        body["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    if capacity:
        body["capacity"] = {"requests": capacity}
    return {"name": name, "exactly": body}


def claim(*requests: dict[str, Any], name: str = "c", namespace: str = "ns", uid: str = "claim-uid",
          constraints: list[dict[str, Any]] | None = None, config: list[dict[str, Any]] | None = None,
          owner_uid: str | None = None, status: dict[str, Any] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": list(requests) or [request()]}
    if constraints:
        devices["constraints"] = constraints
    if config:
        devices["config"] = config
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid}
    if owner_uid:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": owner_uid,
                                    "controller": True}]
    body: dict[str, Any] = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta,
                            "spec": {"devices": devices}}
    if status is not None:
        body["status"] = status
    return body
