"""A record the node agent did not hand out has no effect on the node, on every path: a pod admitted across an
agent restart is checked as covered by the kubelet's devices as any other (its last container refused, never
acknowledged by the housekeeping unchecked), and the overuse monitor holds a pod served by kubecell's device plugin
to what the kubelet gave it, not to what its record says now. No API server: the fakes of
``test_hostile_node_inputs``."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import pytest

from kubecell.kube.names import ANNOTATION_ACK, RESOURCE_GPU_MEMORY
from kubecell.kube.rest import Kube
from kubecell.node.allocator import RecordAllocator
from kubecell.node.deviceplugin import GPU_RESOURCE, MILLI_RESOURCE, AllocationRefused
from kubecell.node.fake_nvml import FakeNvml
from kubecell.node.grants import spec_memory_mib
from kubecell.node.nvml import GpuProcess
from kubecell.node.overuse import OveruseMonitor
from kubecell.node.podresources import ContainerDevices, PodDevices
from tests.node.test_hostile_node_inputs import (
    FAKE,
    GPU0,
    GPU1,
    NODE,
    UID,
    FakeKube,
    allocator_for,
    gpu_pod,
    put_proc,
    record,
)


def slots(start: int, stop: int, gpu: str = GPU0) -> list[str]:
    return [f"{gpu}::{k}" for k in range(start, stop)]


class Kubelet:
    """The kubelet's side of one pod's admission: each container's devices, recorded once its Allocate returned,
    and what PodResources then answers for the pod."""

    def __init__(self) -> None:
        self.assigned: dict[str, dict[str, tuple[str, ...]]] = {}
        self.asked = 0

    def get(self, namespace: str, name: str) -> PodDevices:
        self.asked += 1
        return PodDevices(namespace, name, tuple(ContainerDevices(c, d) for c, d in self.assigned.items()))

    def admit(self, allocator: RecordAllocator, container: str, resource: str, ids: list[str]) -> None:
        allocator.allocate(resource, [ids])
        self.assigned[container] = {resource: tuple(ids)}


def agent(kube: FakeKube, kubelet: Kubelet) -> RecordAllocator:
    allocator = allocator_for(kube, PodDevices("ns", "p", ()))
    allocator.verify = kubelet.get
    return allocator


def acks(kube: FakeKube) -> list[str]:
    return [body["metadata"]["annotations"][ANNOTATION_ACK] for _, body in kube.patched]


# ------------------------------------------------------------------------ an agent restart between containers
def test_a_pod_admitted_across_an_agent_restart_is_checked_as_covered_at_its_last_container() -> None:
    """Two containers ask 100 milli-GPU slots each; the record grants 500. Without a restart the second call is
    refused (``_check_covered``). Across one, the new agent counted only the second container, answered it with
    the record's 500 milli in its environment (the pod started so), and ``settle`` acknowledged it from
    PodResources: every device on a GPU the record names, none checked the other way."""
    kube = FakeKube([gpu_pod([("a", MILLI_RESOURCE), ("b", MILLI_RESOURCE)], record(UID, [(0, GPU0, 500, 10_000)]))])
    kubelet = Kubelet()
    kubelet.admit(agent(kube, kubelet), "a", MILLI_RESOURCE, slots(0, 100))
    restarted = agent(kube, kubelet)
    with pytest.raises(AllocationRefused, match="kubelet gave its containers slots of"):
        kubelet.admit(restarted, "b", MILLI_RESOURCE, slots(100, 200))
    assert acks(kube) == []
    kubelet.assigned["b"] = {MILLI_RESOURCE: tuple(slots(100, 200))}  # as if the kubelet had gone on
    later = agent(kube, kubelet)
    for _ in range(2):
        assert later.settle() == [], "the housekeeping checks it too"
    assert acks(kube) == []
    refusals = [body["message"] for _, body in kube.created if body.get("reason") == "GPUAllocationRefused"]
    assert len(refusals) == 2, "one refusal at the call, one (and only one) from the housekeeping"
    assert all("200 of 500" in message for message in refusals), refusals


def test_a_covered_pod_admitted_across_an_agent_restart_is_acknowledged_at_its_last_container() -> None:
    kube = FakeKube([gpu_pod([("a", MILLI_RESOURCE), ("b", MILLI_RESOURCE)], record(UID, [(0, GPU0, 200, 10_000)]))])
    kubelet = Kubelet()
    kubelet.admit(agent(kube, kubelet), "a", MILLI_RESOURCE, slots(0, 100))
    restarted = agent(kube, kubelet)
    restarted.verify_after = 0.05
    kubelet.admit(restarted, "b", MILLI_RESOURCE, slots(100, 200))
    assert acks(kube) == [f"{UID}-0"], "no need to wait for the housekeeping"
    time.sleep(0.5)  # the PodResources check after the acknowledgement: both containers' slots, as served
    assert restarted.mismatches == 0
    assert not [body for _, body in kube.created if body.get("reason") == "GPUAllocationRefused"]


def test_without_a_restart_pod_resources_is_asked_once_and_the_last_container_acknowledges() -> None:
    """A pod of three GPU containers served by one agent: PodResources is asked at its first call only (a fresh
    agent cannot tell a first call from one after its restart), and counting what it shows never counts a
    container twice."""
    kube = FakeKube([gpu_pod([("a", GPU_RESOURCE), ("b", GPU_RESOURCE), ("c", MILLI_RESOURCE)],
                             record(UID, [(0, GPU0, 1000, 40_536), (1, GPU1, 1000, 40_536)]))])
    kubelet = Kubelet()
    serving = agent(kube, kubelet)
    kubelet.admit(serving, "a", GPU_RESOURCE, [GPU0])
    kubelet.admit(serving, "b", GPU_RESOURCE, [GPU1])
    assert acks(kube) == []
    kubelet.admit(serving, "c", MILLI_RESOURCE, slots(0, 10))
    assert acks(kube) == [f"{UID}-0"]
    assert kubelet.asked == 1


def test_a_restart_after_the_second_of_three_containers_counts_both_earlier_ones() -> None:
    """A pod bound by hand asks GPU 0 and slots of it; its record names GPU 1 as well."""
    kube = FakeKube([gpu_pod([("a", GPU_RESOURCE), ("b", MILLI_RESOURCE), ("c", MILLI_RESOURCE)],
                             record(UID, [(0, GPU0, 1000, 40_536), (1, GPU1, 1000, 40_536)]))])
    kubelet = Kubelet()
    before = agent(kube, kubelet)
    kubelet.admit(before, "a", GPU_RESOURCE, [GPU0])
    kubelet.admit(before, "b", MILLI_RESOURCE, slots(0, 10))
    with pytest.raises(AllocationRefused, match=f"names GPU\\(s\\) {GPU1}"):
        kubelet.admit(agent(kube, kubelet), "c", MILLI_RESOURCE, slots(10, 20))
    assert acks(kube) == []


# ---------------------------------------------------------------------------------------------- overuse
def served_pod(annotation: str, resource: str = MILLI_RESOURCE) -> dict[str, Any]:
    """A running pod on NODE served by kubecell's device plugin (it asks ``resource``), with its record now."""
    pod = gpu_pod([("main", resource)], annotation)
    pod["status"] = {"phase": "Running"}
    return pod


