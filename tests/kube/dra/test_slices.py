"""ResourceSlices into published devices: the agent's layout, the API's every attribute and capacity form,
and the slices a node could forge or the allocator would not use, each left out with its reason."""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

import pytest

from kubecell.kube.dra.capacity import DeviceCapacity, RequestPolicy
from kubecell.kube.dra.cel import device_matches
from kubecell.kube.dra.cel_types import parse_semver
from kubecell.kube.dra.slices import Taint, published_devices
from kubecell.kube.dra_names import DRIVER
from tests.kube.dra import gpu_device, mig_device, node_slice

MIB = 2**20


def test_agent_layout() -> None:
    slices = [node_slice("node-a", [gpu_device(0, numa=0, nvlink=0), gpu_device(1, numa=1, nvlink=None)]),
              node_slice("node-b", [mig_device(0, 0, node="node-b"), mig_device(0, 1, node="node-b")])]
    devices, problems = published_devices(slices)
    assert problems == []
    assert [(d.node, d.pool, d.name, d.uuid, d.kind, d.shareable) for d in devices] == [
        ("node-a", "node-a", "gpu-0", "GPU-node-a-0", "gpu", True),
        ("node-a", "node-a", "gpu-1", "GPU-node-a-1", "gpu", True),
        ("node-b", "node-b", "gpu-0-mig-0", "MIG-node-b-0-0", "mig", False),
        ("node-b", "node-b", "gpu-0-mig-1", "MIG-node-b-0-1", "mig", False),
    ]
    gpu = devices[0]
    assert gpu.attribute("model") == gpu.attribute(f"{DRIVER}/model") == "A100-SXM4-40GB"
    assert gpu.attribute("index") == 0
    assert gpu.attribute("other.io/model") is None
    assert devices[1].attribute("nvlinkGroup") is None
    assert gpu.capacities["memory"] == DeviceCapacity(
        Decimal(40960 * MIB), RequestPolicy(Decimal(0), (), True, Decimal(0), None, Decimal(MIB)), binary=True)
    assert gpu.capacities["compute"].value == 1000
    assert gpu.capacities["compute"].policy == RequestPolicy(Decimal(1000), (), True, Decimal(1), Decimal(1000),
                                                             Decimal(1))
    mig = devices[2]
    assert mig.attribute("profile") == "1g.5gb"
    assert mig.capacities["memory"].policy is None
    # what the selectors see: names qualified by the driver, capacities as quantities
    assert device_matches(f'device.attributes["{DRIVER}"].index == 0 && device.capacity["{DRIVER}"].memory == '
                          'quantity("40Gi") && device.allowMultipleAllocations', gpu.cel)
    assert device_matches(f'device.attributes["{DRIVER}"].type == "mig"', mig.cel)


