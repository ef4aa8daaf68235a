"""The node's ResourceSlice from the inventory (the fake NVML examples), and its publisher on an in-memory API."""

from __future__ import annotations

import copy
import math
import time
from decimal import Decimal
from typing import Any, cast

import pytest

pytest.importorskip("grpc", reason="tests/node needs the `node` extra: pip install -e '.[dev,node]' (grpcio)")

from kubecell.kube import dra_names as names
from kubecell.kube.dialects.resources import parse_quantity
from kubecell.kube.inventory_schema import GpuRecord, MigInstanceRecord, NodeInventory
from kubecell.kube.rest import ApiError, Kube
from kubecell.node.dra.publisher import SlicePublisher
from kubecell.node.dra.slices import MAX_DEVICES_PER_SLICE, node_slices, slice_name
from kubecell.node.fake_nvml import FakeNvml, example_path
from kubecell.node.inventory import build_inventory
from kubecell.node.xid import HealthTracker, XidEvent


def inventory_of(example: str, unhealthy: tuple[int, ...] = ()) -> NodeInventory:
    """The agent's inventory of a fake NVML example, with critical XIDs on the ``unhealthy`` GPU indices."""
    devices = FakeNvml.from_file(example_path(example)).devices()
    health = HealthTracker()
    for index in unhealthy:
        health.record(XidEvent(index, devices[index].uuid, 79, time.time()))
    return build_inventory(devices, health)


def devices_of(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}


def attr(device: dict[str, Any], name: str) -> Any:
    value = device["attributes"].get(name)
    return None if value is None else next(iter(value.values()))


def test_eight_a100s_become_one_slice_of_shareable_gpus() -> None:
    inventory = inventory_of("a100-nvlink")
    (one,) = node_slices(inventory, "n1", "uid-1", 3)
    assert one["apiVersion"] == "resource.k8s.io/v1"
    assert one["kind"] == "ResourceSlice"
    assert one["metadata"] == {"name": "n1-gpu.kubecell.io", "ownerReferences": [
        {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "uid-1"}]}
    assert one["spec"]["driver"] == "gpu.kubecell.io"
    assert one["spec"]["nodeName"] == "n1"
    assert one["spec"]["pool"] == {"name": "n1", "generation": 3, "resourceSliceCount": 1}
    devices = devices_of([one])
    assert list(devices) == [f"gpu-{i}" for i in range(8)]
    for i, gpu in enumerate(inventory.gpus):
        device = devices[f"gpu-{i}"]
        assert device["allowMultipleAllocations"] is True
        assert {k: attr(device, k) for k in device["attributes"]} == {
            "type": "gpu", "uuid": gpu.uuid, "model": gpu.model, "index": i, "numaNode": i // 4,
            "nvlinkGroup": 0 if i < 4 else 4, "productName": "NVIDIA A100-SXM4-40GB", "memoryMiB": gpu.memory_mib}
        assert device["capacity"] == {
            "compute": {"value": "1000", "requestPolicy": {"default": "1000",
                                                           "validRange": {"min": "1", "max": "1000", "step": "1"}}},
            "memory": {"value": f"{gpu.memory_mib}Mi", "requestPolicy": {
                "default": "0", "validRange": {"min": "0", "max": f"{gpu.memory_mib}Mi", "step": "1Mi"}}}}


def test_gpus_without_nvlink_have_no_nvlink_group_and_models_stay_apart() -> None:
    devices = devices_of(node_slices(inventory_of("mixed-t4-v100"), "mixed", "u", 1))
    assert [attr(devices[f"gpu-{i}"], "nvlinkGroup") for i in range(8)] == [None] * 4 + [4] * 4
    assert len({attr(devices[f"gpu-{i}"], "model") for i in range(8)}) == 2


