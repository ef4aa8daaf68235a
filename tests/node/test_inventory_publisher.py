"""The inventory publisher against the real testbed: a Node of the test's own, its GPUs from the fake NVML
backend, kubecell's scheduler placing on them by UUID, and a GPU going unhealthy (XID) reaching the
scheduler, which stops placing on it (issue 14, item 5)."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest

from kubecell.core.model import make_node
from kubecell.kube.inventory_schema import parse_inventory
from kubecell.kube.names import (
    ANNOTATION_ALLOCATION,
    ANNOTATION_GPU_FAULT_CLEAR,
    ANNOTATION_GPU_FAULTS,
    ANNOTATION_INVENTORY,
    RESOURCE_GPU_MEMORY,
)
from kubecell.kube.records import parse_record
from kubecell.kube.rest import ApiError, Kube
from kubecell.node.fake_nvml import FakeNvml, example_path
from kubecell.node.inventory import InventoryPublisher, build_inventory
from kubecell.testbed.control_plane import ControlPlaneState
from kubecell.testbed.nodes import node_manifest
from tests.cluster_fixtures import RunningScheduler
from tests.support import registered_node, wait_for

pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed: .venv/bin/pip install -e '.[dev,node]'")

A100_MIB = 40536


@pytest.fixture
def gpu_node(kube: Kube) -> Iterator[str]:
    """A fresh 8-GPU Node (Ready, testbed-labelled so the fake kubelet keeps it alive), deleted afterwards.
    It carries no inventory annotation: only the publisher under test writes one."""
    name = f"agent-{uuid.uuid4().hex[:8]}"
    core = make_node(name, cpu_milli=96_000, memory_mib=786_432, gpu_count=8, gpu_model="A100",
                     nvlink_groups=[[0, 1, 2, 3], [4, 5, 6, 7]], numa_groups=[[0, 1, 2, 3], [4, 5, 6, 7]])
    manifest = node_manifest(core)
    manifest["metadata"]["annotations"] = {}
    with registered_node(kube, manifest):
        yield name


def annotation(kube: Kube, node: str) -> str | None:
    value = (kube.get(f"/api/v1/nodes/{node}")["metadata"].get("annotations") or {}).get(ANNOTATION_INVENTORY)
    return str(value) if value else None


def pinned_pod(kube: Kube, ns: str, name: str, node: str, gpus: int) -> None:
    kube.create(f"/api/v1/namespaces/{ns}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
        "spec": {"schedulerName": "kubecell", "nodeSelector": {"kubernetes.io/hostname": node},
                 "containers": [{"name": "main", "image": "busybox",
                                 "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}})


def record_uuids(kube: Kube, ns: str, name: str) -> list[str] | None:
    pod = kube.get(f"/api/v1/namespaces/{ns}/pods/{name}")
    meta = pod["metadata"]
    if not pod["spec"].get("nodeName"):
        return None
    record = parse_record(meta["annotations"][ANNOTATION_ALLOCATION], pod=f"{ns}/{name}", uid=meta["uid"])
    assert record.node == pod["spec"]["nodeName"]
    return [gpu.uuid for gpu in record.gpus]


def waiting_message(kube: Kube, ns: str, name: str) -> str | None:
    pod = kube.get(f"/api/v1/namespaces/{ns}/pods/{name}")
    assert not pod["spec"].get("nodeName"), f"{name} was bound to {pod['spec'].get('nodeName')}"
    condition: dict[str, Any] = next(
        (c for c in pod["status"].get("conditions") or [] if c["type"] == "PodScheduled"), {})
    return str(condition["message"]) if condition.get("status") == "False" and condition.get("message") else None


def gpu_memory(kube: Kube, node: str) -> tuple[str | None, str | None]:
    status: dict[str, Any] = kube.get(f"/api/v1/nodes/{node}").get("status") or {}
    return ((status.get("capacity") or {}).get(RESOURCE_GPU_MEMORY),
            (status.get("allocatable") or {}).get(RESOURCE_GPU_MEMORY))


def test_an_xid_reaches_the_scheduler_which_stops_placing_on_that_gpu(
        testbed: ControlPlaneState, kube: Kube, namespace: str, gpu_node: str,
        start_scheduler: type[RunningScheduler]) -> None:
    backend = FakeNvml.from_file(example_path("a100-nvlink"))
    uuids = [d.uuid for d in backend.devices()]
    publisher = InventoryPublisher(kube, gpu_node, backend, interval=2.0)
    publisher.start()
    try:
        # 1. the annotation parses as the scheduler parses it, with the backend's UUIDs and topology
        text = wait_for("the first inventory", lambda: annotation(kube, gpu_node))
        inventory = parse_inventory(text, node=gpu_node)
        assert [g.uuid for g in inventory.gpus] == uuids
        assert [g.nvlink_peers for g in inventory.gpus][:2] == [[1, 2, 3], [0, 2, 3]]
        assert [g.numa_node for g in inventory.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
        assert all(g.healthy and g.model == "A100" for g in inventory.gpus)
        assert inventory.heartbeat.endswith("Z")
        assert inventory.agent.startswith("kubecell-node-agent/")
        assert gpu_memory(kube, gpu_node) == (str(8 * A100_MIB), str(8 * A100_MIB))

        # 2. the heartbeat moves on while nothing changes
        first = inventory.heartbeat
        wait_for("a newer heartbeat", lambda: parse_inventory(annotation(kube, gpu_node) or "{}",
                                                              node=gpu_node).heartbeat != first, timeout=10)

        # 3. kubecell's scheduler places a pinned 1-GPU pod on one of the backend's GPUs
        start_scheduler(testbed)
        pinned_pod(kube, namespace, "one", gpu_node, 1)
        (held,) = wait_for("the 1-GPU pod to be bound", lambda: record_uuids(kube, namespace, "one"))
        assert held in uuids
        broken = uuids.index(held)

        # 4. an XID on that GPU: the annotation says unhealthy within a bounded time (no heartbeat wait)
        injected = time.monotonic()
        backend.inject_xid(broken, 79)
        wait_for("the GPU marked unhealthy", lambda: not json.loads(annotation(kube, gpu_node) or "{}")["gpus"]
                 [broken]["healthy"], timeout=5)
        assert time.monotonic() - injected < 5
        wait_for("allocatable GPU memory without the broken GPU",
                 lambda: gpu_memory(kube, gpu_node) == (str(8 * A100_MIB), str(7 * A100_MIB)), timeout=5)
        kube.delete(f"/api/v1/namespaces/{namespace}/pods/one", gracePeriodSeconds=0)
        wait_for("the 1-GPU pod to be gone", lambda: not any(
            p["metadata"]["name"] == "one" for p in kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"]))

        # 5. all 8 GPUs: no longer possible on that node (it waits, told why); 7 GPUs: placed around the broken one
        pinned_pod(kube, namespace, "eight", gpu_node, 8)
        message = wait_for("the 8-GPU pod's waiting reason", lambda: waiting_message(kube, namespace, "eight"))
        assert "1 too few healthy GPUs" in message, message  # the XID, named as such
        pinned_pod(kube, namespace, "seven", gpu_node, 7)
        placed = wait_for("the 7-GPU pod to be bound", lambda: record_uuids(kube, namespace, "seven"))
        assert sorted(placed) == sorted(u for u in uuids if u != held)
        assert waiting_message(kube, namespace, "eight")
        assert publisher.failures == 0, publisher.last_error
    finally:
        publisher.stop()


def test_the_publisher_survives_api_errors_and_backs_off(kube: Kube, gpu_node: str) -> None:
    """A Node that disappears (404s), then reappears: errors are counted, the loop keeps going, and the
    next attempt after the back-off publishes."""
    backend = FakeNvml.from_file(example_path("a100-nvlink"))
    publisher = InventoryPublisher(kube, "no-such-node-" + gpu_node, backend, interval=1.0, max_backoff=0.4)
    publisher.start()
    try:
        wait_for("a few failed attempts", lambda: publisher.failures >= 3, timeout=10)
        assert "404" in publisher.last_error
        publisher.node_name = gpu_node
        wait_for("a publish after the errors", lambda: annotation(kube, gpu_node), timeout=5)
        assert publisher.publishes >= 1
    finally:
        publisher.stop()


def test_gpu_memory_is_advertised_on_a_node_without_reported_capacity(kube: Kube) -> None:
    """A Node no kubelet reported yet has no ``status.capacity``: the JSON patch's ``add`` under it fails
    (422) and the publisher falls back to a merge patch of the status."""
    name = f"bare-{uuid.uuid4().hex[:8]}"
    kube.create("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    try:
        backend = FakeNvml.from_text("gpus: [{product: Tesla T4, count: 2}]")
        publisher = InventoryPublisher(kube, name, backend)
        inventory = build_inventory(backend.devices(), publisher.health)
        with mock.patch.object(kube, "patch", wraps=kube.patch) as patched:
            publisher.advertise(inventory)
        assert [call.kwargs.get("kind", "merge") for call in patched.call_args_list] == ["json", "merge"]
        assert gpu_memory(kube, name) == (str(2 * 15109), str(2 * 15109))
        publisher.health.record(backend.inject_xid(0, 48))
        publisher.advertise(build_inventory(backend.devices(), publisher.health))
        assert gpu_memory(kube, name) == (str(2 * 15109), str(15109))
    finally:
        with contextlib.suppress(ApiError):
            kube.delete(f"/api/v1/nodes/{name}")


def node_annotations(kube: Kube, node: str) -> dict[str, str]:
    return dict(kube.get(f"/api/v1/nodes/{node}")["metadata"].get("annotations") or {})


def healthy_flags(text: str | None) -> list[bool]:
    return [gpu["healthy"] for gpu in json.loads(text or '{"gpus": []}')["gpus"]]


def test_a_restarted_agent_keeps_a_faulted_gpu_out_until_the_operator_clears_it(kube: Kube, gpu_node: str) -> None:
    """Before, the fault lived only in the agent's memory: a restarted agent (a rolling update, a crash)
    published the GPU that had fallen off the bus healthy again, and the scheduler placed work on it."""
    backend = FakeNvml.from_file(example_path("a100-nvlink"))
    uuids = [d.uuid for d in backend.devices()]
    first = InventoryPublisher(kube, gpu_node, backend, interval=1.0)
    first.start()
    try:
        wait_for("the first inventory", lambda: annotation(kube, gpu_node))
        backend.inject_xid(2, 79)
        wait_for("GPU 2 out of service", lambda: healthy_flags(annotation(kube, gpu_node))[2] is False, timeout=5)
    finally:
        first.stop()
    recorded = json.loads(node_annotations(kube, gpu_node)[ANNOTATION_GPU_FAULTS])
    assert list(recorded) == [uuids[2]]
    assert recorded[uuids[2]]["xid"] == 79

    # a new agent, a new backend that remembers nothing: every inventory it writes has GPU 2 unhealthy
    restarted = InventoryPublisher(kube, gpu_node, FakeNvml.from_file(example_path("a100-nvlink")), interval=1.0)
    written: list[list[bool]] = []
    real_patch = kube.patch

    def patch(path: str, body: Any, **kwargs: Any) -> Any:
        text = (body.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_INVENTORY) if isinstance(
            body, dict) else None
        if text:
            written.append(healthy_flags(text))
        return real_patch(path, body, **kwargs)

    with mock.patch.object(kube, "patch", side_effect=patch):
        restarted.start()
        try:
            wait_for("two inventories of the restarted agent", lambda: len(written) >= 2, timeout=10)
            assert all(flags[2] is False and flags.count(False) == 1 for flags in written), written
            assert restarted.health.faults()[uuids[2]].xid == 79

            # a malformed clear request clears nothing and stays for the operator to see
            kube.patch(f"/api/v1/nodes/{gpu_node}",
                       {"metadata": {"annotations": {ANNOTATION_GPU_FAULT_CLEAR: " , "}}})
            seen = len(written)
            wait_for("two more inventories", lambda: len(written) >= seen + 2, timeout=10)
            assert healthy_flags(annotation(kube, gpu_node))[2] is False
            assert node_annotations(kube, gpu_node)[ANNOTATION_GPU_FAULT_CLEAR] == " , "

            # the operator reset GPU 2 and clears it: back in service, the record and the request gone
            kube.patch(f"/api/v1/nodes/{gpu_node}",
                       {"metadata": {"annotations": {ANNOTATION_GPU_FAULT_CLEAR: f"GPU-none,{uuids[2]}"}}})
            wait_for("GPU 2 back in service", lambda: healthy_flags(annotation(kube, gpu_node))[2] is True,
                     timeout=10)
            left = node_annotations(kube, gpu_node)
            assert ANNOTATION_GPU_FAULTS not in left, left
            assert ANNOTATION_GPU_FAULT_CLEAR not in left, left
            assert restarted.failures == 0, restarted.last_error
        finally:
            restarted.stop()


def test_a_forged_or_stale_fault_record_never_stops_the_agent(kube: Kube, gpu_node: str) -> None:
    """A record an agent cannot read is logged and left out, entry by entry; a clear request left over with no
    fault is removed before it could clear a fault still to come."""
    backend = FakeNvml.from_file(example_path("a100-nvlink"))
    uuids = [d.uuid for d in backend.devices()]
    kube.patch(f"/api/v1/nodes/{gpu_node}", {"metadata": {"annotations": {
        ANNOTATION_GPU_FAULTS: json.dumps({uuids[0]: {"xid": "79", "at": "now"},
                                           uuids[5]: {"xid": 64, "at": "2026-12-03T10:00:00Z"}}),
        ANNOTATION_GPU_FAULT_CLEAR: "all"}}})
    publisher = InventoryPublisher(kube, gpu_node, backend, interval=1.0)
    publisher.start()
    try:
        wait_for("the first inventory", lambda: annotation(kube, gpu_node))
        # GPU 0's entry is malformed and left out; GPU 5's is taken back, and then the operator's "all" (written
        # while no agent ran) clears it: the request is followed after the record is read, never before
        assert healthy_flags(annotation(kube, gpu_node))[0] is True
        wait_for("the clear request followed", lambda: ANNOTATION_GPU_FAULT_CLEAR not in node_annotations(
            kube, gpu_node), timeout=10)
        wait_for("every GPU in service", lambda: all(healthy_flags(annotation(kube, gpu_node))), timeout=10)
        assert ANNOTATION_GPU_FAULTS not in node_annotations(kube, gpu_node)

        # a clear request written while no GPU is faulted is gone with the next inventory...
        kube.patch(f"/api/v1/nodes/{gpu_node}", {"metadata": {"annotations": {ANNOTATION_GPU_FAULT_CLEAR: "all"}}})
        wait_for("the stale request removed", lambda: ANNOTATION_GPU_FAULT_CLEAR not in node_annotations(
            kube, gpu_node), timeout=10)
        # ...so a fault that comes after it stays
        backend.inject_xid(3, 48)
        wait_for("GPU 3 out of service", lambda: healthy_flags(annotation(kube, gpu_node))[3] is False, timeout=5)
        time.sleep(2.5)
        assert healthy_flags(annotation(kube, gpu_node))[3] is False
        assert publisher.failures == 0, publisher.last_error
    finally:
        publisher.stop()
