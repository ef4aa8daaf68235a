"""``status.allocation`` as kube-scheduler's allocator writes it, and allocations read back as untrusted input."""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

import pytest

from kubecell.kube.dra.allocation import AllocatedDevice, allocated_devices, allocation_status, reserved_for
from kubecell.kube.dra.claims import ClaimError, claim_demand
from kubecell.kube.dra.slices import PublishedDevice, published_devices
from kubecell.kube.dra_names import CLASS_GPU, CLASS_GPU_SHARE, CLASS_MIG, DRIVER
from tests.kube.dra import CLASSES, claim, device_class, gpu_device, mig_device, node_slice, request

NODE_A = {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}


def devices() -> list[PublishedDevice]:
    found, problems = published_devices([
        node_slice("node-a", [gpu_device(0), gpu_device(1), gpu_device(2)]),
        node_slice("node-b", [mig_device(0, 0, node="node-b")]),
    ])
    assert problems == []
    return found


def test_whole_gpus() -> None:
    found = devices()
    demand = claim_demand(claim(request(count=2)), CLASSES, found)
    assert allocation_status(demand, "node-a", found[:2], share_ids=["s-0", "s-1"]) == {
        "devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-0", "shareID": "s-0",
             "consumedCapacity": {"compute": "1000", "memory": "0"}},
            {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-1", "shareID": "s-1",
             "consumedCapacity": {"compute": "1000", "memory": "0"}},
        ]},
        "nodeSelector": NODE_A,
    }


def test_share() -> None:
    found = devices()
    ask = request("half", CLASS_GPU_SHARE, capacity={"compute": "500", "memory": "20Gi"})
    demand = claim_demand(claim(ask), CLASSES, found)
    status = allocation_status(demand, "node-a", [found[2]])
    result = status["devices"]["results"][0]
    assert result["consumedCapacity"] == {"compute": "500", "memory": "20Gi"}
    assert uuid.UUID(result["shareID"])  # a fresh UID, as GenerateShareID makes


def test_mig_instance_is_exclusive() -> None:
    found = devices()
    demand = claim_demand(claim(request(device_class=CLASS_MIG)), CLASSES, found)
    assert allocation_status(demand, "node-b", [found[3]]) == {
        "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": "node-b", "device": "gpu-0-mig-0"}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["node-b"]}]}]},
    }


def test_tolerations_and_config_as_the_allocator_orders_them() -> None:
    found = devices()
    class_config = {"opaque": {"driver": DRIVER, "parameters": {"from": "class"}}}
    only_gpus = f'device.attributes["{DRIVER}"].type == "gpu"'
    classes = {**CLASSES, CLASS_GPU: device_class(CLASS_GPU, only_gpus, config=[class_config])}
    all_requests = {"opaque": {"driver": "x.io", "parameters": {"to": "all"}}}
    only_b = {"requests": ["b"], "opaque": {"driver": "x.io", "parameters": {"to": "b"}}}
    elsewhere = {"requests": ["zzz"], "opaque": {"driver": "x.io", "parameters": {}}}
    toleration = {"key": "k", "operator": "Exists", "effect": "NoSchedule"}
    body = claim(request("a", tolerations=[toleration]), request("b"), config=[all_requests, only_b, elsewhere])
    demand = claim_demand(body, classes, found)
    status = allocation_status(demand, "node-a", found[:2], share_ids=["x", "y"])
    results = status["devices"]["results"]
    assert [(r["request"], r.get("tolerations")) for r in results] == [("a", [toleration]), ("b", None)]
    assert status["devices"]["config"] == [
        {"source": "FromClass", **class_config},  # both requests: "requests" dropped (applies to all)
        {"source": "FromClaim", **all_requests},
        {"source": "FromClaim", "requests": ["b"], "opaque": only_b["opaque"]},
    ]


