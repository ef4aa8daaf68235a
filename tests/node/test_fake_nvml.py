"""The fake NVML backend: descriptions read and checked, topology, MIG, processes, XIDs; and the inventory
built from it as the scheduler reads it back."""

from __future__ import annotations

import json
import time

import pytest

from kubecell.core.errors import InvalidInputError
from kubecell.core.model import TopologyLevel
from kubecell.kube.inventory import node_view
from kubecell.kube.inventory_schema import parse_inventory
from kubecell.kube.names import ANNOTATION_INVENTORY
from kubecell.node.fake_nvml import FakeNvml, example_path
from kubecell.node.inventory import build_inventory
from kubecell.node.nvml import GpuBackend, GpuProcess
from kubecell.node.xid import CRITICAL_XIDS, HealthTracker, XidEvent

EIGHT = """\
name: n
gpus: [{product: NVIDIA A100-SXM4-40GB, count: 8}]
nvlink: [[0, 1, 2, 3], [4, 5, 6, 7]]
numa: [[0, 1, 2, 3], [4, 5, 6, 7]]
"""


def test_the_examples_load_and_satisfy_the_protocol() -> None:
    for name, count in (("a100-nvlink", 8), ("mixed-t4-v100", 8), ("a100-mig", 2)):
        backend = FakeNvml.from_file(example_path(name))
        assert isinstance(backend, GpuBackend)
        devices = backend.devices()
        assert [d.index for d in devices] == list(range(count))
        assert len({d.uuid for d in devices}) == count
    with pytest.raises(InvalidInputError, match="a100-nvlink"):
        example_path("nope")