def watch(tmp_path: Path, pod: dict[str, Any], handed: Mapping[tuple[str, str], list[str]] | None,
          kube: FakeKube | None = None) -> tuple[FakeNvml, OveruseMonitor]:
    nvml = FakeNvml.from_text(FAKE)
    put_proc(tmp_path, 100, UID)
    source = (lambda: handed) if handed is not None else None
    return nvml, OveruseMonitor(cast(Kube, kube or FakeKube()), NODE, nvml, lambda: [pod], None, proc_root=tmp_path,
                                window=3, handed=source)


def sample(nvml: FakeNvml, monitor: OveruseMonitor, gpu: int, memory_mib: int, utilization: int) -> set[str]:
    found: set[str] = set()
    for _ in range(3):
        for index in (0, 1):
            nvml.set_processes(index, [GpuProcess(100, memory_mib, utilization)] if index == gpu else [])
        found = {finding.kind for finding in monitor.sample()}
    return found


def test_a_share_whose_record_was_rewritten_to_a_whole_gpu_is_held_to_the_slots_it_was_given(tmp_path: Path) -> None:
    """The pod was admitted with 250 milli-GPU slots of GPU 0 and its record then edited (no admission policy) to
    grant the whole GPU: a whole GPU is never over, so it used all of it unseen. It is held to its 250 slots."""
    pod = served_pod(record(UID, [(0, GPU0, 1000, 40_536)]))
    nvml, monitor = watch(tmp_path, pod, {("ns", "p"): slots(0, 250)})
    assert sample(nvml, monitor, 0, 30_000, 100) == {"utilization"}
    honest = served_pod(record(UID, [(0, GPU0, 250, 40_536)]))
    nvml, monitor = watch(tmp_path, honest, {("ns", "p"): slots(0, 250)})
    assert sample(nvml, monitor, 0, 30_000, 20) == set(), "within the slots it was given"


