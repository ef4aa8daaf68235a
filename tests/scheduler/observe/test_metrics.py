"""``/metrics`` against the real testbed: a scheduler with two virtual clusters places fractional and whole-GPU
pods, and the text exposition gives, per VC and per GPU, exactly what the allocation records on the API
server imply; a pod whose node selector matches no node is counted as waiting for its constraints."""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kubecell.kube.names import ANNOTATION_ALLOCATION, ANNOTATION_VC
from kubecell.kube.records import parse_record
from kubecell.kube.rest import Kube
from kubecell.scheduler.observe.metrics import Metrics
from kubecell.scheduler.options import SchedulerOptions
from kubecell.testbed.control_plane import ControlPlaneState
from tests.cluster_fixtures import RunningScheduler
from tests.scheduler.test_scheduler import bound, make_pod
from tests.support import wait_for

TENANTS = """\
virtualClusters:
  alpha:
    cells: {P40x8/node: 2}
  beta:
    cells: {P40x8/node: 1}
"""
MIB = 1 << 20

PODS: dict[str, tuple[str, dict[str, str]]] = {
    "a-half-0": ("alpha", {"kubecell.io/gpu-milli": "500"}),
    "a-half-1": ("alpha", {"kubecell.io/gpu-milli": "500"}),
    "a-quarter": ("alpha", {"kubecell.io/gpu-milli": "250"}),
    "a-two": ("alpha", {"nvidia.com/gpu": "2"}),
    "b-eight": ("beta", {"nvidia.com/gpu": "8"}),
    "b-one": ("beta", {"nvidia.com/gpu": "1"}),
    "b-tenth": ("beta", {"kubecell.io/gpu-milli": "100"}),
}


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Family name -> (labels, value) of every sample, parsed by prometheus_client's own parser."""
    out: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name].append((dict(sample.labels), sample.value))
    return out


def by(found: dict[str, list[tuple[dict[str, str], float]]], name: str, *keys: str) -> dict[tuple[str, ...], float]:
    return {tuple(labels[k] for k in keys): value for labels, value in found.get(name, [])}


def tenant_configmap(kube: Kube, namespace: str, name: str) -> None:
    kube.create(f"/api/v1/namespaces/{namespace}/configmaps",
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace},
                 "data": {"tenants.yaml": TENANTS}})


@contextlib.contextmanager
def two_vc_scheduler(testbed: ControlPlaneState, kube: Kube, namespace: str,
                     start_scheduler: type[RunningScheduler]) -> Iterator[RunningScheduler]:
    """A scheduler reading the two-VC tenants from a ConfigMap of the test's own namespace, with the pods of
    ``PODS`` created and bound."""
    tenant_configmap(kube, namespace, "tenants")
    running = start_scheduler(testbed, SchedulerOptions(tenants_namespace=namespace, tenants_configmap="tenants"))
    for name, (vc, limits) in PODS.items():
        make_pod(kube, namespace, name, limits, {ANNOTATION_VC: vc})
    wait_for("every pod to be bound", lambda: bound(kube, namespace, *PODS), timeout=60)
    yield running


def records(kube: Kube, namespace: str) -> list[Any]:
    out = []
    for pod in kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"]:
        meta = pod["metadata"]
        text = (meta.get("annotations") or {}).get(ANNOTATION_ALLOCATION)
        if text:
            out.append(parse_record(text, pod=f"{meta['namespace']}/{meta['name']}", uid=meta["uid"]))
    return out


def expected(kube: Kube, namespace: str) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], tuple[int, int]]]:
    """Per (VC, class) GPUs and per (node, GPU) (milli, memory MiB), from the records on the API server."""
    per_vc: dict[tuple[str, str], float] = defaultdict(float)
    per_gpu: dict[tuple[str, str], tuple[int, int]] = {}
    for record in records(kube, namespace):
        for gpu in record.gpus:
            per_vc[(record.vc, record.job_class)] += gpu.milli / 1000
            milli, mib = per_gpu.get((record.node, str(gpu.index)), (0, 0))
            per_gpu[(record.node, str(gpu.index))] = (milli + gpu.milli, mib + gpu.memory_mib)
    return per_vc, per_gpu


