"""The pair history's whole loop on a real control plane. kubecell's scheduler puts two job families on one GPU;
the emulated time-sliced GPU (``testbed.shared_gpus``) runs them at a speed beside each other and exports what
the node agent would; a real Prometheus scrapes it; a profiling pass files what it saw in the job history; and
the scheduler, reading that history, keeps the next two runs of the families apart where they slowed each other
down, and puts them together again where they lost nothing. ``bench/colocation_live.py`` measures what that
does to JCTs."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from kubecell.core.interference import BlindSharing, JobKey
from kubecell.core.interference.history import MEASURED_FLOOR, informed_by_pairs
from kubecell.kube.names import ANNOTATION_ALLOCATION, RESOURCE_GPU_MEMORY, RESOURCE_GPU_MILLI
from kubecell.kube.records import parse_record
from kubecell.kube.rest import Kube
from kubecell.profiler.history import JobHistory, JobRecord, Outcome, SharedUse
from kubecell.profiler.jobs import group_pods, list_pods
from kubecell.profiler.knowledge import HistoryKnowledge
from kubecell.profiler.pairs import ALONE
from kubecell.profiler.prometheus import Prometheus
from kubecell.profiler.run import profile_jobs
from kubecell.scheduler.options import SchedulerOptions
from kubecell.testbed.control_plane import ControlPlaneState
from kubecell.testbed.shared_gpus import EmulatedShare, SharedGpus, metrics_endpoint
from tests.cluster_fixtures import RunningScheduler
from tests.profiler.prometheus_server import serve
from tests.scheduler.trust_support import create_pod, pod
from tests.support import wait_for

NODE = "philly-036"
PINNED = {"nodeSelector": {"kubernetes.io/hostname": NODE}}
FAMILIES = ("bert", "gpt")
UTILIZATION = 0.6
"""Each family's GPU utilization alone (its earlier runs', and what the emulated agent reports of it alone)."""
GiB = 2**30
SAMPLES = 4
"""Scrapes (one a second) of both pods side by side before the profiling pass: above ``PAIR_SECONDS``."""
PAIR_SECONDS = 2.0


@pytest.fixture
def history(tmp_path: Path) -> Iterator[JobHistory]:
    with JobHistory.open(f"sqlite:///{tmp_path / 'history.db'}") as opened:
        yield opened


def file_runs_alone(history: JobHistory, namespace: str) -> None:
    """Each family's earlier runs, alone on their GPU, as the profiler filed them: the baseline its speed
    beside a partner is measured against."""
    start = datetime.now(UTC) - timedelta(days=1)
    for family in FAMILIES:
        for index in range(3):
            begun = start + timedelta(hours=index)
            history.save(JobRecord(uid=f"{namespace}-{family}-{index}", namespace=namespace, owner_kind="Pod",
                                   owner_name=f"{family}-{index + 100}", created=begun, started=begun,
                                   finished=begun + timedelta(seconds=600), outcome=Outcome.SUCCEEDED,
                                   gpus_per_pod=1, milli_gpu_per_pod=500,
                                   sharing=(SharedUse(ALONE, 600.0, 600.0 * UTILIZATION),)))


def share(kube: Kube, namespace: str, name: str) -> None:
    create_pod(kube, namespace, name, {RESOURCE_GPU_MILLI: "500", RESOURCE_GPU_MEMORY: "4096"}, spec=PINNED)


def gpu_of(kube: Kube, namespace: str, name: str) -> tuple[str, int] | None:
    found = pod(kube, namespace, name)
    meta = found["metadata"]
    text = (meta.get("annotations") or {}).get(ANNOTATION_ALLOCATION)
    if text is None or found["status"].get("phase") != "Running":
        return None
    record = parse_record(text, pod=meta["name"], uid=meta["uid"])
    return record.node, record.gpus[0].index


def both_placed(kube: Kube, namespace: str, names: tuple[str, str]) -> tuple[tuple[str, int], tuple[str, int]] | None:
    first, second = gpu_of(kube, namespace, names[0]), gpu_of(kube, namespace, names[1])
    return (first, second) if first is not None and second is not None else None


def scraped_side_by_side(client: Prometheus, namespace: str) -> bool:
    found = client.query(f'count_over_time(kubecell_node_gpu_pod_utilization_ratio{{namespace="{namespace}"}}[5m])')
    return len(found) == len(FAMILIES) and all(series.samples[-1][1] >= SAMPLES for series in found)


@pytest.mark.parametrize(("speed", "together"), [(0.5, False), (1.0, True)], ids=["slowed-apart", "unharmed-shared"])
def test_the_scheduler_keeps_apart_the_families_the_profiler_saw_slow_each_other_down(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler],
        history: JobHistory, tmp_path: Path, speed: float, together: bool) -> None:
    file_runs_alone(history, namespace)
    knowledge = HistoryKnowledge(history, ttl_seconds=0.5, pair_min_seconds=PAIR_SECONDS)
    # Without a history every pair shares (blind); the history decides the pairs it knows.
    start_scheduler(testbed, SchedulerOptions(colocation=informed_by_pairs(BlindSharing(), knowledge, MEASURED_FLOOR),
                                              knowledge=knowledge))
    registry = CollectorRegistry()

    def described(name: str) -> EmulatedShare[str] | None:
        family = name.split("-")[0]
        return EmulatedShare(3600.0, family, UTILIZATION, 4 * GiB) if family in FAMILIES else None

    gpus = SharedGpus(kube, namespace, described, lambda _own, others: speed if others else 1.0, registry)
    bert, gpt = (JobKey(f"{namespace}/{family}") for family in FAMILIES)
    with metrics_endpoint(registry) as target, serve(tmp_path / "tsdb", scrape=[target]) as url, gpus.running():
        for name in ("bert-1", "gpt-1"):
            share(kube, namespace, name)
        first, second = wait_for("the first runs to start", lambda: both_placed(kube, namespace, ("bert-1", "gpt-1")))
        assert first == second, "nothing known of the pair yet: it shares, as blind packing would"
        client = Prometheus(url)
        wait_for("the agent's series of both pods, side by side", lambda: scraped_side_by_side(client, namespace))
        profile_jobs(group_pods(list_pods(kube, namespace)), client, history)
        learned = wait_for("the scheduler's knowledge to read the pair",
                           lambda: knowledge.speed(bert, gpt) is not None and knowledge.speed(gpt, bert) is not None)
        assert learned
        assert knowledge.speed(bert, gpt) == pytest.approx(speed, abs=0.05)
        assert gpus.shared_seconds > 0
        for name in ("bert-1", "gpt-1"):
            kube.delete(f"/api/v1/namespaces/{namespace}/pods/{name}", gracePeriodSeconds=0)
        wait_for("the first runs to go", lambda: not list_pods(kube, namespace))

        for name in ("bert-2", "gpt-2"):
            share(kube, namespace, name)
        first, second = wait_for("the second runs to start", lambda: both_placed(kube, namespace, ("bert-2", "gpt-2")))
    assert (first == second) is together, f"speed {speed} beside each other: bert-2 on {first}, gpt-2 on {second}"
