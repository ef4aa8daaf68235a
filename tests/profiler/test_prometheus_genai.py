"""The profiler on real series: Alibaba's GenTD26 per-pod GPU utilization and GPU memory (143 serving pods,
a day of one-minute samples with real gaps), backfilled into a real Prometheus under the names kubecell's node
agent exports, must give exactly the distributions computed straight from the CSV rows.

Every pod of both files is checked (one collect of the whole data set as one job takes a few seconds), and a
job of a few pods must be the pooled distribution of those pods' rows. The CSV's anonymized timestamps are
shifted to start at ``BASE_TIME``; weights are computed from the unshifted timestamps, so the check also shows
that Prometheus kept every gap as it was.
"""

from __future__ import annotations

import csv
import io
import tarfile
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kubecell.profiler.collect import Job, Profile, collect, sample_weights
from kubecell.profiler.distribution import Distribution, distribution, pooled
from kubecell.profiler.prometheus import Prometheus
from kubecell.profiler.sources import GPU_MEMORY, GPU_UTILIZATION
from tests.profiler.prometheus_server import BASE_TIME, Family, backfilled
from tests.sim.support import REPO

pytestmark = pytest.mark.shared_data

GENAI = REPO / ".." / "shared" / "data" / "alibaba-genai-v2026"
UTILIZATION_TAR = "pod_gpu_duty_cycle_anon.tar.gz"
MEMORY_TAR = "pod_gpu_memory_used_bytes_anon.tar.gz"
NAMESPACE = "genai"
PODS_PER_NODE = 8

Rows = dict[str, list[tuple[float, float]]]
"""Pod (the container_ip hash) -> its (anonymized unix seconds, value) rows in time order."""


def genai_rows(name: str) -> Rows:
    """A GenTD26 file's rows per pod, read from its tar.gz in place, or skip naming what is absent."""
    path = GENAI / name
    if not GENAI.is_dir():
        pytest.skip(f"Alibaba GenTD26 data set absent: {GENAI}")
    if not path.is_file():
        pytest.skip(f"GenTD26 file absent: {path}")
    rows: Rows = defaultdict(list)
    with tarfile.open(path, "r:gz") as archive:
        member = next(m for m in archive.getmembers() if m.name.endswith(".csv"))
        handle = archive.extractfile(member)
        assert handle is not None, f"{path}: {member.name} is not a file"
        for row in csv.DictReader(io.TextIOWrapper(handle, encoding="utf-8")):
            rows[row["container_ip"]].append((float(row["timestamp_anon"]), float(row["value"])))
    for samples in rows.values():
        samples.sort()
    return dict(rows)


def gpu_uuid(pod: str) -> str:
    return f"GPU-{pod[:8]}-{pod[8:12]}-{pod[12:16]}-{pod[16:20]}-{pod[20:32]}"


@dataclass(frozen=True)
class GenAI:
    url: str
    utilization: Rows
    """Values as the gauge holds them: the CSV's percent / 100."""
    memory: Rows
    pods: tuple[str, ...]
    origin: float
    """The first anonymized timestamp, which the backfill put at ``BASE_TIME``."""
    start: float
    end: float
    profile: Profile
    """One collect of every pod as a single job."""

    def shifted(self, t: float) -> float:
        return BASE_TIME + (t - self.origin)


def families(utilization: Rows, memory: Rows, pods: tuple[str, ...], origin: float) -> list[Family]:
    def labels(pod: str) -> dict[str, str]:
        return {"pod": pod, "namespace": NAMESPACE, "node": f"genai-node-{pods.index(pod) // PODS_PER_NODE}",
                "gpu": gpu_uuid(pod)}

    def series(rows: Rows) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
        return [(labels(pod), [(BASE_TIME + (t - origin), v) for t, v in rows[pod]]) for pod in sorted(rows)]

    return [Family("kubecell_node_gpu_pod_utilization_ratio", "gauge", series(utilization)),
            Family("kubecell_node_gpu_pod_memory_bytes", "gauge", series(memory))]


