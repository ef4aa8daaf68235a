"""The allocation record: built from core allocations, round trips, refusals, and the GPU environment."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from kubecell.core.book import AllocationBook
from kubecell.core.engine.job import JobClass
from kubecell.core.errors import InvalidInputError
from kubecell.core.model import Allocation, Request, make_node
from kubecell.kube.inventory import NodeView, inventory_of, node_view
from kubecell.kube.names import ANNOTATION_ALLOCATION, ANNOTATION_INVENTORY
from kubecell.kube.records import (
    ALLOCATION_SCHEMA,
    AllocationRecord,
    RecordError,
    allocation_id,
    gpu_environment,
    parse_record,
    record_for,
)

WHEN = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
NODE = make_node("n1", cpu_milli=64_000, memory_mib=512_000, gpu_count=4, gpu_model="A100",
                 nvlink_groups=[[0, 1], [2, 3]])
UUIDS = ("GPU-aaaa", "GPU-bbbb", "GPU-cccc", "GPU-dddd")


def view_of(node: Any = NODE, uuids: tuple[str, ...] = UUIDS) -> NodeView:
    """The node as the scheduler reads it from the API: through its inventory annotation."""
    obj = {"metadata": {"name": node.name, "annotations": {
               ANNOTATION_INVENTORY: inventory_of(node, list(uuids)).to_annotation()}},
           "spec": {}, "status": {"allocatable": {"cpu": "64", "memory": "500Gi"},
                                  "conditions": [{"type": "Ready", "status": "True"}]}}
    return node_view(obj)


def allocate(request: Request, gpus: tuple[int, ...]) -> Allocation:
    """An allocation made by the real allocation book, so records are built from what the core returns."""
    return AllocationBook([NODE]).allocate(request, 0, gpus)


def record(request: Request, gpus: tuple[int, ...], **overrides: Any) -> AllocationRecord:
    fields: dict[str, Any] = {"pod": "team-a/p1", "pod_uid": "7c1e0c3a-1", "attempt": 0, "job": "team-a/train",
                              "vc": "team-a", "job_class": JobClass.BORROWED, "member": 2,
                              "batch": 4, "scheduler": "kubecell/scheduler-0", "created_at": WHEN}
    fields.update(overrides)
    return record_for(allocate(request, gpus), view_of(), **fields)


SHARE = Request("team-a/p1", cpu_milli=4000, memory_mib=16_384, gpu_count=1, gpu_milli=500, gpu_memory_mib=8192)
WHOLE = Request("team-a/p1", cpu_milli=8000, memory_mib=32_768, gpu_count=2, gpu_milli=1000)
MEMORY_ONLY = Request("team-a/p1", cpu_milli=1000, memory_mib=1024, gpu_count=1, gpu_memory_mib=4096)
CPU_ONLY = Request("team-a/p1", cpu_milli=1000, memory_mib=1024)


# ---------------------------------------------------------------- building and round trips

def test_record_of_a_share_names_the_gpu_by_uuid_and_keeps_the_share() -> None:
    rec = record(SHARE, (2,))
    assert json.loads(rec.to_annotation()) == {
        "schema": "kubecell.io/allocation/v1", "allocationId": "7c1e0c3a-1-0", "podUID": "7c1e0c3a-1",
        "attempt": 0, "node": "n1", "gpus": [{"index": 2, "uuid": "GPU-cccc", "milli": 500, "memoryMiB": 8192}],
        "cpuMilli": 4000, "memoryMiB": 16384, "isolation": "accounting", "job": "team-a/train", "vc": "team-a",
        "class": "borrowed", "member": 2, "batch": 4, "scheduler": "kubecell/scheduler-0",
        "createdAt": "2026-11-23T12:00:00Z"}


def test_record_of_whole_gpus_holds_each_gpus_own_memory() -> None:
    rec = record(WHOLE, (0, 1), isolation="mps", job_class=JobClass.GUARANTEED)
    assert [(g.index, g.uuid, g.milli, g.memory_mib) for g in rec.gpus] == [
        (0, "GPU-aaaa", 1000, 40536), (1, "GPU-bbbb", 1000, 40536)]
    assert (rec.isolation, rec.job_class) == ("mps", "guaranteed")


@pytest.mark.parametrize(("request_", "gpus"), [(SHARE, (3,)), (WHOLE, (2, 3)), (MEMORY_ONLY, (0,)), (CPU_ONLY, ())],
                         ids=["share", "whole", "memory only", "cpu only"])
def test_records_round_trip_through_the_annotation(request_: Request, gpus: tuple[int, ...]) -> None:
    rec = record(request_, gpus)
    text = rec.to_annotation()
    again = parse_record(text, pod="team-a/p1", uid="7c1e0c3a-1")
    assert again == rec
    assert again.to_annotation() == text


def test_times_keep_their_instant_whatever_zone_they_were_written_in() -> None:
    paris = timezone(timedelta(hours=1))
    rec = record(SHARE, (0,), created_at=datetime(2026, 11, 23, 13, 30, 0, 250_000, tzinfo=paris))
    assert json.loads(rec.to_annotation())["createdAt"] == "2026-11-23T12:30:00.250000Z"
    assert parse_record(rec.to_annotation(), pod="team-a/p1").created_at == rec.created_at


def test_allocation_ids_are_deterministic_and_unique_per_attempt() -> None:
    assert allocation_id("uid-1", 0) == allocation_id("uid-1", 0) == "uid-1-0"
    assert len({allocation_id("uid-1", 0), allocation_id("uid-1", 1), allocation_id("uid-2", 0)}) == 3
    assert record(SHARE, (0,), attempt=3).allocation_id == "7c1e0c3a-1-3"
    with pytest.raises(InvalidInputError, match="attempt -1 is negative"):
        allocation_id("uid-1", -1)


def test_record_for_refuses_what_it_cannot_name() -> None:
    with pytest.raises(RecordError, match="allocation is on node 'n1' but the node given is 'n2'"):
        record_for(allocate(SHARE, (0,)), view_of(make_node("n2", cpu_milli=1000, memory_mib=1000, gpu_count=1,
                                                            gpu_model="T4"), ("GPU-x",)),
                   pod="a/p", pod_uid="u", attempt=0, job="a/p", vc="a", job_class=JobClass.GUARANTEED, member=0,
                   scheduler="s", created_at=WHEN)
    gfd_only = NodeView("n1", NODE, source="gfd")  # GPUs known from GFD labels: no UUIDs
    with pytest.raises(RecordError, match=re.escape("pod a/p: annotation kubecell.io/allocation: node n1 reports "
                                                    "no UUID for GPU 1 (inventory source: gfd)")):
        record_for(allocate(SHARE, (1,)), gfd_only, pod="a/p", pod_uid="u", attempt=0, job="a/p", vc="a",
                   job_class=JobClass.GUARANTEED, member=0, scheduler="s", created_at=WHEN)
    with pytest.raises(RecordError, match="createdAt: 2026-11-23T12:00:00 has no time zone"):
        record(SHARE, (0,), created_at=WHEN.replace(tzinfo=None))
    with pytest.raises(RecordError, match="vc: must not be empty"):
        record(SHARE, (0,), vc="")


# ---------------------------------------------------------------- malformed records

GOOD: dict[str, Any] = json.loads(record(SHARE, (2,)).to_annotation())


def changed(**fields: Any) -> str:
    data = dict(GOOD)
    for key, value in fields.items():
        key = {"class_": "class"}.get(key, key)
        if value is ...:
            del data[key]
        else:
            data[key] = value
    return json.dumps(data)


WHERE = f"pod team-a/p1: annotation {ANNOTATION_ALLOCATION}"


@pytest.mark.parametrize(("text", "message"), [
    ("{", "is not JSON (Expecting property name enclosed in double quotes at character 1)"),
    ("[]", "is not a JSON object"),
    ('{"schema": "kubecell.io/allocation/v1", "schema": "x"}', "has the key 'schema' twice"),
    (changed(schema=...), "has no schema (accepted: kubecell.io/allocation/v1)"),
    (changed(schema="kubecell.io/allocation/v2"), "schema 'kubecell.io/allocation/v2' is not a version this "
                                                  "kubecell reads (accepted: kubecell.io/allocation/v1)"),
    (changed(schema="hami.io/vgpu-devices-allocated"), "schema 'hami.io/vgpu-devices-allocated' is not an "
                                                       "allocation record"),
    (changed(vc=...), "vc: required key missing"),
    (changed(color="blue"), "color: unknown key 'color' (accepted: schema, allocationId"),
    (changed(attempt="0"), "attempt: must be a whole number, got '0' (accepted: a whole number >= 0)"),
    (changed(member=True), "member: must be a whole number, got true (accepted: a whole number >= 0)"),
    (changed(cpuMilli=-1), "cpuMilli: must be at least 0, got -1"),
    (changed(node=""), "node: must not be empty"),
    (changed(isolation="hami-core"), "isolation: must be 'accounting', 'mps' or 'mig', got 'hami-core' "
                                     "(accepted: accounting, mps, mig)"),
    (changed(class_="best-effort"), "class: must be 'guaranteed', 'borrowed' or 'opportunistic'"),
    (changed(createdAt="yesterday"), "createdAt: 'yesterday' is not a time with a zone (accepted: RFC 3339"),
    (changed(createdAt="2026-11-23T12:00:00"), "createdAt: '2026-11-23T12:00:00' is not a time with a zone"),
    (changed(createdAt=1700000000), "createdAt: is the wrong kind of value, got 1700000000"),
    (changed(gpus={"index": 0}), "gpus: must be a list, got a mapping"),
    (changed(gpus=[{"index": 0, "uuid": "GPU-a", "milli": 1500, "memoryMiB": 0}]),
     "gpus[0].milli: must be at most 1000, got 1500 (accepted: 0..1000)"),
    (changed(gpus=[{"index": 64, "uuid": "GPU-a", "milli": 500, "memoryMiB": 0}]),
     "gpus[0].index: must be less than 64, got 64"),
    (changed(gpus=[{"index": 0, "uuid": "GPU-a", "milli": 500}]),
     "gpus[0].memoryMiB: required key missing (accepted: index, uuid, milli, memoryMiB)"),
    (changed(gpus=[{"index": 0, "uuid": "", "milli": 500, "memoryMiB": 0}]), "gpus[0].uuid: must not be empty"),
    (changed(allocationId="7c1e0c3a-1-9"), "allocationId: is '7c1e0c3a-1-9' but podUID and attempt give "
                                           "'7c1e0c3a-1-0'"),
    (changed(gpus=[{"index": 0, "uuid": "GPU-a", "milli": 1000, "memoryMiB": 0},
                   {"index": 0, "uuid": "GPU-b", "milli": 1000, "memoryMiB": 0}]), "gpus: names GPU indices [0, 0]"),
    (changed(gpus=[{"index": 0, "uuid": "GPU-a", "milli": 1000, "memoryMiB": 0},
                   {"index": 1, "uuid": "GPU-a", "milli": 1000, "memoryMiB": 0}]), "gpus: names one GPU UUID twice"),
    (changed(gpus=[{"index": 0, "uuid": "GPU-a", "milli": 500, "memoryMiB": 0},
                   {"index": 1, "uuid": "GPU-b", "milli": 500, "memoryMiB": 0}]),
     "gpus[0].milli: is 500 on a record of 2 GPUs"),
    (changed(gpus=[{"index": 0, "uuid": "GPU-a", "milli": 0, "memoryMiB": 0}]),
     "gpus[0]: holds neither compute nor memory of the GPU"),
])
def test_malformed_records_are_refused_with_the_pod_and_the_field(text: str, message: str) -> None:
    with pytest.raises(RecordError) as caught:
        parse_record(text, pod="team-a/p1")
    rendered = str(caught.value)
    assert rendered.startswith(f"{WHERE}: "), rendered
    assert message in rendered
    for leak in ("pydantic", "Input should", "YAML"):
        assert leak not in rendered


def test_a_record_copied_from_another_pod_is_refused() -> None:
    text = record(SHARE, (0,)).to_annotation()
    with pytest.raises(RecordError, match=re.escape("podUID: was written for pod UID '7c1e0c3a-1', not this pod "
                                                    "('0d9e-other')")):
        parse_record(text, pod="team-a/p1", uid="0d9e-other")


# ---------------------------------------------------------------- the environment the node agent injects

def test_accounting_environment_of_a_share() -> None:
    assert gpu_environment(record(SHARE, (2,))) == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-cccc", "CUDA_VISIBLE_DEVICES": "GPU-cccc", "KUBECELL_GPU_UUIDS": "GPU-cccc",
        "KUBECELL_GPU_MILLI": "500", "KUBECELL_GPU_MEMORY_MIB": "8192", "KUBECELL_ALLOCATION_ID": "7c1e0c3a-1-0",
        "KUBECELL_ISOLATION": "accounting"}


def test_accounting_environment_of_whole_gpus() -> None:
    env = gpu_environment(record(WHOLE, (1, 3)))
    assert env["NVIDIA_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"] == "GPU-bbbb,GPU-dddd"
    assert (env["KUBECELL_GPU_MILLI"], env["KUBECELL_GPU_MEMORY_MIB"]) == ("1000", "40536")
    assert not any(key.startswith("CUDA_MPS") for key in env)


def test_compute_only_share_states_no_memory_budget() -> None:
    compute = Request("team-a/p1", cpu_milli=1000, memory_mib=1024, gpu_count=1, gpu_milli=250)
    env = gpu_environment(record(compute, (0,)))
    assert "KUBECELL_GPU_MEMORY_MIB" not in env
    assert env["KUBECELL_GPU_MILLI"] == "250"


@pytest.mark.parametrize(("request_", "gpus", "mps"), [
    (SHARE, (1,), {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8192M"}),
    (Request("a/p", gpu_count=1, gpu_milli=333), (0,), {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "33"}),
    (Request("a/p", gpu_count=1, gpu_milli=5), (0,), {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "1"}),
    (MEMORY_ONLY, (0,), {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M"}),
    (WHOLE, (0, 1), {}),
], ids=["share", "rounded down", "at least 1 %", "memory only", "whole GPUs: no limits"])
def test_mps_environment_limits_a_share(request_: Request, gpus: tuple[int, ...], mps: dict[str, str]) -> None:
    env = gpu_environment(record(request_, gpus, isolation="mps"))
    assert {key: value for key, value in env.items() if key.startswith("CUDA_MPS")} == mps
    assert env["KUBECELL_ISOLATION"] == "mps"


def test_a_pod_without_gpus_sees_none() -> None:
    assert gpu_environment(record(CPU_ONLY, ())) == {"NVIDIA_VISIBLE_DEVICES": "void"}


def test_mig_names_the_one_instance_and_nothing_else() -> None:
    mig_view = NodeView("n1", NODE, uuids=tuple(f"MIG-{i:04d}" for i in range(len(NODE.gpus))), source="inventory")
    whole_one = Request("a/p", gpu_count=1, gpu_milli=1000)
    allocation = Allocation(whole_one, "n1", (1,), 1000, 0)
    built = record_for(allocation, mig_view, pod="a/p", pod_uid="uid-1", attempt=0, job="a/p", vc="default",
                       job_class=JobClass.GUARANTEED, member=0, scheduler="kubecell/test", created_at=WHEN,
                       isolation="mig")
    env = gpu_environment(built)
    assert env["NVIDIA_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"] == "MIG-0001"
    assert env["KUBECELL_ISOLATION"] == "mig"
    assert not any(key.startswith("CUDA_MPS") for key in env)
    with pytest.raises(RecordError, match="one MIG instance"):
        gpu_environment(record(SHARE, (0,), isolation="mig"))  # a record naming a GPU, not an instance


def test_schema_constant_matches_the_model() -> None:
    assert AllocationRecord.model_fields["schema_"].default == ALLOCATION_SCHEMA == GOOD["schema"]
