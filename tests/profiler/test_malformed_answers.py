"""An answer of Prometheus' JSON whose series or samples are not floats costs the job whose query it answers,
never the pass: a tenant's pod can export one of the profiler's series names as a native histogram (Prometheus
then answers that series with ``histograms``, not ``values``), and a broken proxy can write a value that is no
number. Before, both raised a :class:`PrometheusError` that was not ``refused``, and ``profile_jobs`` stopped
the whole pass on it, at every pass: no other tenant's job was saved again (found by a hostile review)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kubecell.profiler.history import JobHistory
from kubecell.profiler.jobs import group_pods
from kubecell.profiler.prometheus import Prometheus, PrometheusError
from kubecell.profiler.run import profile_jobs

T = 1_793_527_200  # 2026-11-01T10:00:00Z
GAUGE = "kubecell_node_gpu_pod_utilization_ratio"
FLOATS = [[T + 60 * i, "0.5"] for i in range(1, 30)]
HISTOGRAMS = [[T + 60 * i, {"count": "1", "sum": "0.5", "buckets": [[0, "0.25", "0.5", "1"]]}] for i in range(1, 30)]


class Answering(Prometheus):
    """Answers a query of the GPU gauge for a namespace with the items ``answers`` gives it (JSON as the API
    writes it), every other query with nothing."""

    def __init__(self, answers: Mapping[str, Sequence[dict[str, Any]]]) -> None:
        super().__init__("http://127.0.0.1:9")
        self.answers = answers

    def _call(self, path: str, query: str, form: Sequence[tuple[str, str]]) -> Any:
        items: list[dict[str, Any]] = []
        if query.startswith(GAUGE + "{"):
            for namespace, answer in self.answers.items():
                if f'namespace="{namespace}"' in query:
                    items.extend(answer)
        return {"resultType": "matrix", "result": items}


def item(namespace: str, pod: str, **samples: Any) -> dict[str, Any]:
    return {"metric": {"__name__": GAUGE, "namespace": namespace, "pod": pod, "node": "n1", "gpu": "GPU-0"},
            **samples}


def stamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def pod(namespace: str, name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}",
                         "creationTimestamp": stamp(T),
                         "ownerReferences": [{"kind": "Job", "name": name.rsplit("-", 1)[0],
                                              "uid": f"owner-{namespace}", "controller": True}]},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "img", "resources": {
                "limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Succeeded", "startTime": stamp(T),
                       "containerStatuses": [{"state": {"terminated": {"finishedAt": stamp(T + 1800)}}}]}}


JOBS = [pod("aaa-mallory", "evil-0"), pod("vision", "train-0")]
NOW = datetime.fromtimestamp(T, UTC) + timedelta(hours=1)


def test_a_series_of_native_histograms_is_skipped_and_told_and_the_pass_goes_on(tmp_path: Path) -> None:
    client = Answering({"aaa-mallory": [item("aaa-mallory", "evil-0", histograms=HISTOGRAMS)],
                        "vision": [item("vision", "train-0", values=FLOATS)]})
    with JobHistory.open(f"sqlite:///{tmp_path / 'h.db'}") as history:
        done = profile_jobs(group_pods(JOBS), client, history, now=NOW)
        assert done.refused == ()
        assert sorted(record.namespace for record in done.saved) == ["aaa-mallory", "vision"]
        victim = history.get("owner-vision")
        assert victim is not None
        assert victim.metrics["gpu_utilization"].mean == pytest.approx(0.5)
        evil = history.get("owner-aaa-mallory")
        assert evil is not None
        assert "gpu_utilization" not in evil.metrics
        assert any(f"{GAUGE}: 29 native-histogram sample(s)" in problem and "skipped" in problem
                   for problem in evil.problems), evil.problems


def test_a_series_with_floats_and_histograms_keeps_its_floats() -> None:
    client = Answering({"ns": [item("ns", "p", values=FLOATS[:10], histograms=HISTOGRAMS[10:])]})
    (series,) = client.raw(f'{GAUGE}{{namespace="ns"}}', T, T + 1800)
    assert [t for t, _ in series.samples] == [t for t, _ in FLOATS[:10]]
    assert list(series.histograms) == [t for t, _ in HISTOGRAMS[10:]]


def test_an_instant_vectors_histogram_is_no_sample() -> None:
    class Vector(Prometheus):
        def _call(self, path: str, query: str, form: Sequence[tuple[str, str]]) -> Any:
            return {"resultType": "vector", "result": [
                {"metric": {"pod": "a"}, "value": [T, "0.5"]},
                {"metric": {"pod": "b"}, "histogram": HISTOGRAMS[0]}]}

    a, b = Vector("http://127.0.0.1:9").query(GAUGE)
    assert (a.samples, a.histograms) == (((T, 0.5),), ())
    assert (b.samples, b.histograms) == ((), (HISTOGRAMS[0][0],))


@pytest.mark.parametrize(("answer", "reason"), [
    ({"values": [*FLOATS[:3], [T + 600, "n/a"]]}, "malformed sample"),
    ({"values": [[T + 600]]}, "malformed sample"),
    ({"values": {"t": "0.5"}}, "malformed result"),
    ({}, "malformed result"),
    ({"histograms": [["soon", {}]]}, "malformed histogram samples"),
])
def test_a_malformed_series_costs_its_job_alone(tmp_path: Path, answer: dict[str, Any], reason: str) -> None:
    client = Answering({"aaa-mallory": [item("aaa-mallory", "evil-0", **answer)],
                        "vision": [item("vision", "train-0", values=FLOATS)]})
    with JobHistory.open(f"sqlite:///{tmp_path / 'h.db'}") as history:
        done = profile_jobs(group_pods(JOBS), client, history, now=NOW)
        assert [record.namespace for record in done.saved] == ["vision"]
        (uid, why), = done.refused
        assert uid == "owner-aaa-mallory"
        assert reason in why


def test_what_is_the_answers_fault_is_refused_and_what_is_prometheus_is_not() -> None:
    bad_label = Answering({"ns": [{"metric": "pod", "values": FLOATS}]})
    with pytest.raises(PrometheusError, match="malformed result") as caught:
        bad_label.query(f'{GAUGE}{{namespace="ns"}}[1h]')
    assert caught.value.refused
    assert caught.value.malformed
    infinite = Answering({"ns": [item("ns", "p", values=[[T + 60, "+Inf"]])]})
    with pytest.raises(PrometheusError, match="not a finite number") as caught:
        infinite.raw(f'{GAUGE}{{namespace="ns"}}', T, T + 600)
    assert caught.value.refused, "a value the caller cannot use is its query's answer's fault"
    assert not PrometheusError("http://p", "up", "cannot reach Prometheus").refused
    assert not PrometheusError("http://p", "up", "HTTP 503", status=503).refused