def test_a_record_naming_a_gpu_the_kubelet_did_not_give_grants_nothing_there(tmp_path: Path) -> None:
    """The pod was given GPU 0; its record names GPU 1 as well (the GPU another pod runs on). Its use of GPU 1
    is use of a GPU nobody gave it: over on memory, as for a GPU its record does not name."""
    pod = served_pod(record(UID, [(0, GPU0, 1000, 40_536), (1, GPU1, 1000, 40_536)]), GPU_RESOURCE)
    kube = FakeKube()
    nvml, monitor = watch(tmp_path, pod, {("ns", "p"): [GPU0]}, kube)
    assert sample(nvml, monitor, 1, 20_000, 50) == {"memory", "utilization"}
    messages = [body["message"] for _, body in kube.created]
    assert any("the kubelet gave it no device" in message for message in messages), messages
    assert sample(nvml, monitor, 0, 40_000, 100) == set(), "its own GPU is its own"


def test_a_pod_served_by_the_plugin_and_not_listed_by_the_kubelet_is_given_nothing(tmp_path: Path) -> None:
    pod = served_pod(record(UID, [(0, GPU0, 1000, 40_536)]), GPU_RESOURCE)
    nvml, monitor = watch(tmp_path, pod, {})
    assert sample(nvml, monitor, 0, 20_000, 50) == {"memory", "utilization"}


def test_records_are_taken_as_written_where_the_agent_served_nothing_or_cannot_ask(tmp_path: Path) -> None:
    """A pod that asks none of kubecell's device-plugin resources (a share asked by labels, a whole GPU of
    NVIDIA's plugin, a claim) was handed nothing by this agent: its record is all there is. Nor does a kubelet
    whose PodResources does not answer make every served pod over."""
    alone = served_pod(record(UID, [(0, GPU0, 1000, 40_536)]))
    alone["spec"]["containers"][0]["resources"] = {}
    nvml, monitor = watch(tmp_path, alone, {})
    assert sample(nvml, monitor, 0, 30_000, 100) == set()

    def away() -> Mapping[tuple[str, str], list[str]]:
        raise OSError("no such socket")

    pod = served_pod(record(UID, [(0, GPU0, 250, 40_536)]))
    nvml, monitor = watch(tmp_path, pod, None)
    monitor.handed = away
    assert sample(nvml, monitor, 0, 1_000, 20) == set()


def claim_pod(annotation: str) -> dict[str, Any]:
    """A pod whose GPU is a DRA claim: no extended resource, its claim made from a template for it."""
    pod = served_pod(annotation)
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "share"}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    pod["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": "p-gpu-x1"}]
    return pod


