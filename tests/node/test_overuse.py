"""Overuse detection: processes -> pods through fake ``/proc/<pid>/cgroup`` files, usage from the fake NVML
backend, compared with allocation records; Events and evictions on the real API server."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from kubecell.kube.names import ANNOTATION_ALLOCATION
from kubecell.kube.rest import ApiError, Kube
from kubecell.node.fake_nvml import FakeNvml
from kubecell.node.nvml import GpuProcess
from kubecell.node.overuse import OveruseMonitor, ProcCgroups, pod_uid_of_cgroup
from kubecell.testbed.control_plane import ControlPlaneState
from tests.support import wait_for

GPU0 = "GPU-00000000-0000-0000-0000-000000000000"
GPU1 = "GPU-11111111-1111-1111-1111-111111111111"
NODE = "overuse-node"
UID = "6f1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"

FAKE = f"""
name: {NODE}
gpus: [{{product: NVIDIA A100-SXM4-40GB, count: 2}}]
uuids: [{GPU0}, {GPU1}]
"""


# ---------------------------------------------------------------------------------------------- cgroups
@pytest.mark.parametrize(("case", "text", "expected"), [
    ("v2 systemd burstable",
     "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6f1b2c3d_4e5f_4a6b_8c7d_9e0f1a2b3c4d.slice/"
     "cri-containerd-0123abcd.scope\n", UID),
    ("v2 systemd besteffort",
     "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod6f1b2c3d_4e5f_4a6b_8c7d_9e0f1a2b3c4d.slice/"
     "cri-containerd-0123abcd.scope\n", UID),
    ("v2 systemd guaranteed",
     "0::/kubepods.slice/kubepods-pod6f1b2c3d_4e5f_4a6b_8c7d_9e0f1a2b3c4d.slice/crio-0123abcd.scope\n", UID),
    ("v2 kind (nested kubelet slice)",
     "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/"
     "kubelet-kubepods-burstable-pod6f1b2c3d_4e5f_4a6b_8c7d_9e0f1a2b3c4d.slice/cri-containerd-ab.scope\n", UID),
    ("v2 cgroupfs", "0::/kubepods/burstable/pod6f1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d/0123abcd\n", UID),
    ("v1 cgroupfs",
     "12:pids:/kubepods/besteffort/pod6f1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d/0123abcd\n"
     "11:memory:/kubepods/besteffort/pod6f1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d/0123abcd\n"
     "1:name=systemd:/kubepods/besteffort/pod6f1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d/0123abcd\n", UID),
    ("v1 cgroupfs guaranteed", "4:devices:/kubepods/pod6f1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d/0123abcd\n", UID),
    ("v1 systemd",
     "11:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6f1b2c3d_4e5f_4a6b_8c7d_9e0f1a2b3c4d"
     ".slice/docker-0123abcd.scope\n0::/\n", UID),
    ("static pod (hash UID)", "0::/kubepods/pod0123456789abcdef0123456789abcdef/0123abcd\n",
     "0123456789abcdef0123456789abcdef"),
    ("host service", "0::/system.slice/nvidia-persistenced.service\n", None),
    ("host v1", "12:pids:/user.slice/user-0.slice/session-1.scope\n1:name=systemd:/init.scope\n", None),
    ("docker outside kubernetes", "0::/system.slice/docker-0123abcd.scope\n", None),
    ("empty", "", None),
])
def test_the_pod_of_a_process_comes_from_its_cgroup(case: str, text: str, expected: str | None) -> None:
    assert pod_uid_of_cgroup(text) == expected, case


def test_a_process_that_exited_belongs_to_no_pod(tmp_path: Path) -> None:
    assert ProcCgroups(tmp_path).pod_uid(4242) is None


# ---------------------------------------------------------------------------------------------- helpers
def record(uid: str, grants: Sequence[tuple[int, str, int, int]], *, node: str = NODE,
           isolation: str = "accounting") -> str:
    """An allocation record for pod ``uid``; grants are (index, uuid, milli, memoryMiB)."""
    return json.dumps({
        "schema": "kubecell.io/allocation/v1", "allocationId": f"{uid}-0", "podUID": uid, "attempt": 0,
        "node": node, "gpus": [{"index": i, "uuid": u, "milli": m, "memoryMiB": mem} for i, u, m, mem in grants],
        "cpuMilli": 0, "memoryMiB": 0, "isolation": isolation, "job": "j", "vc": "default", "class": "borrowed",
        "member": 0, "batch": 1, "scheduler": "test", "createdAt": "2026-11-23T00:00:00Z"})


@dataclass
class Proc:
    """A fake ``/proc``: which pid sits in which pod's cgroup."""

    root: Path

    def put(self, pid: int, pod_uid: str | None) -> None:
        directory = self.root / str(pid)
        directory.mkdir(parents=True, exist_ok=True)
        if pod_uid is None:
            text = "0::/system.slice/ssh.service\n"
        else:
            text = (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{pod_uid.replace('-', '_')}"
                    ".slice/cri-containerd-0123abcd.scope\n")
        (directory / "cgroup").write_text(text)


