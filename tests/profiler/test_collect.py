"""The collector: the weighting rule and counter rates as pure functions, then whole jobs against a real
Prometheus holding synthetic series in the exact names and labels of kubecell's agent, dcgm-exporter and
cAdvisor."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubecell.core.errors import KubecellError
from kubecell.profiler.collect import Job, Profile, collect, counter_rates, sample_weights, summed
from kubecell.profiler.distribution import distribution
from kubecell.profiler.prometheus import Prometheus
from kubecell.profiler.sources import CPU, GPU_MEMORY, GPU_UTILIZATION, MEMORY, METRICS, MIB, Source
from tests.profiler.prometheus_server import BASE_TIME, Family, backfilled

NS = "team-a"
T = [float(BASE_TIME + 60 * i) for i in range(10)]
"""Ten one-minute scrapes."""
END = T[-1]


# ------------------------------------------------------------------------------------------- pure pieces
def test_weights_are_the_gaps_capped_at_twice_the_median() -> None:
    # gaps 60, 60, 280 (an outage), 60: median 60, cap 120; the last sample gets the median
    assert sample_weights([0, 60, 120, 400, 460]) == [60, 60, 120, 60, 60]
    assert sample_weights([0, 60, 120, 400, 460], max_gap_factor=5) == [60, 60, 280, 60, 60]
    assert sample_weights([0, 10, 30, 60]) == [10, 20, 30, 20]  # median of 10, 20, 30 is 20: nothing capped
    assert sample_weights([0, 60]) == [60, 60]


def test_a_single_sample_stands_for_the_fallback_interval() -> None:
    assert sample_weights([5.0]) == [60.0]
    assert sample_weights([5.0], fallback_interval=15) == [15.0]
    assert sample_weights([]) == []
    with pytest.raises(KubecellError, match="strictly increasing"):
        sample_weights([0, 60, 60])


def test_counter_rates_survive_a_reset() -> None:
    # 1 core for two minutes; the container restarts and has used 30 s of CPU a minute later
    samples = [(0.0, 100.0), (60.0, 160.0), (120.0, 220.0), (180.0, 30.0), (240.0, 60.0)]
    assert counter_rates(samples) == [(60.0, 1.0), (120.0, 1.0), (180.0, 0.5), (240.0, 0.5)]
    assert counter_rates(samples[:1]) == []


def test_summed_adds_equal_timestamps_and_carries_the_latest_sample_forward() -> None:
    a = [(0.0, 1.0), (60.0, 2.0), (120.0, 3.0)]
    assert summed([a, [(0.0, 10.0), (60.0, 20.0), (120.0, 30.0)]]) == [(0.0, 11.0), (60.0, 22.0), (120.0, 33.0)]
    # stamped 30 s apart: each timestamp takes the other series' latest sample; none before a series began
    assert summed([a, [(30.0, 10.0), (90.0, 20.0)]]) == [
        (0.0, 1.0), (30.0, 11.0), (60.0, 12.0), (90.0, 22.0), (120.0, 23.0)]
    # a series that stopped (older than its cap of 2 x 60 s) is not carried on
    assert summed([[(0.0, 1.0), (60.0, 1.0), (120.0, 1.0), (600.0, 1.0)], [(0.0, 5.0), (60.0, 5.0)]]) == [
        (0.0, 6.0), (60.0, 6.0), (120.0, 6.0), (600.0, 1.0)]
    assert summed([a]) == a


def test_selectors_quote_and_exclude() -> None:
    source = Source("container_memory_working_set_bytes", exclude={"container": ("", "POD")})
    assert source.selector("ns", ("web.v2", "a")) == (
        'container_memory_working_set_bytes{namespace="ns", pod=~"a|web\\\\.v2", container!~"|POD"}')
    assert not source.keeps({"container": ""})
    assert not source.keeps({})
    assert not source.keeps({"container": "POD"})
    assert source.keeps({"container": "app"})
    assert [m.name for m in METRICS] == ["gpu_utilization", "gpu_memory", "gpu_memory_utilization", "cpu", "memory"]


# -------------------------------------------------------------------------------------- a real Prometheus
def util(i: int) -> float:
    return (i * 7 % 11) / 10


APP_CPU = [0.0, 60.0, 120.0, 180.0, 240.0, 12.0, 42.0, 72.0, 102.0, 132.0]
"""1 core for 4 minutes, a restart (the counter begins again), then 0.5 core."""
SIDECAR_CPU = [6.0 * i for i in range(10)]
"""0.1 core."""


def families() -> list[Family]:
    dcgm = {"gpu": "0", "UUID": "GPU-aaaa", "device": "nvidia0", "modelName": "NVIDIA H100 80GB HBM3",
            "Hostname": "node-1", "container": "main", "DCGM_FI_DRIVER_VERSION": "550.54.15"}
    kubecell = {"node": "node-1", "gpu": "GPU-aaaa"}
    return [
        Family("kubecell_node_gpu_pod_utilization_ratio", "gauge", [
            ({"pod": "agent", "namespace": NS, **kubecell}, [(t, util(i)) for i, t in enumerate(T)]),
            ({"pod": "nan", "namespace": NS, **kubecell}, [(t, math.nan) for t in T]),
            ({"pod": "agent", "namespace": "other", **kubecell}, [(t, 1.0) for t in T]),
            ({"pod": "short", "namespace": NS, **kubecell}, [(T[0], 0.5)]),
        ]),
        Family("DCGM_FI_DEV_GPU_UTIL", "gauge", [
            # a pod on two GPUs, only dcgm-exporter watching: 40 % and 25 % -> 0.65 of a GPU
            ({**dcgm, "pod": "dcgm", "namespace": NS}, [(t, 40.0) for t in T]),
            ({**dcgm, "gpu": "1", "UUID": "GPU-bbbb", "device": "nvidia1", "pod": "dcgm", "namespace": NS},
             [(t, 25.0) for t in T]),
            # the agent's pod is seen by dcgm-exporter too: the agent's own series win
            ({**dcgm, "pod": "agent", "namespace": NS}, [(t, 99.0) for t in T]),
            # a pod on two GPUs, dcgm-exporter scraped by two jobs 20 s apart: 0.4 + 0.25 of a GPU, not twice that
            *[({**dcgm, "gpu": gpu, "UUID": f"GPU-{gpu}", "pod": "twice", "namespace": NS, "job": job,
                "instance": f"10.0.0.1:{port}"}, [(t + offset, percent) for t in T])
              for gpu, percent in (("0", 40.0), ("1", 25.0))
              for job, port, offset in (("dcgm-exporter", 9400, 0.0), ("gpu-metrics", 9401, 20.0))],
        ]),
        Family("kubecell_node_gpu_pod_memory_utilization_ratio", "gauge", [
            ({"pod": "agent", "namespace": NS, **kubecell}, [(t, util(i) / 2) for i, t in enumerate(T)]),
        ]),
        Family("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", [
            ({**dcgm, "pod": "dcgm", "namespace": NS}, [(t, 30.0) for t in T]),
        ]),
        Family("DCGM_FI_DEV_FB_USED", "gauge", [
            ({**dcgm, "pod": "dcgm", "namespace": NS}, [(t, 1024.0 + i) for i, t in enumerate(T)]),
        ]),
        Family("container_cpu_usage_seconds_total", "counter", [
            ({"pod": "web", "namespace": NS, "container": "app", "cpu": "total"},
             list(zip(T, APP_CPU, strict=True))),
            ({"pod": "web", "namespace": NS, "container": "sidecar", "cpu": "total"},
             list(zip(T, SIDECAR_CPU, strict=True))),
            ({"pod": "web", "namespace": NS, "container": "", "cpu": "total"},
             [(t, 1e6 * i) for i, t in enumerate(T)]),
            ({"pod": "web", "namespace": NS, "container": "POD", "cpu": "total"},
             [(t, 5e5 * i) for i, t in enumerate(T)]),
        ]),
        Family("container_memory_working_set_bytes", "gauge", [
            ({"pod": "web", "namespace": NS, "container": "app", "id": "/kubepods/app"}, [(t, 3e9) for t in T]),
            ({"pod": "web", "namespace": NS, "container": "sidecar", "id": "/kubepods/sc"}, [(t, 1e8) for t in T]),
            ({"pod": "web", "namespace": NS, "container": "", "id": "/kubepods"}, [(t, 9e12) for t in T]),
            ({"pod": "web", "namespace": NS, "container": "POD", "id": "/kubepods/pause"}, [(t, 7e11) for t in T]),
        ]),
    ]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    with backfilled(Path(tmp_path_factory.mktemp("collect")), families()) as url:
        yield Prometheus(url)


@pytest.fixture(scope="module")
def profile(prometheus: Prometheus) -> Profile:
    return collect(prometheus, Job(NS, ("agent", "dcgm", "web", "ghost", "nan", "short"), T[0], END), chunk=180)


def test_the_first_source_with_series_is_read(profile: Profile) -> None:
    gpu = profile.metrics["gpu_utilization"]
    assert gpu.series["agent"].source == "kubecell_node_gpu_pod_utilization_ratio"
    assert [v for _, v in gpu.series["agent"].samples] == [util(i) for i in range(10)]  # not namespace "other"
    assert gpu.pods["agent"] == distribution([util(i) for i in range(10)], [60.0] * 10)
    # only dcgm-exporter has the pod: percent -> ratio, its two GPUs summed
    assert gpu.series["dcgm"].source == "DCGM_FI_DEV_GPU_UTIL"
    assert [v for _, v in gpu.series["dcgm"].samples] == [0.65] * 10
    memory = profile.metrics["gpu_memory"]
    assert memory.series["dcgm"].source == "DCGM_FI_DEV_FB_USED"
    assert [v for _, v in memory.series["dcgm"].samples] == [(1024.0 + i) * MIB for i in range(10)]
    assert memory.pods["dcgm"].mean == pytest.approx((1024 + 4.5) * MIB)


def test_memory_controller_time_is_read_where_an_exporter_gives_it_and_missed_by_nobody(profile: Profile) -> None:
    controller = profile.metrics["gpu_memory_utilization"]
    assert controller.series["agent"].source == "kubecell_node_gpu_pod_memory_utilization_ratio"
    assert [v for _, v in controller.series["agent"].samples] == [util(i) / 2 for i in range(10)]
    assert controller.series["dcgm"].source == "DCGM_FI_DEV_MEM_COPY_UTIL"
    assert [v for _, v in controller.series["dcgm"].samples] == [0.30] * 10
    assert sorted(controller.pods) == ["agent", "dcgm"]
    assert not [p for p in profile.problems if p.metric == "gpu_memory_utilization" and "no samples" in p.reason], \
        "an optional metric's absence is not a problem"


def test_cadvisor_rows_of_the_pod_and_the_pause_container_are_left_out(profile: Profile) -> None:
    memory = profile.metrics["memory"]
    assert memory.series["web"].source == "container_memory_working_set_bytes"
    assert [v for _, v in memory.series["web"].samples] == [3.1e9] * 10
    cpu = profile.metrics["cpu"].series["web"]
    # rates from the second sample on: app 1 core (reset: 12 s over the minute = 0.2), then 0.5; sidecar 0.1
    app = [1.0, 1.0, 1.0, 1.0, 0.2, 0.5, 0.5, 0.5, 0.5]
    assert [t for t, _ in cpu.samples] == T[1:]
    assert [v for _, v in cpu.samples] == pytest.approx([a + 0.1 for a in app])
    assert profile.metrics["cpu"].pods["web"].deciles[-1] == pytest.approx(1.1)


def test_bad_pods_are_problems_and_the_job_pools_the_rest(profile: Profile) -> None:
    told = {(p.pod, p.metric): p.reason for p in profile.problems}
    assert "no samples in the window in any of: kubecell_node_gpu_pod_utilization_ratio, DCGM_FI_DEV_GPU_UTIL, " \
           "DCGM_FI_PROF_SM_ACTIVE" in told[("ghost", "gpu_utilization")]
    assert "all 10 samples are NaN" in told[("nan", "gpu_utilization")]
    assert "1 sample(s), at least 2 needed" in told[("short", "gpu_utilization")]
    assert ("web", "gpu_utilization") in told
    assert ("agent", "cpu") in told
    gpu = profile.metrics["gpu_utilization"]
    assert sorted(gpu.pods) == ["agent", "dcgm"]
    assert gpu.job is not None
    assert gpu.job.samples == 20
    assert gpu.job.mean == pytest.approx((sum(util(i) for i in range(10)) + 6.5) / 20)
    assert profile.metrics["cpu"].job == profile.metrics["cpu"].pods["web"]


def test_a_gpu_scraped_by_two_jobs_is_counted_once_and_its_hour_weighed_whole(prometheus: Prometheus) -> None:
    """Before, a pod's four series (two GPUs, each read by two scrape jobs) were summed: 1.3 GPUs, not 0.65."""
    twice = collect(prometheus, Job(NS, ("twice",), T[0], END + 30), (GPU_UTILIZATION,), chunk=180)
    series = twice.metrics["gpu_utilization"].series["twice"]
    assert [v for _, v in series.samples] == pytest.approx([0.65] * 10)
    assert [t for t, _ in series.samples] == T, "one scrape's timestamps"
    assert twice.metrics["gpu_utilization"].pods["twice"].mean == pytest.approx(0.65)
    assert sum(series.weights) == pytest.approx(600.0)


def test_a_job_without_any_samples_has_no_distribution(prometheus: Prometheus) -> None:
    empty = collect(prometheus, Job(NS, ("ghost",), T[0], END), (GPU_UTILIZATION, GPU_MEMORY, CPU, MEMORY))
    assert all(m.job is None and not m.pods for m in empty.metrics.values())
    assert len(empty.problems) == 4
    with pytest.raises(KubecellError, match="named twice"):
        collect(prometheus, Job(NS, ("a", "a"), T[0], END))
