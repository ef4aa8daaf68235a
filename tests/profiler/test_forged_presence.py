"""A series' ``node`` and ``gpu`` labels do not put a pod on a GPU: its allocation record does (else its node).

Where Prometheus also scrapes tenants' pods and ``--scrape-job`` is not given, a tenant's pod can export the
node agent's series for itself: Prometheus writes the pod's own ``namespace`` and ``pod`` over the exported
ones, but keeps ``node`` and ``gpu``. Before, such a pod placed on another GPU, exporting the victim's GPU's
labels, was taken to share the victim's GPU: the victim's own record kept time beside the attacker's family that
never happened, and the attacker's record the reverse, so the pair rule admitted the two families together where
the co-location rule refuses them (found by a hostile review)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubecell.kube.names import ANNOTATION_ALLOCATION
from kubecell.kube.records import AllocationRecord, GpuGrant
from kubecell.profiler.history import JobHistory
from kubecell.profiler.jobs import group_pods
from kubecell.profiler.pairs import ALONE, Place
from kubecell.profiler.prometheus import Prometheus, Sample, Series
from kubecell.profiler.run import pod_places, profile_jobs

T = 1_793_527_200.0
GAUGE = "kubecell_node_gpu_pod_utilization_ratio"
MATCHER = re.compile(r'(\w+)(=~|=)"((?:[^"\\]|\\.)*)"')


class InMemory(Prometheus):
    """``raw`` answered from a list of series, by the selector's ``=`` and ``=~`` matchers."""

    def __init__(self, series: list[tuple[dict[str, str], list[Sample]]]) -> None:
        super().__init__("http://127.0.0.1:9")
        self.stored = series

    def raw(self, selector: str, start: float, end: float, **_: Any) -> list[Series]:
        name = selector[:selector.index("{")]
        matchers = [(label, op, value.replace("\\\\", "\\")) for label, op, value in MATCHER.findall(selector)]
        found = []
        for labels, samples in self.stored:
            if labels["__name__"] != name:
                continue
            if all(labels.get(label, "") == value if op == "=" else re.fullmatch(value, labels.get(label, ""))
                   for label, op, value in matchers):
                window = tuple((t, v) for t, v in samples if start <= t <= end)
                if window:
                    found.append(Series(labels, window))
        return found


def stamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def share_pod(namespace: str, name: str, owner: str, node: str, gpu: str | None) -> dict[str, Any]:
    """A pod kubecell placed to share ``gpu`` of ``node`` (time-sliced); ``gpu`` None: a pod without a record."""
    uid = f"uid-{namespace}-{name}"
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid, "creationTimestamp": stamp(T),
                            "ownerReferences": [{"kind": "Job", "name": owner, "uid": f"owner-{namespace}-{owner}",
                                                 "controller": True}]}
    if gpu is not None:
        record = AllocationRecord(allocation_id=f"{uid}-0", pod_uid=uid, attempt=0, node=node,
                                  gpus=[GpuGrant(index=0, uuid=gpu, milli=500, memory_mib=1000)], cpu_milli=0,
                                  memory_mib=0, isolation="accounting", job=f"{namespace}/{owner}", vc="v",
                                  job_class="guaranteed", member=0, batch=1, scheduler="kubecell",
                                  created_at=datetime.fromtimestamp(T, UTC))
        meta["annotations"] = {ANNOTATION_ALLOCATION: record.to_annotation()}
    return {"metadata": meta,
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i", "resources": {
                "limits": {"kubecell.io/gpu-milli": "500", "kubecell.io/gpu-memory": "1000"}}}]},
            "status": {"phase": "Running", "startTime": stamp(T)}}


def every15(first: int, last: int, value: float) -> list[Sample]:
    return [(T + s, value) for s in range(first, last, 15)]


def gauge(namespace: str, pod: str, node: str, gpu: str, job: str) -> dict[str, str]:
    return {"__name__": GAUGE, "namespace": namespace, "pod": pod, "node": node, "gpu": gpu, "job": job}


AGENT, TENANTS = "kubecell-node-agent", "kubernetes-pods"


def test_a_pod_is_on_a_gpu_where_its_record_puts_it_not_where_its_series_say(tmp_path: Path) -> None:
    pods = [share_pod("vision", "llm-7-abcde", "llm-7", "n1", "GPU-A"),
            share_pod("vision", "bert-1-x", "bert-1", "n1", "GPU-A"),   # a real partner, for 10 minutes
            share_pod("mallory", "evil-1-xyz", "evil-1", "n2", "GPU-B"),  # placed elsewhere
            share_pod("mallory", "web-0", "web", "n3", None)]            # no record, on another node
    series = [
        (gauge("vision", "llm-7-abcde", "n1", "GPU-A", AGENT), every15(0, 1800, 0.7)),
        (gauge("vision", "bert-1-x", "n1", "GPU-A", AGENT), every15(1200, 1800, 0.4)),
        # what mallory's pods export for themselves (Prometheus made namespace and pod their own)
        (gauge("mallory", "evil-1-xyz", "n1", "GPU-A", TENANTS), every15(0, 1200, 0.7)),
        (gauge("mallory", "web-0", "n1", "GPU-A", TENANTS), every15(0, 1200, 0.7)),
    ]
    now = datetime.fromtimestamp(T + 1800, UTC)
    with JobHistory.open(f"sqlite:///{tmp_path / 'h.db'}") as history:
        profile_jobs(group_pods(pods), InMemory(series), history, now=now)
        victim = history.get("owner-vision-llm-7")
        assert victim is not None
        kept = {use.partner: use.seconds for use in victim.sharing}
        assert kept == {ALONE: 1200.0, "vision/bert": 600.0}, "mallory's pods were never on GPU-A"
        evil = history.get("owner-mallory-evil-1")
        assert evil is not None
        assert evil.sharing == (), "its series on GPU-A is not its own presence there either"
        assert any("where its allocation record does not put it" in problem for problem in evil.problems), \
            evil.problems
        partners = {row.partner for row in history.sharing() if row.family == "vision/llm"}
        assert partners == {ALONE, "vision/bert"}


def test_where_the_pod_list_puts_each_pod() -> None:
    pods = [share_pod("ns", "a-0", "a", "n1", "GPU-A"), share_pod("ns", "b-0", "b", "n2", None)]
    broken = share_pod("ns", "c-0", "c", "n3", "GPU-C")
    broken["metadata"]["annotations"][ANNOTATION_ALLOCATION] = "{not a record"
    places = pod_places(group_pods([*pods, broken]))
    assert places == {("ns", "a-0"): Place("n1", frozenset({"GPU-A"})), ("ns", "b-0"): Place("n2"),
                      ("ns", "c-0"): Place("n3")}
    assert places[("ns", "a-0")].holds("n1", "GPU-A")
    assert not places[("ns", "a-0")].holds("n1", "GPU-Z")
    assert not places[("ns", "a-0")].holds("n9", "GPU-A")
    assert places[("ns", "b-0")].holds("n2", "GPU-any")
    assert not places[("ns", "b-0")].holds("n1", "GPU-any")
    assert not Place("").holds("", "GPU-A"), "a pod not yet on a node is on no GPU"
