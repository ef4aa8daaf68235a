"""Whether an allocation record describes its own pod (``kube.trust``): where it runs and what it holds, then
whose work it is, which its owner can edit while it runs.

What a share's allocation record may grant and still be believed (``kube.trust``). A share that kubecell
alone counts (asked by KubeShare's labels) may be granted less compute than it asks, as ``--place-by-use``
grants it, but never none and never more; one that Kubernetes counts (``kubecell.io/gpu-milli``, which the
kubelet hands out as slots) exactly what it asks. Memory always exactly."""

from __future__ import annotations

from typing import Any

import pytest

from kubecell.core.engine.job import JobClass
from kubecell.core.model import Request
from kubecell.kube.dialects import pod_demand
from kubecell.kube.trust import disagreement, forfeited, job_base, placement_disagreement, standing_disagreement
from tests.kube.test_records import record


def share_pod(*, by_labels: bool) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "p1", "namespace": "team-a", "uid": "7c1e0c3a-1",
                                "annotations": {"kubecell.io/vc": "team-a"}}
    resources: dict[str, Any] = {}
    if by_labels:
        metadata["labels"] = {"sharedgpu/gpu_request": "0.5", "sharedgpu/gpu_mem": str(8192 * 1024 * 1024)}
    else:
        resources = {"limits": {"kubecell.io/gpu-milli": "500", "kubecell.io/gpu-memory": "8192"}}
    return {"metadata": metadata, "spec": {"nodeName": "n1", "schedulerName": "kubecell",
                                           "containers": [{"name": "c", "resources": resources}]}}


CASES = [
    (500, 8192, True, True),
    (150, 8192, True, False),
    (1, 8192, True, False),
    (0, 8192, False, False),
    (600, 8192, False, False),
    (150, 4096, False, False),
    (500, 16_384, False, False),
]
IDS = ["as asked", "less (placed by use)", "the least", "none: no compute limit at all", "more", "less memory",
       "more memory"]


@pytest.mark.parametrize(("granted_milli", "granted_memory", "by_labels", "by_resource"), CASES, ids=IDS)
def test_a_share_record_may_grant_less_compute_only_where_kubecell_alone_counts_it(
        granted_milli: int, granted_memory: int, by_labels: bool, by_resource: bool) -> None:
    for labelled, believed in ((True, by_labels), (False, by_resource)):
        pod = share_pod(by_labels=labelled)
        demand = pod_demand(pod)
        assert (demand.request.gpu_milli, demand.request.gpu_memory_mib) == (500, 8192)
        granted = Request("team-a/p1", gpu_count=1, gpu_milli=granted_milli, gpu_memory_mib=granted_memory)
        written = record(granted, (1,), job=job_base(demand, pod), vc="team-a")
        problem = disagreement(pod, written, demand, default_vc="default")
        assert (problem is None) == believed, (labelled, problem)
        if problem is not None:
            assert f"{'at most ' if labelled else ''}500 milli, 8192 MiB" in problem


@pytest.mark.parametrize("edit", [{"kubecell.io/vc": "team-b"}, {"kubecell.io/isolation": "mps"},
                                  {"kubecell.io/opportunistic": "true"}], ids=["vc", "isolation", "opportunistic"])
def test_an_edited_standing_forfeits_it_and_keeps_the_placement(edit: dict[str, str]) -> None:
    """The owner edits a running pod's VC, isolation or class: the record still says where it runs and what it
    holds (believed), and it is counted as opportunistic work alone, in the record's VC, never the one written."""
    pod = share_pod(by_labels=False)
    demand = pod_demand(pod)
    granted = Request("team-a/p1", gpu_count=1, gpu_milli=500, gpu_memory_mib=8192)
    written = record(granted, (1,), job=job_base(demand, pod), vc="team-a", job_class=JobClass.GUARANTEED, member=3)
    assert disagreement(pod, written, demand, default_vc="default") is None
    pod["metadata"]["annotations"].update(edit)
    edited = pod_demand(pod)
    assert placement_disagreement(pod, written, edited) is None
    assert standing_disagreement(pod, written, edited, default_vc="default") is not None
    kept = forfeited(written, pod)
    assert (kept.job, kept.job_class, kept.vc, kept.member, kept.batch) == ("team-a/p1@7c1e0c3a", "opportunistic",
                                                                            "team-a", 0, 1)
    assert (kept.node, kept.gpus, kept.isolation) == (written.node, written.gpus, written.isolation)


def test_a_record_holding_other_gpus_than_asked_is_a_placement_disagreement() -> None:
    pod = share_pod(by_labels=False)
    demand = pod_demand(pod)
    wrong = record(Request("team-a/p1", gpu_count=2, gpu_milli=1000), (0, 1), job=job_base(demand, pod), vc="team-a")
    assert "asks for a share" in (placement_disagreement(pod, wrong, demand) or "")


def test_a_running_pod_naming_no_vc_keeps_the_default_it_was_placed_under() -> None:
    """The operator restarts the scheduler with another ``--default-vc``: a running pod that names no VC keeps the
    VC its record names (a reconfiguration never demotes running work); a record on a pod not bound yet must name
    the default in force, or it is not the decision kubecell would make now."""
    pod = share_pod(by_labels=False)
    del pod["metadata"]["annotations"]["kubecell.io/vc"]
    demand = pod_demand(pod)
    granted = Request("team-a/p1", gpu_count=1, gpu_milli=500, gpu_memory_mib=8192)
    written = record(granted, (1,), job=job_base(demand, pod), vc="old-default")
    assert standing_disagreement(pod, written, demand, default_vc="new-default") is None
    del pod["spec"]["nodeName"]
    assert "'old-default'" in (standing_disagreement(pod, written, demand, default_vc="new-default") or "")