@dataclass
class RecordingKube:
    """Only what the monitor writes, for the policy tests that need no API server."""

    created: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def create(self, path: str, body: Mapping[str, Any], **query: Any) -> dict[str, Any]:
        self.created.append((path, dict(body)))
        return dict(body)

    def reasons(self) -> list[str]:
        return [body.get("reason", "") for path, body in self.created if path.endswith("/events")]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pod_dict(name: str, uid: str, annotation: str | None) -> dict[str, Any]:
    annotations = {ANNOTATION_ALLOCATION: annotation} if annotation is not None else {}
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid, "annotations": annotations},
            "spec": {"nodeName": NODE}}


# ---------------------------------------------------------------------------------------------- the policy
HALF = [(0, GPU0, 500, 10_000)]
WHOLE = [(0, GPU0, 1000, 40_536)]

# case, grants (None: no record; "corrupt"), samples: per sample, the pod's processes as (gpu, memoryMiB, util%),
# expected kinds after the last sample
POLICY: list[tuple[str, Any, list[list[tuple[int, int, int | None]]], set[str]]] = [
    ("within its share", HALF, [[(0, 9_000, 40)]] * 4, set()),
    ("memory over at once", HALF, [[(0, 12_000, 10)]], {"memory"}),
    ("memory within the tolerance", HALF, [[(0, 10_200, 10)]], set()),
    ("memory summed over its processes", HALF, [[(0, 6_000, 10), (0, 6_000, 10)]], {"memory"}),
    ("a whole GPU is never over", WHOLE, [[(0, 40_000, 100)]] * 4, set()),
    ("utilisation sustained over the window", HALF, [[(0, 1_000, 80)]] * 3, {"utilization"}),
    ("utilisation not yet a full window", HALF, [[(0, 1_000, 80)]] * 2, set()),
    ("a burst is not overuse", HALF, [[(0, 1_000, 100)], [(0, 1_000, 20)], [(0, 1_000, 20)]], set()),
    ("utilisation within the tolerance", HALF, [[(0, 1_000, 58)]] * 3, set()),
    ("unsampled utilisation counts as idle", HALF, [[(0, 1_000, None)]] * 3, set()),
    ("a GPU its record does not name", HALF, [[(0, 1_000, 10), (1, 1_000, 0)]], {"memory"}),
    ("no record: unaccounted", None, [[(0, 1_000, 10)]], {"unaccounted"}),
    ("a corrupt record: unaccounted", "corrupt", [[(0, 1_000, 10)]], {"unaccounted"}),
]


@pytest.mark.parametrize(("case", "grants", "samples", "expected"), POLICY, ids=[c[0] for c in POLICY])
def test_policy(tmp_path: Path, case: str, grants: Any, samples: list[list[tuple[int, int, int | None]]],
                expected: set[str]) -> None:
    backend = FakeNvml.from_text(FAKE)
    proc = Proc(tmp_path)
    annotation = None if grants is None else "{corrupt" if grants == "corrupt" else record(UID, grants)
    pod = pod_dict("p", UID, annotation)
    kube = RecordingKube()
    monitor = OveruseMonitor(cast(Kube, kube), NODE, backend, lambda: [pod], None, proc_root=tmp_path, window=3)
    findings = []
    for processes in samples:
        for gpu in (0, 1):
            mine = [GpuProcess(100 + n, memory, util) for n, (g, memory, util) in enumerate(processes) if g == gpu]
            for process in mine:
                proc.put(process.pid, UID)
            backend.set_processes(gpu, mine)
        findings = monitor.sample()
    assert {f.kind for f in findings} == expected, case
    assert kube.reasons() == ["GPUOveruse"] * len(expected), case


