"""A pod's series read by two scrapes (two scrape jobs listing one exporter, a target listed twice) are one
measurement: they differ only in ``job`` and ``instance``, and count once, while a pod's several GPUs (or
containers) still add up. Pure, on series in the labels the exporters use; the same through a real Prometheus is
in ``test_collect.py`` and ``test_scrape_jobs.py``."""

from __future__ import annotations

import math
from typing import Any

import pytest

from kubecell.profiler.collect import Job, collect, measurement, one_per_measurement
from kubecell.profiler.pairs import GpuSeries
from kubecell.profiler.prometheus import Prometheus, Sample, Series
from kubecell.profiler.sources import CPU, GPU_UTILIZATION

T = 1_767_225_600.0
NS = "team-a"
DCGM = {"__name__": "DCGM_FI_DEV_GPU_UTIL", "namespace": NS, "pod": "p", "Hostname": "node-1",
        "container": "main", "modelName": "NVIDIA H100 80GB HBM3"}


def every(interval: float, value: float, *, offset: float = 0.0, count: int = 60) -> tuple[Sample, ...]:
    return tuple((T + offset + interval * i, value) for i in range(count))


def scraped(labels: dict[str, str], job: str, samples: tuple[Sample, ...]) -> Series:
    return Series({**labels, "job": job, "instance": f"{job}:9400"}, samples)


def test_the_scrape_labels_are_not_part_of_what_a_series_measures() -> None:
    gpu0 = {**DCGM, "gpu": "0", "UUID": "GPU-0"}
    assert measurement({**gpu0, "job": "a", "instance": "x"}) == measurement({**gpu0, "job": "b"}) == measurement(gpu0)
    assert measurement(gpu0) != measurement({**gpu0, "gpu": "1", "UUID": "GPU-1"})
    by_operator = {**gpu0, "job": "gpu-operator/dcgm", "service": "nvidia-dcgm-exporter", "endpoint": "gpu-metrics",
                   "metrics_path": "/metrics"}
    assert measurement(by_operator) == measurement({**gpu0, "job": "kubernetes-pods"}), \
        "a ServiceMonitor's target labels say who read it, as an annotation job's job and instance do"
    assert measurement({**gpu0, "team": "a"}) != measurement(gpu0), "any other label is another measurement"


def test_one_gpu_read_by_two_scrape_jobs_is_one_series_and_two_gpus_stay_two() -> None:
    gpu0, gpu1 = {**DCGM, "gpu": "0", "UUID": "GPU-0"}, {**DCGM, "gpu": "1", "UUID": "GPU-1"}
    read = [scraped(gpu0, "dcgm-exporter", every(60, 40.0)), scraped(gpu0, "gpu-metrics", every(60, 40.0, offset=20)),
            scraped(gpu1, "dcgm-exporter", every(60, 25.0))]
    kept = one_per_measurement(read)
    assert [series.labels["gpu"] for series in kept] == ["0", "1"]
    assert kept[0].samples == every(60, 40.0), "one scrape's timestamps, not both merged"
    assert kept[1] is read[2]


def test_the_scrape_with_most_samples_sets_the_times_and_the_highest_reading_is_kept() -> None:
    gpu0 = {**DCGM, "gpu": "0", "UUID": "GPU-0"}
    # a scrape job added half-way, reading a little higher where they overlap (another moment of the gauge)
    late = scraped(gpu0, "late", every(60, 50.0, offset=10, count=30))
    whole = scraped(gpu0, "whole", every(60, 40.0))
    (kept,) = one_per_measurement([late, whole])
    assert [t for t, _ in kept.samples] == [t for t, _ in whole.samples]
    # at the whole scrape's minute m, the late one's sample of minute m - 1 (50 s old: the same round) is there;
    # from minute 31, the late one's last sample is a round old, and not carried on
    assert [v for _, v in kept.samples] == [40.0] + [50.0] * 30 + [40.0] * 29
    # a sample NaN in the kept scrape takes the other's finite one; NaN where no scrape has one
    nan = scraped(gpu0, "nan", ((T, math.nan), (T + 60, math.nan), (T + 120, 1.0), (T + 180, 1.0), (T + 240, 1.0)))
    other = scraped(gpu0, "other", ((T + 30, 2.0), (T + 90, 0.5)))
    (kept,) = one_per_measurement([other, nan])
    assert kept.samples[1:] == ((T + 60, 2.0), (T + 120, 1.0), (T + 180, 1.0), (T + 240, 1.0))
    assert math.isnan(kept.samples[0][1])


class Canned(Prometheus):
    """Answers ``raw`` with canned series per metric name (the selector's name), whatever its matchers."""

    def __init__(self, series: list[Series]) -> None:
        super().__init__("http://127.0.0.1:9")
        self.canned = series

    def raw(self, selector: str, start: float, end: float, **_: Any) -> list[Series]:
        name = selector.split("{", 1)[0]
        return [series for series in self.canned if series.labels.get("__name__") == name]


def test_a_pod_on_two_gpus_each_scraped_twice_reads_its_two_gpus_once_over_its_whole_hour() -> None:
    gpu0, gpu1 = {**DCGM, "gpu": "0", "UUID": "GPU-0"}, {**DCGM, "gpu": "1", "UUID": "GPU-1"}
    client = Canned([scraped(labels, job, every(60, percent, offset=offset))
                     for labels, percent in ((gpu0, 40.0), (gpu1, 25.0))
                     for job, offset in (("dcgm-exporter", 0.0), ("gpu-metrics", 20.0))])
    profile = collect(client, Job(NS, ("p",), T, T + 3600), (GPU_UTILIZATION,))
    series = profile.metrics["gpu_utilization"].series["p"]
    assert series.source == "DCGM_FI_DEV_GPU_UTIL"
    assert profile.metrics["gpu_utilization"].pods["p"].mean == pytest.approx(0.65), "summed: 1.3"
    assert sum(series.weights) == pytest.approx(3600)


def test_a_cpu_counter_scraped_twice_is_one_rate() -> None:
    labels = {"__name__": "container_cpu_usage_seconds_total", "namespace": NS, "pod": "p", "container": "app",
              "cpu": "total"}
    # one core: the counter grows by one second per second, read by two scrape jobs 30 s apart
    client = Canned([scraped(labels, "kubelet", tuple((T + 60 * i, 60.0 * i) for i in range(60))),
                     scraped(labels, "cadvisor", tuple((T + 30 + 60 * i, 30.0 + 60 * i) for i in range(60)))])
    profile = collect(client, Job(NS, ("p",), T, T + 3600), (CPU,))
    assert profile.metrics["cpu"].pods["p"].mean == pytest.approx(1.0), "summed: 2 cores"


def test_the_sharing_observed_reads_a_pod_scraped_twice_once() -> None:
    labels = {"__name__": "kubecell_node_gpu_pod_utilization_ratio", "namespace": NS, "pod": "p", "node": "n1",
              "gpu": "GPU-0"}
    client = Canned([scraped(labels, "agent", every(60, 0.5)), scraped(labels, "agent-2", every(60, 0.5, offset=20))])
    held = GpuSeries(client).on("n1", "GPU-0", T, T + 3600)
    assert held == {(NS, "p"): list(every(60, 0.5))}