def test_mig_instances_are_exclusive_devices_of_their_own() -> None:
    inventory = inventory_of("a100-mig-1g")
    devices = devices_of(node_slices(inventory, "m", "u", 1))
    assert len(devices) == 14
    for gpu in inventory.gpus:
        for instance in gpu.mig_instances:
            device = devices[f"gpu-{gpu.index}-mig-{instance.start}"]
            assert "allowMultipleAllocations" not in device
            assert device["capacity"] == {"memory": {"value": f"{instance.memory_mib}Mi"}}
            assert {k: attr(device, k) for k in ("type", "uuid", "profile", "model", "index", "parentIndex",
                                                 "parentUUID", "numaNode")} == {
                "type": "mig", "uuid": instance.uuid, "profile": "1g.5gb", "model": "MIG-1g.5gb",
                "index": gpu.index, "parentIndex": gpu.index, "parentUUID": gpu.uuid, "numaNode": gpu.index}
    mixed = devices_of(node_slices(inventory_of("a100-mig"), "m", "u", 1))
    assert sorted(mixed) == ["gpu-0-mig-0", "gpu-0-mig-4", "gpu-0-mig-6", "gpu-0-mig-7", "gpu-1"]
    assert sorted(attr(d, "profile") for d in mixed.values() if attr(d, "type") == "mig") == [
        "1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]


def test_unhealthy_gpus_and_their_instances_are_left_out() -> None:
    assert "gpu-3" not in devices_of(node_slices(inventory_of("a100-nvlink", (3,)), "n", "u", 1))
    assert len(devices_of(node_slices(inventory_of("a100-nvlink", (3,)), "n", "u", 1))) == 7
    left = devices_of(node_slices(inventory_of("a100-mig-1g", (0,)), "m", "u", 1))
    assert len(left) == 7
    assert all(name.startswith("gpu-1-") for name in left)
    empty = node_slices(inventory_of("a100-mig-1g", (0, 1)), "m", "u", 2)
    assert len(empty) == 1
    assert "devices" not in empty[0]["spec"]


def test_slice_names_stay_dns_subdomains_and_unique() -> None:
    assert slice_name("node-a") == "node-a-gpu.kubecell.io"
    long_a, long_b = "a" * 250, "a" * 249 + "b"
    assert len(slice_name(long_a)) <= 253
    assert len(slice_name(long_b)) <= 253
    assert slice_name(long_a) != slice_name(long_b)
    dotted = slice_name("x" * 230 + "." + "y" * 22)
    assert ".-" not in dotted
    assert "-." not in dotted
    assert dotted.endswith("-gpu.kubecell.io")


def test_a_node_with_more_devices_than_a_slice_holds_gets_more_slices_of_one_pool() -> None:
    gpus = [GpuRecord(index=i, uuid=f"GPU-{i}", model="A100-SXM4-40GB", memory_mib=40960, mig_mode="enabled",
                      mig_instances=[MigInstanceRecord(uuid=f"MIG-{i}-{k}", profile="1g.5gb", memory_mib=4864,
                                                       start=k, size=1) for k in range(7)]) for i in range(20)]
    slices = node_slices(NodeInventory(gpus=gpus), "big", "u", 5)
    assert [len(s["spec"]["devices"]) for s in slices] == [MAX_DEVICES_PER_SLICE, 140 - MAX_DEVICES_PER_SLICE]
    assert [s["metadata"]["name"] for s in slices] == ["big-gpu.kubecell.io", "big-gpu.kubecell.io-1"]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {2}


# -- the request policies under the stock allocator's rule ---------------------------------------------------


def charged(capacity: dict[str, Any], requested: str | None) -> Decimal:
    """What ``k8s.io/dynamic-resource-allocation``'s ``calculateConsumedCapacity`` charges a request: the
    policy's default when the request does not name the capacity, else the amount rounded up into the range."""
    policy = capacity["requestPolicy"]
    if requested is None:
        return parse_quantity(policy["default"])
    value, low = parse_quantity(requested), parse_quantity(policy["validRange"]["min"])
    step = parse_quantity(policy["validRange"]["step"])
    return low if value < low else low + step * math.ceil((value - low) / step)


def fits(capacities: dict[str, Any], claims: list[dict[str, str]]) -> bool:
    return all(sum(charged(cap, claim.get(name)) for claim in claims) <= parse_quantity(cap["value"])
               and all(charged(cap, claim.get(name)) <= parse_quantity(cap["requestPolicy"]["validRange"]["max"])
                       for claim in claims)
               for name, cap in capacities.items())


def test_the_policies_give_whole_gpus_and_compute_shares() -> None:
    capacity = devices_of(node_slices(inventory_of("a100-nvlink"), "n", "u", 1))["gpu-0"]["capacity"]
    quarter = {"compute": "250"}
    assert fits(capacity, [{}])
    assert not fits(capacity, [{}, quarter]), "a claim without requests holds the whole GPU"
    assert fits(capacity, [quarter] * 4)
    assert not fits(capacity, [quarter] * 5)
    assert fits(capacity, [{"compute": "500", "memory": "19Gi"}, {"compute": "500", "memory": "19Gi"}])
    assert not fits(capacity, [{"compute": "100", "memory": "21Gi"}, {"compute": "100", "memory": "21Gi"}])
    assert not fits(capacity, [{"memory": "1Gi"}, quarter]), "memory alone is charged all the compute"
    assert charged(capacity["memory"], "1G") == 954 * (1 << 20), "rounded up to whole MiB"


# -- the publisher -------------------------------------------------------------------------------------------


class FakeKube:
    """Just enough of the API server for ResourceSlices, ResourceClaims and one Node: objects by path."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.version = 0
        self.writes: list[tuple[str, str]] = []
        self.fail: ApiError | None = None

    def add(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        stored = copy.deepcopy(body)
        stored.setdefault("metadata", {})["resourceVersion"] = str(self.version)
        self.objects[path] = stored
        return copy.deepcopy(stored)

    def get(self, path: str, **query: Any) -> dict[str, Any]:
        if self.fail is not None:
            raise self.fail
        if path == names.RESOURCE_SLICES:
            wanted = dict(term.split("=", 1) for term in query.get("fieldSelector", "").split(",") if term)
            items = [copy.deepcopy(o) for p, o in sorted(self.objects.items()) if p.startswith(path + "/") and all(
                str(o["spec"].get(k.split(".", 1)[1])) == v for k, v in wanted.items())]
            return {"items": items}
        if path not in self.objects:
            raise ApiError(404, "NotFound", f"{path} not found", method="GET", path=path)
        return copy.deepcopy(self.objects[path])

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        target = f"{path}/{body['metadata']['name']}"
        if target in self.objects:
            raise ApiError(409, "AlreadyExists", target, method="POST", path=path)
        self.writes.append(("create", target))
        return self.add(target, body)

    def replace(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        current = self.objects.get(path)
        if current is None:
            raise ApiError(404, "NotFound", path, method="PUT", path=path)
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", path, method="PUT", path=path)
        self.writes.append(("update", path))
        return self.add(path, body)

    def delete(self, path: str) -> dict[str, Any]:
        if self.objects.pop(path, None) is None:
            raise ApiError(404, "NotFound", path, method="DELETE", path=path)
        self.writes.append(("delete", path))
        return {}


def publisher_on(fake: FakeKube, node: str = "n1") -> SlicePublisher:
    fake.add(f"/api/v1/nodes/{node}", {"metadata": {"name": node, "uid": f"uid-{node}"}})
    return SlicePublisher(cast(Kube, fake), node)


def test_the_publisher_creates_keeps_bumps_and_recreates_the_slice() -> None:
    fake = FakeKube()
    publisher = publisher_on(fake)
    assert not publisher.reconcile(), "nothing to publish before the first inventory"
    publisher.update(inventory_of("a100-nvlink"))
    assert publisher.reconcile()
    path = f"{names.RESOURCE_SLICES}/n1-gpu.kubecell.io"
    assert fake.writes == [("create", path)]
    assert fake.objects[path]["spec"]["pool"]["generation"] == 1
    assert fake.objects[path]["metadata"]["ownerReferences"][0]["uid"] == "uid-n1"
    assert not publisher.reconcile(), "an unchanged inventory writes nothing"
    publisher.update(inventory_of("a100-nvlink", (5,)))
    assert publisher.reconcile()
    assert fake.writes[-1] == ("update", path)
    assert fake.objects[path]["spec"]["pool"]["generation"] == 2
    assert "gpu-5" not in devices_of([fake.objects[path]])
    del fake.objects[path]  # the kubelet wiped it
    assert publisher.reconcile()
    assert fake.writes[-1] == ("create", path)
    assert fake.objects[path]["spec"]["pool"]["generation"] == 3
    fake.objects[path]["spec"]["devices"] = []  # someone else wrote it
    fake.objects[path]["metadata"]["resourceVersion"] = "999"
    assert publisher.reconcile()
    assert len(devices_of([fake.objects[path]])) == 7
    assert fake.objects[path]["spec"]["pool"]["generation"] == 4


def test_a_new_publisher_continues_the_generation_and_removes_stale_slices() -> None:
    fake = FakeKube()
    first = publisher_on(fake)
    first.update(inventory_of("a100-nvlink"))
    first.reconcile()
    stale = fake.add(f"{names.RESOURCE_SLICES}/n1-gpu.kubecell.io-1", {
        "metadata": {"name": "n1-gpu.kubecell.io-1"},
        "spec": {"driver": names.DRIVER, "nodeName": "n1", "pool": {"name": "n1", "generation": 7}}})
    other = fake.add(f"{names.RESOURCE_SLICES}/n2-gpu.kubecell.io", {
        "metadata": {"name": "n2-gpu.kubecell.io"},
        "spec": {"driver": names.DRIVER, "nodeName": "n2", "pool": {"name": "n2", "generation": 1}}})
    again = SlicePublisher(cast(Kube, fake), "n1")
    again.update(inventory_of("a100-nvlink"))
    assert again.reconcile()
    assert f"{names.RESOURCE_SLICES}/{stale['metadata']['name']}" not in fake.objects
    assert f"{names.RESOURCE_SLICES}/{other['metadata']['name']}" in fake.objects, "another node's slice stays"
    assert fake.objects[f"{names.RESOURCE_SLICES}/n1-gpu.kubecell.io"]["spec"]["pool"]["generation"] == 8


def test_api_errors_are_retried_never_fatal() -> None:
    fake = FakeKube()
    publisher = publisher_on(fake)
    publisher.interval = 0.05
    fake.fail = ApiError(0, "Unavailable", "connection refused")
    publisher.update(inventory_of("a100-nvlink"))
    publisher.start()
    try:
        deadline = time.monotonic() + 10
        while publisher.failures < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert publisher.failures >= 2
        assert "connection refused" in publisher.last_error
        fake.fail = None
        while publisher.writes < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert publisher.writes == 1
    finally:
        publisher.stop()