def test_host_processes_are_ignored(tmp_path: Path) -> None:
    backend = FakeNvml.from_text(FAKE)
    Proc(tmp_path).put(7, None)
    backend.set_processes(0, [GpuProcess(7, 30_000, 100)])
    registry = CollectorRegistry()
    kube = RecordingKube()
    monitor = OveruseMonitor(cast(Kube, kube), NODE, backend, list, registry, proc_root=tmp_path, window=1)
    assert monitor.sample() == []
    assert registry.get_sample_value("kubecell_node_gpu_overuse_total", {"kind": "unaccounted"}) == 0
    assert kube.created == []


def test_one_event_per_episode_and_a_new_episode_after_calm(tmp_path: Path) -> None:
    backend = FakeNvml.from_text(FAKE)
    Proc(tmp_path).put(100, UID)
    pod = pod_dict("p", UID, record(UID, HALF))
    kube = RecordingKube()
    registry = CollectorRegistry()
    monitor = OveruseMonitor(cast(Kube, kube), NODE, backend, lambda: [pod], registry, proc_root=tmp_path,
                             calm_samples=2)
    over, within = [GpuProcess(100, 12_000, 0)], [GpuProcess(100, 9_000, 0)]
    for processes in (over, over, within, over, within, within, over):
        backend.set_processes(0, processes)
        monitor.sample()
    # over, over (same episode), one calm sample (not enough), over (same episode), two calm (ended), over (new)
    assert kube.reasons() == ["GPUOveruse", "GPUOveruse"]
    assert registry.get_sample_value("kubecell_node_gpu_overuse_total", {"kind": "memory"}) == 2


def test_metrics_per_pod_and_gpu_and_gone_with_the_processes(tmp_path: Path) -> None:
    backend = FakeNvml.from_text(FAKE)
    Proc(tmp_path).put(100, UID)
    pod = pod_dict("p", UID, record(UID, HALF))
    registry = CollectorRegistry()
    monitor = OveruseMonitor(cast(Kube, RecordingKube()), NODE, backend, lambda: [pod], registry, proc_root=tmp_path)
    backend.set_processes(0, [GpuProcess(100, 2_048, 35, 12), GpuProcess(103, 0, 5, 3)])
    Proc(tmp_path).put(103, UID)  # a second process of the pod: its readings add up
    monitor.sample()
    labels = {"pod": "p", "namespace": "ns", "node": NODE, "gpu": GPU0}
    assert registry.get_sample_value("kubecell_node_gpu_pod_memory_bytes", labels) == 2_048 * 2**20
    assert registry.get_sample_value("kubecell_node_gpu_pod_utilization_ratio", labels) == pytest.approx(0.40)
    assert registry.get_sample_value("kubecell_node_gpu_pod_memory_utilization_ratio", labels) == pytest.approx(0.15)
    backend.set_processes(0, [GpuProcess(100, 2_048, 35, None)])  # sampled, no usable controller reading
    monitor.sample()
    assert registry.get_sample_value("kubecell_node_gpu_pod_utilization_ratio", labels) == pytest.approx(0.35)
    assert registry.get_sample_value("kubecell_node_gpu_pod_memory_utilization_ratio", labels) is None, \
        "no series rather than one that reads low"
    backend.set_processes(0, [])
    monitor.sample()
    for name in ("memory_bytes", "utilization_ratio", "memory_utilization_ratio"):
        assert registry.get_sample_value(f"kubecell_node_gpu_pod_{name}", labels) is None, name