def test_a_claim_pod_is_held_to_what_this_agent_prepared_for_its_claim(tmp_path: Path) -> None:
    """A pod holding a 250 milli-GPU, 10 GiB DRA share rewrote its record to the whole GPU: the monitor took the
    record as written (a claim pod asks no device-plugin resource), and a whole GPU is never over. The DRA
    plugin's checkpoint says what it prepared: the pod is held to that."""
    prepared = {("ns", "p-gpu-x1"): {GPU0: (250, 10_240)}, ("ns", "other"): {GPU0: (750, 0)}}
    pod = claim_pod(record(UID, [(0, GPU0, 1000, 40_536)]))
    nvml, monitor = watch(tmp_path, pod, None)
    monitor.claimed = lambda: prepared
    assert sample(nvml, monitor, 0, 38_000, 100) == {"memory", "utilization"}
    honest = claim_pod(record(UID, [(0, GPU0, 250, 10_240)]))
    nvml, monitor = watch(tmp_path, honest, None)
    monitor.claimed = lambda: prepared
    assert sample(nvml, monitor, 0, 9_000, 20) == set(), "within what its claim takes"
    assert sample(nvml, monitor, 1, 1_000, 5) == {"memory"}, "its claim takes nothing of GPU 1"
    unknown = {("ns", "p-gpu-x1"): None}  # kept by an older agent without its GPUs: the record as written
    nvml, monitor = watch(tmp_path, pod, None)
    monitor.claimed = lambda: unknown
    assert sample(nvml, monitor, 0, 38_000, 100) == set()


def test_the_agent_holds_the_monitor_to_its_own_plugins_devices_only() -> None:
    """What ``NodeAgent`` gives the monitor: each pod's devices of kubecell's two resources, from one PodResources
    ``List``; another device plugin's (NVIDIA's ``nvidia.com/gpu``) were not handed out by this agent."""
    from kubecell.node.agent import plugin_devices

    class Client:
        def list(self) -> list[PodDevices]:
            return [PodDevices("ns", "p", (ContainerDevices("a", {GPU_RESOURCE: (GPU0,), "nvidia.com/gpu": ("GPU-x",)}),
                                           ContainerDevices("b", {MILLI_RESOURCE: (f"{GPU1}::0",)}))),
                    PodDevices("ns", "other", (ContainerDevices("c", {"nvidia.com/gpu": ("GPU-y",)}),))]

    assert plugin_devices(cast(Any, Client())) == {("ns", "p"): [GPU0, f"{GPU1}::0"], ("ns", "other"): []}


# ------------------------------------------------------------------------------- memory: the spec's ask bounds it
def asking_memory(annotation: str, memory: str | None, resource: str = MILLI_RESOURCE,
                  amount: str = "250") -> dict[str, Any]:
    """A served pod whose container asks ``amount`` of ``resource`` and ``memory`` MiB of
    ``kubecell.io/gpu-memory`` (None: no memory ask), as the scheduler placed it; ``annotation`` is its record now."""
    pod = served_pod(annotation, resource)
    limits: dict[str, str] = {resource: amount}
    if memory is not None:
        limits[RESOURCE_GPU_MEMORY] = memory
    pod["spec"]["containers"][0]["resources"] = {"limits": limits}
    return pod


def test_a_share_whose_record_was_rewritten_to_more_memory_is_held_to_its_specs_ask(tmp_path: Path) -> None:
    """The pod asked 250 milli-GPU and 10,000 MiB (its spec, immutable); its record was then edited to grant
    40,000 MiB. It is held to the 10,000 it asked: its 30,000 MiB are over, and the Event says why."""
    pod = asking_memory(record(UID, [(0, GPU0, 250, 40_000)]), "10000")
    kube = FakeKube()
    nvml, monitor = watch(tmp_path, pod, {("ns", "p"): slots(0, 250)}, kube)
    assert sample(nvml, monitor, 0, 30_000, 20) == {"memory"}
    messages = [body["message"] for _, body in kube.created]
    assert any("grants 10000 MiB" in message and "asks 10000 MiB" in message for message in messages), messages
    honest = asking_memory(record(UID, [(0, GPU0, 250, 10_000)]), "10000")
    nvml, monitor = watch(tmp_path, honest, {("ns", "p"): slots(0, 250)})
    assert sample(nvml, monitor, 0, 9_000, 20) == set(), "within what it asked"


def test_the_specs_ask_bounds_memory_when_the_kubelet_cannot_be_asked(tmp_path: Path) -> None:
    """The spec needs no kubelet: with PodResources away, a rewritten record is still held to the spec's ask."""
    pod = asking_memory(record(UID, [(0, GPU0, 250, 40_000)]), "10000")
    nvml, monitor = watch(tmp_path, pod, None)
    assert sample(nvml, monitor, 0, 30_000, 20) == {"memory"}


