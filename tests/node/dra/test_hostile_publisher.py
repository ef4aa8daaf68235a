"""The node's slice publisher under inventories and API states it does not expect (a hostile review).

Each test fails on the code before its fix: a string attribute was cut to 64 *characters* where the API server
counts 64 *bytes* (refusing the slice, and with it every device of the node, at every pass), and a slice of the
node listed at the largest pool generation left the publisher writing generation 2**63 (refused) forever."""

from __future__ import annotations

import copy
from typing import Any, cast

import pytest

pytest.importorskip("grpc", reason="tests/node needs the `node` extra: pip install -e '.[dev,node]' (grpcio)")

from kubecell.kube import dra_names as names
from kubecell.kube.inventory_schema import GpuRecord, MigInstanceRecord, NodeInventory
from kubecell.kube.rest import ApiError, Kube
from kubecell.node.dra.publisher import SlicePublisher
from kubecell.node.dra.slices import node_slices
from tests.node.dra.test_slices import FakeKube, devices_of, inventory_of

API_MAX_STRING_BYTES = 64
"""``DeviceAttributeMaxValueLength``, checked by the API server with Go's ``len``: bytes."""
INT64_MAX = 2**63 - 1


def _strings(slices: list[dict[str, Any]]) -> list[str]:
    return [value["string"] for device in devices_of(slices).values()
            for value in device["attributes"].values() if "string" in value]


def _gpu(index: int, *, product: str = "NVIDIA A100-SXM4-40GB", uuid: str | None = None,
         instances: list[MigInstanceRecord] | None = None) -> GpuRecord:
    return GpuRecord(index=index, uuid=uuid or f"GPU-{index:08d}-0000-0000-0000-000000000000", model="A100-SXM4-40GB",
                     product=product, memory_mib=40960, mig_mode="enabled" if instances else "disabled",
                     mig_instances=instances or [])


def test_string_attributes_fit_the_api_servers_bytes_not_characters() -> None:
    """NVML's name is decoded with ``errors="replace"``: undecodable bytes become U+FFFD, three bytes each.
    40 such characters are 120 bytes, which the API server refuses, whole slice and all."""
    odd = "\ufffd" * 40
    profile = "1g.5gb" + "é" * 60
    inventory = NodeInventory(gpus=[_gpu(0, product=odd), _gpu(1, product="Ü" * 64, uuid="GPU-ü" * 20),
                                    _gpu(2, instances=[MigInstanceRecord(uuid="MIG-1", profile=profile,
                                                                         memory_mib=4864, start=0, size=1)])])
    slices = node_slices(inventory, "n1", "uid-n1", 1)
    strings = _strings(slices)
    assert strings, "the devices carry string attributes"
    for text in strings:
        assert len(text.encode("utf-8")) <= API_MAX_STRING_BYTES, f"{text!r} is refused by the API server"
    products = {name: device["attributes"].get(names.ATTR_PRODUCT, {}).get("string")
                for name, device in devices_of(slices).items()}
    assert products["gpu-0"] == "\ufffd" * 21, "cut on a character boundary, as many as fit"
    assert products["gpu-1"] == "Ü" * 32


def test_short_and_ascii_strings_are_kept_whole() -> None:
    exact = "N" * API_MAX_STRING_BYTES
    inventory = NodeInventory(gpus=[_gpu(0, product=exact), _gpu(1, product="NVIDIA H100 80GB HBM3")])
    products = [device["attributes"][names.ATTR_PRODUCT]["string"]
                for device in devices_of(node_slices(inventory, "n1", "u", 1)).values()]
    assert products == [exact, "NVIDIA H100 80GB HBM3"]


class Int64Kube(FakeKube):
    """The fake API server, refusing what the real one cannot decode: a pool generation past int64."""

    def _check(self, body: dict[str, Any], path: str, method: str) -> None:
        if body["spec"]["pool"]["generation"] > INT64_MAX:
            raise ApiError(400, "BadRequest", "spec.pool.generation: cannot unmarshal number into int64",
                           method=method, path=path)

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self._check(body, path, "POST")
        return super().create(path, body)

    def replace(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self._check(body, path, "PUT")
        return super().replace(path, body)


@pytest.mark.parametrize("name", ["n1-gpu.kubecell.io", "n1-forged"])
def test_a_slice_at_the_largest_generation_does_not_stop_publishing(name: str) -> None:
    """Anyone who may write ResourceSlices (the agents' role may write all of them) puts a slice of node n1 at
    generation 2**63-1, under n1's own slice name or another: the publisher could never write a higher one, so
    every pass failed and the other writer's devices stood for n1's for good."""
    fake = Int64Kube()
    fake.add("/api/v1/nodes/n1", {"metadata": {"name": "n1", "uid": "uid-n1"}})
    forged = copy.deepcopy(node_slices(NodeInventory(gpus=[_gpu(0)]), "n1", "uid-n1", INT64_MAX)[0])
    forged["metadata"]["name"] = name
    fake.add(f"{names.RESOURCE_SLICES}/{name}", forged)
    publisher = SlicePublisher(cast(Kube, fake), "n1")
    publisher.update(inventory_of("a100-nvlink"))
    assert publisher.reconcile()
    slices = [o for p, o in fake.objects.items() if p.startswith(names.RESOURCE_SLICES + "/")]
    assert [s["metadata"]["name"] for s in slices] == ["n1-gpu.kubecell.io"]
    assert slices[0]["spec"]["pool"]["generation"] == 1
    assert len(devices_of(slices)) == 8
    assert not publisher.reconcile(), "and it stays published"
    publisher.update(inventory_of("a100-nvlink", (3,)))
    assert publisher.reconcile()
    assert fake.objects[f"{names.RESOURCE_SLICES}/n1-gpu.kubecell.io"]["spec"]["pool"]["generation"] == 2
