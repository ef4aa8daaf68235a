"""What a share's allocation record may grant and still be believed (``kube.trust``). A share that kubecell
alone counts (asked by KubeShare's labels) may be granted less compute than it asks, as ``--place-by-use``
grants it, but never none and never more; one that Kubernetes counts (``kubecell.io/gpu-milli``, which the
kubelet hands out as slots) exactly what it asks. Memory always exactly."""

from __future__ import annotations

from typing import Any

import pytest

from kubecell.core.model import Request
from kubecell.kube.dialects import pod_demand
from kubecell.kube.trust import disagreement, job_base
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