def test_picks_checked() -> None:
    found = devices()
    demand = claim_demand(claim(request(selectors=(f'device.attributes["{DRIVER}"].index == 0',))), CLASSES, found)
    with pytest.raises(ClaimError, match="2 devices given for a claim of 1"):
        allocation_status(demand, "node-a", found[:2])
    with pytest.raises(ClaimError, match="is not one request gpu admits on node node-a"):
        allocation_status(demand, "node-a", [found[1]])
    with pytest.raises(ClaimError, match="on node node-b"):
        allocation_status(demand, "node-b", [found[0]])


def test_reserved_for() -> None:
    assert reserved_for({"metadata": {"name": "p", "namespace": "ns", "uid": "u-1"}}) == {
        "resource": "pods", "name": "p", "uid": "u-1"}


def allocated(allocation: Any) -> dict[str, Any]:
    return claim(status={"allocation": allocation, "reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]})


def test_read_back_round_trip() -> None:
    found = devices()
    demand = claim_demand(claim(request(capacity={"compute": "250", "memory": "4Gi"})), CLASSES, found)
    status = allocation_status(demand, "node-a", [found[1]], share_ids=["share-1"])
    (read,) = allocated_devices(allocated(status))
    assert read == AllocatedDevice("node-a", "gpu-1", {"compute": Decimal(250), "memory": Decimal(4 * 2**30)},
                                   "gpu", "node-a", "share-1")
    assert (read.compute_milli, read.memory_mib) == (250, 4096)


def test_read_back_what_the_stock_allocator_wrote() -> None:
    """Another driver's devices are not kubecell's to hold; an exclusive device records nothing."""
    results: list[dict[str, Any]] = [
        {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-0"},
        {"request": "nic", "driver": "nic.example.com", "pool": "node-a", "device": "eth1"},
        {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-2", "shareID": "abc",
         "consumedCapacity": {"compute": "1k", "memory": "0"}},
    ]
    allocation = {"devices": {"results": results}, "nodeSelector": NODE_A}
    read = allocated_devices(allocated(allocation))
    assert [(r.node, r.device, r.compute_milli, r.memory_mib) for r in read] == [
        ("node-a", "gpu-0", 1000, 0), ("node-a", "gpu-2", 1000, 0)]
    assert allocated_devices(claim()) == []
    assert allocated_devices(claim(status={})) == []
    without_selector = {"devices": {"results": results[:1]}}
    assert allocated_devices(allocated(without_selector))[0].node == "node-a"  # from the pool


@pytest.mark.parametrize(("allocation", "field"), [
    ("yes", "status.allocation"),
    ({"devices": {"results": "many"}}, "status.allocation.devices.results"),
    ({"devices": {"results": [{}] * 33}}, "status.allocation.devices.results"),
    ({"devices": {"results": [7]}}, "status.allocation.devices.results[0]"),
    ({"devices": {"results": [{"driver": DRIVER, "pool": "node-a", "device": 5, "request": "r"}]}},
     "results[0].device"),
    ({"devices": {"results": [{"driver": DRIVER, "pool": "node-a", "device": "d" * 254, "request": "r"}]}},
     "results[0].device"),
    ({"devices": {"results": [{"driver": DRIVER, "pool": "node-a", "device": "d", "request": "r",
                               "consumedCapacity": {"compute": "a lot"}}]}}, "consumedCapacity.compute"),
    ({"devices": {"results": [{"driver": DRIVER, "pool": "node-a", "device": "d", "request": "r",
                               "consumedCapacity": {"compute": "-1"}}]}}, "consumedCapacity.compute"),
    ({"devices": {"results": [{"driver": DRIVER, "pool": "node-a", "device": "d", "request": "r",
                               "shareID": {"x": 1}}]}}, "shareID"),
    ({"devices": {"results": [{"driver": DRIVER, "pool": "node-z", "device": "d", "request": "r"}]},
      "nodeSelector": NODE_A}, "results[0].pool"),
    ({"devices": {"results": []}, "nodeSelector": "node-a"}, "status.allocation.nodeSelector"),
])
def test_malformed_allocations(allocation: Any, field: str) -> None:
    with pytest.raises(ClaimError) as raised:
        allocated_devices(allocated(allocation))
    assert field in (raised.value.field or "")
    assert str(raised.value).startswith("ResourceClaim ns/c")