def test_a_record_rewritten_to_no_memory_or_a_whole_gpu_does_not_escape_the_specs_ask(tmp_path: Path) -> None:
    """``memoryMiB`` 0 (compute only) is not checked on memory, and a whole GPU never is: a record rewritten to
    either, while the spec asks a memory share, is held to the ask all the same."""
    for forged in (record(UID, [(0, GPU0, 250, 0)]), record(UID, [(0, GPU0, 1000, 40_536)])):
        pod = asking_memory(forged, "10000", resource=RESOURCE_GPU_MEMORY, amount="10000")
        nvml, monitor = watch(tmp_path, pod, None)
        assert "memory" in sample(nvml, monitor, 0, 30_000, 20), forged


def test_a_share_is_held_to_the_smaller_of_its_record_and_its_ask(tmp_path: Path) -> None:
    """The bound only lowers: a record granting less than the spec asked (or a spec that states no memory) is
    held to the record, as before."""
    pod = asking_memory(record(UID, [(0, GPU0, 250, 8_000)]), "10000")
    nvml, monitor = watch(tmp_path, pod, {("ns", "p"): slots(0, 250)})
    assert sample(nvml, monitor, 0, 9_000, 20) == {"memory"}
    silent = asking_memory(record(UID, [(0, GPU0, 250, 40_000)]), None)
    nvml, monitor = watch(tmp_path, silent, {("ns", "p"): slots(0, 250)})
    assert sample(nvml, monitor, 0, 30_000, 20) == set(), "no memory ask: the record is all there is"


def test_the_ask_is_summed_over_the_containers_as_the_kubelet_counts_it(tmp_path: Path) -> None:
    pod = asking_memory(record(UID, [(0, GPU0, 250, 40_000)]), "6000")
    pod["spec"]["containers"].append({"name": "side", "resources": {"requests": {RESOURCE_GPU_MEMORY: "4000"},
                                                                    "limits": {RESOURCE_GPU_MEMORY: "4000"}}})
    nvml, monitor = watch(tmp_path, pod, {("ns", "p"): slots(0, 250)})
    assert sample(nvml, monitor, 0, 9_000, 20) == set()
    assert sample(nvml, monitor, 0, 12_000, 20) == {"memory"}


def test_a_whole_gpu_the_kubelet_gave_stays_the_pods_own_whatever_memory_its_spec_states(tmp_path: Path) -> None:
    """Only a whole GPU the record alone names is held to a memory ask: one whose own device the kubelet gave (a
    pod bound by hand with ``kubecell.io/gpu`` and ``gpu-memory``, which the scheduler refuses) is the pod's."""
    pod = asking_memory(record(UID, [(0, GPU0, 1000, 40_536)]), "10000", resource=GPU_RESOURCE, amount="1")
    nvml, monitor = watch(tmp_path, pod, {("ns", "p"): [GPU0]})
    assert sample(nvml, monitor, 0, 30_000, 100) == set()


def asking(annotation: str, limits: dict[str, str]) -> dict[str, Any]:
    """A pod another device plugin serves (nothing of kubecell's is handed to it), asking ``limits``, with the
    record ``annotation``: only its spec bounds what the record says."""
    pod = served_pod(annotation, "nvidia.com/gpu")
    pod["spec"]["containers"][0]["resources"] = {"limits": limits}
    return pod