def test_eviction_is_off_by_default_and_waits_for_the_grace_period(tmp_path: Path) -> None:
    backend = FakeNvml.from_text(FAKE)
    Proc(tmp_path).put(100, UID)
    backend.set_processes(0, [GpuProcess(100, 12_000, 0)])
    pod = pod_dict("p", UID, record(UID, HALF))
    clock = Clock()

    def evictions(kube: RecordingKube) -> int:
        return sum(path.endswith("/eviction") for path, _ in kube.created)

    never = RecordingKube()
    monitor = OveruseMonitor(cast(Kube, never), NODE, backend, lambda: [pod], None, proc_root=tmp_path, clock=clock)
    for _ in range(3):
        monitor.sample()
        clock.now += 3600
    assert evictions(never) == 0

    kube = RecordingKube()
    monitor = OveruseMonitor(cast(Kube, kube), NODE, backend, lambda: [pod], None, proc_root=tmp_path, clock=clock,
                             evict_after_seconds=60)
    monitor.sample()
    clock.now += 59
    monitor.sample()
    assert evictions(kube) == 0
    clock.now += 1
    monitor.sample()
    monitor.sample()
    assert evictions(kube) == 1
    path, body = next((p, b) for p, b in kube.created if p.endswith("/eviction"))
    assert path == "/api/v1/namespaces/ns/pods/p/eviction"
    assert body["apiVersion"] == "policy/v1"
    assert body["deleteOptions"] == {"preconditions": {"uid": UID}}


@pytest.mark.parametrize(("window", "calm", "evict"), [(0, 1, None), (3, 0, None), (3, 1, -1.0)])
def test_bad_settings_are_refused(tmp_path: Path, window: int, calm: int, evict: float | None) -> None:
    from kubecell.core.errors import KubecellError

    with pytest.raises(KubecellError, match=r"accepted|must be"):
        OveruseMonitor(cast(Kube, RecordingKube()), NODE, FakeNvml.from_text(FAKE), list, None,
                       window=window, calm_samples=calm, evict_after_seconds=evict)


# ---------------------------------------------------------------------------------------------- the API server
def make_pod(kube: Kube, namespace: str, name: str, grants: Sequence[tuple[int, str, int, int]] | None,
             isolation: str = "accounting") -> dict[str, Any]:
    """A pod bound to the monitor's node (no kubelet runs it) carrying a record written for its UID."""
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "x"}]}}
    pod = kube.create(f"/api/v1/namespaces/{namespace}/pods", body)
    if grants is not None:
        pod = kube.patch(f"/api/v1/namespaces/{namespace}/pods/{name}", {"metadata": {"annotations": {
            ANNOTATION_ALLOCATION: record(pod["metadata"]["uid"], grants, isolation=isolation)}}})
    return pod