def test_nvlink_islands_become_peers_and_numa_groups_numa_nodes() -> None:
    devices = FakeNvml.from_text(EIGHT).devices()
    assert devices[0].nvlink_peers == (1, 2, 3)
    assert devices[6].nvlink_peers == (4, 5, 7)
    assert [d.numa_node for d in devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert devices[0].memory_mib == 40536  # the catalog's A100
    mixed = FakeNvml.from_file(example_path("mixed-t4-v100")).devices()
    assert [d.product for d in mixed] == ["Tesla T4"] * 4 + ["Tesla V100-SXM2-32GB"] * 4
    assert mixed[0].nvlink_peers == ()
    assert mixed[0].memory_mib == 15109
    assert mixed[4].memory_mib == 32510


def test_uuids_are_stable_and_may_be_given() -> None:
    twice = [[d.uuid for d in FakeNvml.from_text(EIGHT).devices()] for _ in range(2)]
    assert twice[0] == twice[1]
    given = FakeNvml.from_text("gpus: [{product: Tesla T4, count: 2}]\nuuids: [GPU-a, GPU-b]").devices()
    assert [d.uuid for d in given] == ["GPU-a", "GPU-b"]


BAD = [
    ("[]", "expected a mapping"),
    ("name: x", "gpus"),
    ("gpus: [{product: Tesla T4}]\ngpu: 1", "gpu"),
    ("gpus: [{product: Tesla T4, count: 0}]", "count"),
    ("gpus: [{product: Acme X1}]", "no catalog memory size for product 'Acme X1'"),
    ("gpus: [{product: Tesla T4, count: 2}]\nnvlink: [[0, 2]]", "GPU index 2 does not exist"),
    ("gpus: [{product: Tesla T4, count: 4}]\nnvlink: [[0, 1], [1, 2]]", "GPU 1 is already in nvlink group 0"),
    ("gpus: [{product: Tesla T4, count: 2}]\nnuma: [[0], [5]]", "GPU index 5 does not exist"),
    ("gpus: [{product: Tesla T4, count: 2}]\nuuids: [GPU-a]", "1 UUIDs for 2 GPUs"),
    ("gpus: [{product: Tesla T4, count: 2}]\nuuids: [GPU-a, GPU-a]", "UUIDs repeat"),
    ("gpus: [{product: NVIDIA A100-SXM4-40GB}]\nmig: [{gpu: 0, instances: [{profile: 3g.20}]}]", "profile"),
    ("gpus: [{product: NVIDIA A100-SXM4-40GB}]\nmig: [{gpu: 0, instances: [{profile: 7g.40gb}, {profile: 1g.5gb}]}]",
     "no free placement of size 1"),
    ("gpus: [{product: NVIDIA A100-SXM4-40GB}]\nmig: [{gpu: 0, instances: [{profile: 3g.20gb, start: 0}, "
     "{profile: 2g.10gb, start: 2}]}]", "overlaps instance 0"),
    ("gpus: [{product: NVIDIA A100-SXM4-40GB}]\nmig: [{gpu: 0, instances: [{profile: 2g.10gb, start: 7}]}]",
     "ends past slice 8"),
    ("gpus: [{product: NVIDIA A100-SXM4-40GB}]\nmig: [{gpu: 1, instances: []}]", "GPU index 1 does not exist"),
    ("gpus: [{product: Tesla T4}]\nprocesses: [{gpu: 0, pid: 7, memoryMiB: 10, utilization: 150}]", "utilization"),
    ("gpus: [{product: Tesla T4}]\nxids: [{gpu: 3, code: 79}]", "GPU index 3 does not exist"),
    ("gpus: [{product: Tesla T4}]\ngpus: []", "duplicate key 'gpus'"),
]


@pytest.mark.parametrize(("text", "expected"), BAD)
def test_bad_descriptions_are_refused_naming_the_field(text: str, expected: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        FakeNvml.from_text(text, source="node.yaml")
    message = str(caught.value)
    assert expected in message, message
    assert message.startswith("node.yaml"), message


def test_mig_instances_are_placed_and_sized() -> None:
    devices = FakeNvml.from_file(example_path("a100-mig")).devices()
    assert devices[0].mig_mode == "enabled"
    assert devices[1].mig_mode == "disabled"
    placed = [(m.profile, m.start, m.size, m.memory_mib) for m in devices[0].mig_instances]
    assert placed == [("3g.20gb", 0, 4, 20480), ("2g.10gb", 4, 2, 10240), ("1g.5gb", 6, 1, 5120),
                      ("1g.5gb", 7, 1, 5120)]
    assert all(m.uuid.startswith("MIG-") for m in devices[0].mig_instances)


def test_processes_from_the_description_and_at_runtime() -> None:
    backend = FakeNvml.from_file(example_path("a100-nvlink"))
    assert backend.processes(1) == [GpuProcess(4242, 2048, 35)]
    assert backend.processes(0) == []
    backend.set_processes(0, [GpuProcess(9, 100, None)])
    assert backend.processes(0) == [GpuProcess(9, 100, None)]
    with pytest.raises(InvalidInputError, match="GPU index 8 does not exist"):
        backend.processes(8)


def test_an_injected_critical_xid_makes_the_gpu_unhealthy() -> None:
    backend = FakeNvml.from_text(EIGHT)
    health = HealthTracker()
    assert backend.wait_xid(0.05) is None
    app_error = backend.inject_xid(2, 13)
    assert backend.wait_xid(1.0) == app_error
    assert not health.record(app_error), "an application's XID 13 leaves the GPU healthy"
    fatal = backend.inject_xid(3, 79)
    event = backend.wait_xid(1.0)
    assert event == fatal
    assert event.uuid == backend.devices()[3].uuid
    assert health.record(event)
    assert not health.record(event), "a second hit is not a new change"
    inventory = build_inventory(backend.devices(), health)
    assert [g.healthy for g in inventory.gpus] == [True, True, True, False, True, True, True, True]
    assert health.clear(event.uuid)
    assert health.healthy(event.uuid)


def test_every_critical_xid_marks_a_gpu_unhealthy() -> None:
    for code in sorted(CRITICAL_XIDS):
        assert HealthTracker().record(XidEvent(0, "GPU-x", code, time.time())), code
    for code in (13, 31, 43, 45, 68):
        assert not HealthTracker().record(XidEvent(0, "GPU-x", code, time.time())), code


def test_a_waiter_wakes_at_once_when_an_xid_is_injected() -> None:
    import threading

    backend = FakeNvml.from_text(EIGHT)
    got: list[XidEvent | None] = []
    thread = threading.Thread(target=lambda: got.append(backend.wait_xid(10.0)))
    started = time.monotonic()
    thread.start()
    time.sleep(0.05)
    backend.inject_xid(5, 48)
    thread.join(5)
    assert got
    assert got[0] is not None
    assert got[0].index == 5
    assert time.monotonic() - started < 2.0


def test_scheduled_xids_arrive_at_their_time() -> None:
    now = [100.0]
    backend = FakeNvml.from_text(EIGHT + "xids: [{gpu: 6, code: 48, at: 30}, {gpu: 1, code: 94, at: 10}]",
                                 clock=lambda: now[0])
    assert backend.wait_xid(0) is None
    now[0] += 10
    first = backend.wait_xid(0)
    assert first is not None
    assert (first.index, first.code) == (1, 94)
    assert backend.wait_xid(0) is None
    now[0] += 25
    second = backend.wait_xid(0)
    assert second is not None
    assert (second.index, second.code) == (6, 48)


def test_a_closed_backend_refuses_calls() -> None:
    backend = FakeNvml.from_text(EIGHT)
    backend.close()
    with pytest.raises(InvalidInputError, match="closed"):
        backend.devices()
    with pytest.raises(InvalidInputError, match="closed"):
        backend.wait_xid(0)


def _node(annotation: str) -> dict[str, object]:
    return {"metadata": {"name": "n", "annotations": {ANNOTATION_INVENTORY: annotation}},
            "status": {"allocatable": {"cpu": "8", "memory": "64Gi"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def test_the_inventory_reads_back_as_the_scheduler_sees_it() -> None:
    backend = FakeNvml.from_file(example_path("a100-nvlink"))
    health = HealthTracker()
    health.record(backend.inject_xid(7, 79))
    text = build_inventory(backend.devices(), health, heartbeat="2026-11-23T12:00:00Z").to_annotation()
    assert "migInstances" not in text, "left out when empty: older schedulers keep reading the annotation"
    parsed = parse_inventory(text, node="n")
    assert [g.model for g in parsed.gpus] == ["A100"] * 8
    assert parsed.gpus[0].product == "NVIDIA A100-SXM4-40GB"
    assert parsed.gpus[4].nvlink_peers == [5, 6, 7]
    assert parsed.gpus[4].numa_node == 1
    view = node_view(_node(text))
    assert view.node is not None
    assert view.source == "inventory"
    assert view.node.groups_at(TopologyLevel.NVLINK) == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert view.node.groups_at(TopologyLevel.NUMA) == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert [g.healthy for g in view.node.gpus] == [True] * 7 + [False]
    assert view.uuids == tuple(d.uuid for d in backend.devices())


def test_mig_instances_round_trip_through_the_annotation() -> None:
    backend = FakeNvml.from_file(example_path("a100-mig"))
    text = build_inventory(backend.devices(), HealthTracker()).to_annotation()
    raw = json.loads(text)
    assert "migInstances" not in raw["gpus"][1]
    parsed = parse_inventory(text, node="n")
    assert [(m.profile, m.start, m.size) for m in parsed.gpus[0].mig_instances] == [
        ("3g.20gb", 0, 4), ("2g.10gb", 4, 2), ("1g.5gb", 6, 1), ("1g.5gb", 7, 1)]
    old = json.dumps({"schema": "kubecell.io/gpu-inventory/v1", "gpus": [
        {"index": 0, "uuid": "GPU-0", "model": "A100", "memoryMiB": 40536, "migMode": "enabled"}]})
    assert parse_inventory(old, node="n").gpus[0].mig_instances == [], "annotations without MIG instances parse"


def test_a_mixed_model_node_is_published_but_the_scheduler_says_why_it_skips_it() -> None:
    backend = FakeNvml.from_file(example_path("mixed-t4-v100"))
    text = build_inventory(backend.devices(), HealthTracker()).to_annotation()
    assert [g.model for g in parse_inventory(text, node="n").gpus] == ["T4"] * 4 + ["V100M32"] * 4
    with pytest.raises(InvalidInputError, match="mixes GPU models"):
        node_view(_node(text))