@pytest.fixture(scope="module")
def genai(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GenAI]:
    percent = genai_rows(UTILIZATION_TAR)
    memory = genai_rows(MEMORY_TAR)
    utilization = {pod: [(t, v / 100) for t, v in rows] for pod, rows in percent.items()}
    pods = tuple(sorted(set(utilization) | set(memory)))
    times = [t for rows in (utilization, memory) for s in rows.values() for t, _ in s]
    origin = min(times)
    start, end = float(BASE_TIME), BASE_TIME + (max(times) - origin)
    with backfilled(Path(tmp_path_factory.mktemp("genai")), families(utilization, memory, pods, origin)) as url:
        profile = collect(Prometheus(url), Job(NAMESPACE, pods, start, end), (GPU_UTILIZATION, GPU_MEMORY))
        yield GenAI(url, utilization, memory, pods, origin, start, end, profile)


def expected(rows: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """A pod's values and weights straight from its CSV rows, by the profiler's own weighting rule."""
    return [v for _, v in rows], sample_weights([t for t, _ in rows])


def expected_distribution(rows: list[tuple[float, float]]) -> Distribution:
    values, weights = expected(rows)
    return distribution(values, weights)


@pytest.mark.parametrize(("metric", "attribute", "gauge"), [
    ("gpu_utilization", "utilization", "kubecell_node_gpu_pod_utilization_ratio"),
    ("gpu_memory", "memory", "kubecell_node_gpu_pod_memory_bytes"),
])
def test_every_pod_equals_its_csv_rows(genai: GenAI, metric: str, attribute: str, gauge: str) -> None:
    rows: Rows = getattr(genai, attribute)
    result = genai.profile.metrics[metric]
    checked = [pod for pod, samples in rows.items() if len(samples) >= 2]
    assert len(checked) >= 140, f"{len(checked)} pods with 2 samples or more in {attribute}"
    assert sorted(result.pods) == sorted(checked)
    for pod in checked:
        series = result.series[pod]
        assert series.source == gauge
        # the raw samples, as stored: none resampled, repeated or lost
        assert series.samples == tuple((genai.shifted(t), v) for t, v in rows[pod]), pod
        assert result.pods[pod] == expected_distribution(rows[pod]), pod
    # the whole data set as one job: the pooled distribution of every pod's rows, in the job's order
    assert result.job == pooled(expected(rows[pod]) for pod in genai.pods if pod in result.pods)


def test_pods_without_a_distribution_are_problems_not_errors(genai: GenAI) -> None:
    told = {(p.pod, p.metric): p.reason for p in genai.profile.problems}
    for metric, rows in (("gpu_utilization", genai.utilization), ("gpu_memory", genai.memory)):
        for pod in genai.pods:
            if pod not in rows:
                assert "no samples in the window" in told[(pod, metric)]
            elif len(rows[pod]) < 2:
                assert "at least 2 needed" in told[(pod, metric)], (pod, metric)
            else:
                assert (pod, metric) not in told
    assert any(len(rows) == 1 for rows in genai.memory.values()), "the data set has a one-sample pod"


def test_a_job_of_several_pods_is_their_pooled_distribution(genai: GenAI) -> None:
    members = tuple(pod for pod in genai.pods[::20] if len(genai.utilization.get(pod, [])) >= 2
                    and len(genai.memory.get(pod, [])) >= 2)
    assert len(members) >= 5
    profile = collect(Prometheus(genai.url), Job(NAMESPACE, members, genai.start, genai.end),
                      (GPU_UTILIZATION, GPU_MEMORY))
    assert profile.problems == ()
    for metric, rows in (("gpu_utilization", genai.utilization), ("gpu_memory", genai.memory)):
        result = profile.metrics[metric]
        assert result.job == pooled(expected(rows[pod]) for pod in members)
        assert result.pods == {pod: genai.profile.metrics[metric].pods[pod] for pod in members}
        total = sum(len(rows[pod]) for pod in members)
        assert result.job is not None
        assert result.job.samples == total


def test_a_window_keeps_only_its_samples(genai: GenAI) -> None:
    """Half the day: the samples with ``start <= t <= end``, no more, none twice at chunk boundaries."""
    pod = max(genai.utilization, key=lambda p: len(genai.utilization[p]))
    middle = genai.start + 12 * 3600
    client = Prometheus(genai.url)
    selector = f'kubecell_node_gpu_pod_utilization_ratio{{namespace="{NAMESPACE}", pod="{pod}"}}'
    (series,) = client.raw(selector, genai.start, middle, chunk=1234.5)
    wanted = [(genai.shifted(t), v) for t, v in genai.utilization[pod] if genai.shifted(t) <= middle]
    assert list(series.samples) == wanted
    assert series.labels["node"].startswith("genai-node-")
    assert series.labels["gpu"] == gpu_uuid(pod)