def test_every_attribute_type_and_foreign_domains() -> None:
    device = gpu_device(0)
    device["attributes"].update({
        "healthy": {"bool": True}, "driverVersion": {"version": "550.54.15"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:3a"},
        "pcieLanes": {"ints": [16, 16]}, "aliases": {"strings": ["a", "b"]}, "flags": {"bools": [True]},
        "firmware": {"versions": ["1.0.0", "2.0.0-rc.1"]},
    })
    device["capacity"]["example.com/bandwidth"] = {"value": "1500m"}
    (published,), problems = published_devices([node_slice("n", [device])])
    assert problems == []
    assert published.attribute("healthy") is True
    assert published.attribute("driverVersion") == parse_semver("550.54.15")
    assert published.attribute("resource.kubernetes.io/pcieRoot") == "pci0000:3a"
    assert published.attribute("pcieLanes") == (16, 16)
    assert published.attribute("firmware") == (parse_semver("1.0.0"), parse_semver("2.0.0-rc.1"))
    assert published.capacities["example.com/bandwidth"].value == Decimal("1.5")
    assert device_matches(f'device.attributes["{DRIVER}"].driverVersion.isGreaterThan(semver("550.0.0")) && '
                          f'device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:3a" && '
                          f'device.attributes["{DRIVER}"].pcieLanes.all(x, x == 16) && '
                          'device.capacity["example.com"].bandwidth == quantity("1500m")', published.cel)


def test_other_drivers_are_not_problems() -> None:
    other = node_slice("node-a", [{"name": "nic-0"}], driver="nic.example.com")
    devices, problems = published_devices([other, node_slice("node-a", [gpu_device(0)])])
    assert [d.name for d in devices] == ["gpu-0"]
    assert problems == []


def _one_problem(slices: list[dict[str, Any]]) -> tuple[list[str], str]:
    devices, problems = published_devices(slices)
    assert len(problems) == 1, problems
    return [f"{d.node}/{d.name}" for d in devices], problems[0]


def test_forged_node_name_pool_or_owner() -> None:
    good = node_slice("node-b", [gpu_device(0, node="node-b")])
    for forged, words in (
        (node_slice("node-a", [gpu_device(7)], pool="node-b"), "pool 'node-b' is not its node 'node-a'"),
        (node_slice("node-a", [gpu_device(7)], owner="node-b"), "is not the Node that owns it"),
    ):
        kept, problem = _one_problem([forged, good])
        assert kept == ["node-b/gpu-0"]
        assert words in problem
        assert problem.endswith("left out")
    unowned = node_slice("node-a", [gpu_device(0)])
    unowned["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": "node-a"}]
    assert "is not the Node that owns it" in _one_problem([unowned])[1]
    shared = node_slice("node-a", [gpu_device(0)])
    shared["spec"].pop("nodeName")
    shared["spec"]["allNodes"] = True
    assert "not bound to one node" in _one_problem([shared])[1]


def test_newest_generation_only_and_incomplete_pools() -> None:
    old = node_slice("node-a", [gpu_device(0, uuid="GPU-old")], generation=1)
    new = node_slice("node-a", [gpu_device(0, uuid="GPU-new")], generation=2)
    devices, problems = published_devices([new, old])
    assert [d.uuid for d in devices] == ["GPU-new"]
    assert problems == []
    half = node_slice("node-a", [gpu_device(0)], generation=3, count=2)
    kept, problem = _one_problem([old, new, half])
    assert kept == []
    assert "incomplete or inconsistent: 1 slice(s) for resourceSliceCount [2]" in problem
    first = node_slice("node-a", [gpu_device(0)], count=2, name="s1")
    second = node_slice("node-a", [gpu_device(1)], count=2, name="s2")
    devices, problems = published_devices([first, second])
    assert [d.name for d in devices] == ["gpu-0", "gpu-1"]
    assert problems == []
    mixed = node_slice("node-a", [gpu_device(1)], count=3, name="s2")
    assert "inconsistent" in _one_problem([first, mixed])[1]


def test_device_named_twice_invalidates_the_pool() -> None:
    first = node_slice("node-a", [gpu_device(0, uuid="GPU-x")], count=2, name="s1")
    second = node_slice("node-a", [gpu_device(0, uuid="GPU-y")], count=2, name="s2")
    kept, problem = _one_problem([first, second, node_slice("node-b", [gpu_device(0, node="node-b")])])
    assert kept == ["node-b/gpu-0"]
    assert "gpu-0 published twice; the pool is invalid" in problem


def test_uuid_published_by_two_nodes() -> None:
    a = node_slice("node-a", [gpu_device(0, uuid="GPU-same"), gpu_device(1)])
    b = node_slice("node-b", [gpu_device(0, node="node-b", uuid="GPU-same")])
    kept, problem = _one_problem([a, b])
    assert kept == ["node-a/gpu-1"]
    assert problem == "GPU GPU-same is published by several devices (node-a/gpu-0, node-b/gpu-0): all left out"


def _broken(change: Any) -> str:
    device = gpu_device(0)
    change(device)
    kept, problem = _one_problem([node_slice("node-a", [device, gpu_device(1)])])
    assert kept == ["node-a/gpu-1"]
    return problem