def events(kube: Kube, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
    return list(kube.get(f"/api/v1/namespaces/{namespace}/events",
                         fieldSelector=f"involvedObject.name={name},reason={reason}")["items"])


def node_pods(kube: Kube, namespace: str) -> Any:
    return lambda: kube.get(f"/api/v1/namespaces/{namespace}/pods", fieldSelector=f"spec.nodeName={NODE}")["items"]


def test_an_overusing_pod_gets_one_warning_event_with_the_numbers(
        testbed: ControlPlaneState, kube: Kube, namespace: str, tmp_path: Path) -> None:
    backend = FakeNvml.from_text(FAKE)
    proc = Proc(tmp_path)
    greedy = make_pod(kube, namespace, "greedy", HALF, isolation="mps")
    stray = make_pod(kube, namespace, "stray", None)
    proc.put(100, greedy["metadata"]["uid"])
    proc.put(101, stray["metadata"]["uid"])
    proc.put(102, None)
    backend.set_processes(0, [GpuProcess(100, 12_288, 5), GpuProcess(102, 500, 0)])
    backend.set_processes(1, [GpuProcess(101, 1_024, 5)])
    registry = CollectorRegistry()
    monitor = OveruseMonitor(kube, NODE, backend, node_pods(kube, namespace), registry, proc_root=tmp_path,
                             evict_after_seconds=0)
    for _ in range(3):
        assert {f.kind for f in monitor.sample()} == {"memory", "unaccounted"}
    seen = wait_for("the GPUOveruse Event", lambda: events(kube, namespace, "greedy", "GPUOveruse"), 10)
    assert len(seen) == 1
    assert seen[0]["type"] == "Warning"
    message = seen[0]["message"]
    for told in ("12288 MiB", "10000 MiB", "isolation mps"):
        assert told in message, message
    unaccounted = wait_for("the unaccounted Event", lambda: events(kube, namespace, "stray", "GPUOveruse"), 10)
    assert "unaccounted" in unaccounted[0]["message"]
    assert registry.get_sample_value("kubecell_node_gpu_overuse_total", {"kind": "memory"}) == 1
    assert registry.get_sample_value("kubecell_node_gpu_overuse_total", {"kind": "unaccounted"}) == 1
    labels = {"pod": "greedy", "namespace": namespace, "node": NODE, "gpu": GPU0}
    assert registry.get_sample_value("kubecell_node_gpu_pod_memory_bytes", labels) == 12_288 * 2**20
    # evict_after_seconds=0: the pod with a record is evicted, the unaccounted one never is
    evicted = kube.get(f"/api/v1/namespaces/{namespace}/pods/greedy")
    assert evicted["metadata"].get("deletionTimestamp")
    assert wait_for("the eviction Event", lambda: events(kube, namespace, "greedy", "GPUOveruseEvicted"), 10)
    assert not kube.get(f"/api/v1/namespaces/{namespace}/pods/stray")["metadata"].get("deletionTimestamp")
    assert registry.get_sample_value("kubecell_node_gpu_overuse_evictions_total") == 1


def test_an_eviction_a_disruption_budget_refuses_is_tried_again(
        testbed: ControlPlaneState, kube: Kube, namespace: str, tmp_path: Path) -> None:
    backend = FakeNvml.from_text(FAKE)
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "guarded", "namespace": namespace, "labels": {"app": "guarded"}},
            "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "x"}]}}
    pod = kube.create(f"/api/v1/namespaces/{namespace}/pods", body)
    kube.patch(f"/api/v1/namespaces/{namespace}/pods/guarded", {"metadata": {"annotations": {
        ANNOTATION_ALLOCATION: record(pod["metadata"]["uid"], HALF)}}})
    # a Pending pod is evicted without asking its budget: make it Running and Ready, as a kubelet would
    kube.patch(f"/api/v1/namespaces/{namespace}/pods/guarded/status", {"status": {
        "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "guard"},
           "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "guarded"}}}}
    kube.create(f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets", pdb)
    Proc(tmp_path).put(100, pod["metadata"]["uid"])
    backend.set_processes(0, [GpuProcess(100, 12_000, 0)])
    monitor = OveruseMonitor(kube, NODE, backend, node_pods(kube, namespace), None, proc_root=tmp_path,
                             evict_after_seconds=0)
    monitor.sample()
    monitor.sample()
    assert not kube.get(f"/api/v1/namespaces/{namespace}/pods/guarded")["metadata"].get("deletionTimestamp")
    assert not any(e.evicted for e in monitor.episodes.values())
    try:
        kube.delete(f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/guard")
    except ApiError as error:  # pragma: no cover - the namespace fixture cleans up anyway
        raise AssertionError(f"could not delete the PDB: {error}") from None
    monitor.sample()
    assert kube.get(f"/api/v1/namespaces/{namespace}/pods/guarded")["metadata"].get("deletionTimestamp")



def test_a_mig_pod_on_its_instance_is_never_over(tmp_path: Path) -> None:
    """NVML lists a MIG pod's processes on the GPU, not on its instance: that is the pod's own instance
    (bounded by the hardware), not a GPU its record does not name."""
    backend = FakeNvml.from_text(f"{FAKE}mig: [{{gpu: 0, instances: [{{profile: 3g.20gb}}, {{profile: 3g.20gb}}]}}]\n")
    instance = backend.devices()[0].mig_instances[1]
    Proc(tmp_path).put(100, UID)
    backend.set_processes(0, [GpuProcess(100, 19_000, 100)])
    pod = pod_dict("p", UID, record(UID, [(1, instance.uuid, 1000, instance.memory_mib)], isolation="mig"))
    kube = RecordingKube()
    monitor = OveruseMonitor(cast(Kube, kube), NODE, backend, lambda: [pod], None, proc_root=tmp_path, window=1)
    assert monitor.sample() == []
    assert kube.created == []
    backend.set_processes(1, [GpuProcess(100, 1_000, 5)])  # but the other GPU is not its own
    assert {f.kind for f in monitor.sample()} == {"memory"}