@pytest.mark.parametrize(("limits", "bound_mib"), [
    ({"alnair/vgpu-memory": "10", "alnair/vgpu-compute": "25"}, 10 * 1024),
    ({"aliyun.com/gpu-mem": "10"}, 10 * 1024),
    ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10000", "nvidia.com/gpucores": "25"}, 10_000),
    ({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "5000", "nvidia.com/gpucores": "25"}, 10_000),
    ({RESOURCE_GPU_MEMORY: "10000", "aliyun.com/gpu-mem": "30"}, 10_000),
    ({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "25"}, 40_536 // 4),
    ({"nvidia.com/gpumem-percentage": "33"}, math.ceil(40_536 * 0.33)),
    ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000", "nvidia.com/gpumem-percentage": "10"}, 20_000),
], ids=["alnair GiB", "gpushare GiB", "HAMi MiB", "HAMi MiB per GPU", "the smallest of two",
        "HAMi percent of the GPU's 40,536 MiB", "HAMi percent, one GPU by default", "HAMi MiB overrides percent"])
def test_every_dialects_memory_resource_bounds_a_rewritten_record(tmp_path: Path, limits: dict[str, str],
                                                                   bound_mib: int) -> None:
    """Its record was edited to grant 40,000 MiB; the spec's resources, which cannot change, asked less, in any
    dialect's unit. Within the ask the pod is not over; past it, it is, and the Event names the ask."""
    forged = record(UID, [(0, GPU0, 250, 40_000)])
    kube = FakeKube()
    nvml, monitor = watch(tmp_path, asking(forged, limits), None, kube)
    assert sample(nvml, monitor, 0, bound_mib + 1_000, 20) == {"memory"}
    assert any(f"asks {bound_mib} MiB" in body["message"] for _, body in kube.created)
    nvml, monitor = watch(tmp_path, asking(forged, limits), None)
    assert sample(nvml, monitor, 0, bound_mib - 500, 20) == set(), "within what it asked"


def test_a_hami_percentage_placed_as_a_compute_share_is_held_to_its_percent_of_the_gpus_memory(
        tmp_path: Path) -> None:
    """The scheduler places ``gpumem-percentage: 25`` as a 250 milli-GPU share granting no MiB (its GPU is not
    known before it is chosen): its record as the scheduler wrote it. Before, a record granting no MiB left the
    pod's memory unchecked, and a HAMi pod promised a quarter of the GPU could take all of it."""
    placed = record(UID, [(0, GPU0, 250, 0)])
    kube = FakeKube()
    nvml, monitor = watch(tmp_path, asking(placed, {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "25"}),
                          None, kube)
    assert sample(nvml, monitor, 0, 30_000, 20) == {"memory"}
    messages = [body["message"] for _, body in kube.created]
    assert any("its record grants no MiB; its spec asks 10134 MiB" in message for message in messages), messages


def test_hamis_asks_are_multiplied_per_container_not_over_the_whole_pod() -> None:
    """HAMi reads each container's MiB per GPU on that container's GPUs. Summed over the pod first (1,010 MiB on 4
    GPUs) the bound was 4,040 MiB where the pod asked 1,030; a percentage in one container and MiB in another
    are each read as HAMi reads them."""
    def pod(*containers: dict[str, str]) -> dict[str, Any]:
        return {"metadata": {"name": "p", "namespace": "ns", "uid": UID},
                "spec": {"containers": [{"name": f"c{i}", "image": "i", "resources": {"limits": limits}}
                                        for i, limits in enumerate(containers)]}}

    mixed = pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"},
                {"nvidia.com/gpu": "3", "nvidia.com/gpumem": "10"})
    assert spec_memory_mib(mixed) == 1_030
    percent = pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}, {"nvidia.com/gpumem-percentage": "10"})
    assert spec_memory_mib(percent, 40_000) == 5_000
    assert spec_memory_mib(percent) is None, "a percentage of no known GPU bounds nothing"
    assert spec_memory_mib(pod({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "3000",
                                "nvidia.com/gpumem-percentage": "1"}), 40_000) == 6_000, "MiB overrides percent"


def test_a_memory_ask_in_labels_or_annotations_bounds_nothing(tmp_path: Path) -> None:
    """Labels and annotations are rewritten as easily as the record: only resources bound it."""
    pod = asking(record(UID, [(0, GPU0, 250, 40_000)]), {"nvidia.com/gpu": "1"})
    pod["metadata"].setdefault("labels", {})["sharedgpu/gpu_mem"] = "1073741824"
    pod["metadata"]["annotations"]["kubecell.io/gpu-memory"] = "1000"
    nvml, monitor = watch(tmp_path, pod, None)
    assert sample(nvml, monitor, 0, 30_000, 20) == set()