@pytest.mark.parametrize(("change", "words"), [
    (lambda d: d["attributes"].pop("uuid"), "no string attribute 'uuid'"),
    (lambda d: d["attributes"].update(type={"string": "fpga"}), "is 'fpga', not 'gpu' or 'mig'"),
    (lambda d: d["attributes"].update(model={"string": "x", "int": 1}), "exactly one is allowed"),
    (lambda d: d["attributes"].update(model={"string": "x" * 65}), "at most 64 characters"),
    (lambda d: d["attributes"].update(index={"int": 2**63}), "not a 64-bit integer"),
    (lambda d: d["attributes"].update(index={"int": True}), "not a 64-bit integer"),
    (lambda d: d["attributes"].update(v={"version": "1.0"}), "attribute v: no Major.Minor.Patch"),
    (lambda d: d["attributes"].update(v={"ints": []}), "not a non-empty list"),
    (lambda d: d["attributes"].update(v={"ints": list(range(49))}), "more than 48 attribute values"),
    (lambda d: d["attributes"].update({f"a{i}": {"int": i} for i in range(31)}), "more than 32 attributes"),
    (lambda d: d["attributes"].update({"bad name": {"int": 1}}), "is not a qualified name"),
    (lambda d: d["attributes"].update({"x" * 33: {"int": 1}}), "is not a qualified name"),
    (lambda d: d.update(name="GPU_0"), "is not a DNS label"),
    (lambda d: d["capacity"]["memory"].update(value="lots"), "capacity memory: value 'lots' is not a Kubernetes"),
    (lambda d: d["capacity"]["memory"].update(value="-1"), "value is negative"),
    (lambda d: d["capacity"]["compute"]["requestPolicy"]["validRange"].pop("min"), "validRange has no min"),
    (lambda d: d["capacity"]["compute"]["requestPolicy"]["validRange"].update(step="0"), "a step of at least 1"),
    (lambda d: d["capacity"]["compute"]["requestPolicy"].update(validValues=["1"]), "both validValues and"),
    (lambda d: d.pop("allowMultipleAllocations"), "a requestPolicy needs allowMultipleAllocations"),
    (lambda d: d.update(consumesCounters=[{"counterSet": "x"}]), "sets consumesCounters"),
    (lambda d: d.update(bindingConditions=["Ready"]), "sets bindingConditions"),
    (lambda d: d.update(taints=[{"key": 1}]), "a taint is not"),
], ids=lambda value: value if isinstance(value, str) else "")
def test_devices_left_out(change: Any, words: str) -> None:
    problem = _broken(change)
    assert words in problem, problem
    assert problem.startswith("ResourceSlice node-a-gpu.kubecell.io-1: device ")


def test_mig_instance_cannot_be_shared() -> None:
    mig = mig_device(0, 0)
    mig["allowMultipleAllocations"] = True
    kept, problem = _one_problem([node_slice("node-a", [mig])])
    assert kept == []
    assert "a MIG instance is exclusive" in problem


def test_slice_limits() -> None:
    many = node_slice("node-a", [gpu_device(i) for i in range(129)])
    assert "at most 128" in _one_problem([many])[1]
    assert "not an object" in _one_problem(["slice"])[1]  # type: ignore[list-item]
    broken = node_slice("node-a", [gpu_device(0)])
    broken["spec"]["pool"]["generation"] = "1"
    assert "generation or resourceSliceCount" in _one_problem([broken])[1]


def test_taints_are_kept() -> None:
    device = gpu_device(0)
    device["taints"] = [{"key": "health", "value": "xid", "effect": "NoSchedule"}]
    (published,), _ = published_devices([node_slice("node-a", [device])])
    assert published.taints == (Taint("health", "xid", "NoSchedule"),)


def test_input_is_not_changed() -> None:
    slices = [node_slice("node-a", [gpu_device(0)])]
    before = copy.deepcopy(slices)
    published_devices(slices)
    assert slices == before
