"""Nothing from before a pod's creation is the pod's: not a start its status says came earlier (a node's clock
behind the API server's, a status written by hand), and not samples Prometheus holds under its name from a
previous pod (a StatefulSet's pod made again, a gang run again under its pods' names)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest

from kubecell.profiler.collect import Job, collect
from kubecell.profiler.jobs import group_pods, started_at
from kubecell.profiler.pairs import ALONE, observe_sharing
from kubecell.profiler.prometheus import Prometheus, Sample, Series
from kubecell.profiler.run import record_of
from kubecell.profiler.sources import GPU_UTILIZATION

T = 1_767_225_600.0
GAUGE = GPU_UTILIZATION.sources[0].name
POD_LABEL = re.compile(r'pod=~"([^"]*)"')


def stamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def web_pod(name: str, created: float, started: float) -> dict[str, Any]:
    """A StatefulSet's pod: the owner, and so the job, outlives a pod deleted and made again under its name."""
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}-{created:.0f}",
                         "creationTimestamp": stamp(created),
                         "ownerReferences": [{"kind": "StatefulSet", "name": "web", "uid": "sts-web",
                                              "controller": True}]},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "img:1", "resources": {
                "limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Running", "startTime": stamp(started)}}


def minutes(value: float, first: int, last: int) -> list[Sample]:
    return [(T + 60 * m, value) for m in range(first, last + 1)]


class Canned(Prometheus):
    """The kubecell GPU gauge of each pod (labels as the node agent's), whatever the window asked."""

    def __init__(self, series: dict[str, list[Sample]]) -> None:
        super().__init__("http://127.0.0.1:9")
        self.canned = series

    def raw(self, selector: str, start: float, end: float, **_: Any) -> list[Series]:
        if not selector.startswith(GAUGE + "{"):
            return []
        match = POD_LABEL.search(selector)
        names = match.group(1).split("|") if match else list(self.canned)
        return [Series({"__name__": GAUGE, "pod": name, "namespace": "ns", "node": "n1", "gpu": "GPU-0"},
                       tuple(self.canned[name])) for name in names if name in self.canned]


def test_a_start_before_the_pods_creation_is_taken_as_its_creation_and_told() -> None:
    """Before, the start was kept as written: the run time (and its family's median) and the GPU-hours grew by
    the difference."""
    early = web_pod("web-0", created=T + 1800, started=T + 60)
    assert started_at(early) == (datetime.fromtimestamp(T + 1800, UTC), True)
    assert started_at(web_pod("web-0", created=T, started=T + 60)) == (datetime.fromtimestamp(T + 60, UTC), False)
    (job,) = group_pods([early])
    assert job.started == datetime.fromtimestamp(T + 1800, UTC)
    assert any("before their creation" in problem and "web-0" in problem for problem in job.problems), job.problems
    record = record_of(job, Canned({"web-0": minutes(0.2, 30, 59)}), datetime.fromtimestamp(T + 3600, UTC))
    assert record.started == datetime.fromtimestamp(T + 1800, UTC)


def test_a_pods_samples_before_its_creation_are_a_previous_pods_and_left_out() -> None:
    """web-0 was deleted and made again at minute 30: the samples under its name before then are the old pod's.
    web-1, created at minute 0, keeps the job's window open from then. Before, the new web-0 read as 0.5 (half
    the old pod's 0.9)."""
    pods = [web_pod("web-0", created=T + 1800, started=T + 1830), web_pod("web-1", created=T, started=T + 30)]
    client = Canned({"web-0": minutes(0.9, 0, 29) + minutes(0.1, 30, 59), "web-1": minutes(0.5, 0, 59)})
    (job,) = group_pods(pods)
    record = record_of(job, client, datetime.fromtimestamp(T + 3600, UTC))
    by_pod = {pod.name: pod.metrics["gpu_utilization"] for pod in record.pods}
    assert by_pod["web-0"].mean == pytest.approx(0.1)
    assert by_pod["web-0"].samples == 30
    assert by_pod["web-1"].mean == pytest.approx(0.5)
    # the same rule, on collect itself: a pod without a known creation keeps its whole window
    profile = collect(client, Job("ns", ("web-0", "web-1"), T, T + 3600, {"web-0": T + 1800}), (GPU_UTILIZATION,))
    assert profile.metrics["gpu_utilization"].pods["web-0"].mean == pytest.approx(0.1)
    assert profile.metrics["gpu_utilization"].pods["web-1"].samples == 60


def test_the_sharing_observed_leaves_out_samples_before_the_pods_creation() -> None:
    client = Canned({"p": minutes(0.9, 0, 29) + minutes(0.3, 30, 59)})
    observed = observe_sharing(client, "ns", ["p"], T, T + 3600, lambda pod: None, created={"p": T + 1800})
    ((partner, seconds, busy),) = [(use.partner, use.seconds, use.busy_seconds) for use in observed.sharing]
    assert (partner, seconds) == (ALONE, pytest.approx(1800))
    assert busy == pytest.approx(0.3 * 1800)
    placed = observe_sharing(client, "ns", ["p"], T, T + 3600, lambda pod: None, placed={"p": ("n1", "GPU-0")},
                             created={"p": T + 1800})
    assert placed.sharing == observed.sharing, "read with its GPU's series, the same rule"