def test_metrics_give_the_per_vc_and_per_gpu_figures_of_the_allocation_records(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    with two_vc_scheduler(testbed, kube, namespace, start_scheduler) as running:
        scheduler = running.scheduler
        body = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "nowhere", "namespace": namespace, "annotations": {ANNOTATION_VC: "beta"}},
                "spec": {"schedulerName": "kubecell", "nodeSelector": {"kubecell.io/test-no-such-node": "x"},
                         "containers": [{"name": "main", "image": "busybox",
                                         "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
        kube.create(f"/api/v1/namespaces/{namespace}/pods", body)
        per_vc, per_gpu = expected(kube, namespace)
        assert sum(per_vc.values()) == pytest.approx(0.5 + 0.5 + 0.25 + 2 + 8 + 1 + 0.1)
        metrics = Metrics(scheduler, None)

        def settled() -> dict[str, list[tuple[dict[str, str], float]]] | None:
            found = samples(metrics.render().decode())
            allocated = by(found, "kubecell_vc_allocated_gpus", "vc", "class")
            pending = by(found, "kubecell_pending_jobs", "vc", "reason")
            ok = all(allocated.get(key) == pytest.approx(value) for key, value in per_vc.items()) and \
                pending.get(("beta", "constraints")) == 1
            return found if ok else None

        found = wait_for("the metrics to show the records and the waiting pod", settled, timeout=30)

    allocated = by(found, "kubecell_vc_allocated_gpus", "vc", "class")
    for vc in ("alpha", "beta"):
        for klass in ("guaranteed", "borrowed", "opportunistic"):
            assert allocated[(vc, klass)] == pytest.approx(per_vc.get((vc, klass), 0.0)), (vc, klass)
    assert by(found, "kubecell_vc_guaranteed_gpus", "vc") == {("alpha",): 16.0, ("beta",): 8.0}
    borrowed = by(found, "kubecell_vc_borrowed_gpus", "vc")
    assert borrowed == {(vc,): pytest.approx(per_vc.get((vc, "borrowed"), 0.0)) for vc in ("alpha", "beta")}
    assert borrowed[("beta",)] > 0, "beta's 9.1 GPUs exceed its 8-GPU guarantee: some must be borrowed"

    milli = by(found, "kubecell_gpu_allocated_milli", "node", "gpu")
    used = by(found, "kubecell_gpu_allocated_memory_bytes", "node", "gpu")
    total = by(found, "kubecell_gpu_memory_bytes", "node", "gpu")
    for key, (want_milli, want_mib) in per_gpu.items():
        assert milli[key] == want_milli, key
        assert used[key] == want_mib * MIB, key
        assert total[key] >= used[key]
    models = {labels["model"] for labels, _ in found["kubecell_gpu_allocated_milli"]}
    assert models == {"P40"}
    assert len(milli) == 512, "one sample per GPU of the 64-node testbed"
    shared = [key for key, (m, _) in per_gpu.items() if m == 1000 and key in milli]
    assert shared, "the two halves share one GPU"

    assert by(found, "kubecell_leader")[()] == 1.0
    assert by(found, "kubecell_rebuilding")[()] == 0.0
    assert by(found, "kubecell_scheduling_cycles_total")[()] >= 1
    assert by(found, "kubecell_api_writes_total")[()] >= len(PODS)
    attempts = by(found, "kubecell_schedule_attempts_total", "result")
    assert attempts[("scheduled",)] >= len(PODS)
    assert attempts[("unschedulable",)] >= 1
    count = by(found, "kubecell_scheduling_attempt_duration_seconds_count", "result")
    assert count[("scheduled",)] == attempts[("scheduled",)]
    assert 0.0 <= by(found, "kubecell_fragmentation_ratio")[()] <= 1.0
    assert by(found, "kubecell_allocated_gpus")[()] >= sum(per_vc.values()) - 1e-9
    assert by(found, "kubecell_running_jobs", "vc") == {("alpha",): 4.0, ("beta",): 3.0}
    assert by(found, "kubecell_running_pods", "isolation") == {("accounting",): 7.0}  # nothing enforced: said so


def test_a_scrape_during_a_rebuild_serves_the_last_snapshot(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    with two_vc_scheduler(testbed, kube, namespace, start_scheduler) as running:
        scheduler = running.scheduler
        metrics = Metrics(scheduler, None)
        wait_for("a snapshot with both VCs' pods",
                 lambda: scheduler.snapshot is not None and sum(v.running_jobs for v in scheduler.snapshot.vcs) == 7)
        before = by(samples(metrics.render().decode()), "kubecell_vc_allocated_gpus", "vc", "class")
        scheduler.shutdown()  # hold the loop still, so the test decides when the rebuild happens
        running.thread.join(timeout=10)
        scheduler.needs_rebuild = True  # what an API error or a node change does
        during = samples(metrics.render().decode())
        assert by(during, "kubecell_rebuilding")[()] == 1.0
        assert by(during, "kubecell_vc_allocated_gpus", "vc", "class") == before
        old = scheduler.snapshot
        scheduler.step()  # rebuilds from the mirror, then publishes at once
        assert scheduler.snapshot is not old
        after = samples(metrics.render().decode())
        assert by(after, "kubecell_rebuilding")[()] == 0.0
        assert by(after, "kubecell_vc_allocated_gpus", "vc", "class") == before
