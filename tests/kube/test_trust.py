"""What a share's allocation record may grant and still be believed (``kube.trust``): exactly the compute it
asks, or less (a share placed by its family's use), but never none and never more; and exactly its memory."""

from __future__ import annotations

from typing import Any

import pytest

from kubecell.core.model import Request
from kubecell.kube.dialects import pod_demand
from kubecell.kube.trust import disagreement, job_base
from tests.kube.test_records import record


def share_pod(milli: int, memory: int) -> dict[str, Any]:
    return {"metadata": {"name": "p1", "namespace": "team-a", "uid": "7c1e0c3a-1",
                         "annotations": {"kubecell.io/vc": "team-a"}},
            "spec": {"nodeName": "n1", "schedulerName": "kubecell", "containers": [{"name": "c", "resources": {
                "limits": {"kubecell.io/gpu-milli": str(milli), "kubecell.io/gpu-memory": str(memory)}}}]}}


@pytest.mark.parametrize(("granted_milli", "granted_memory", "believed"), [
    (500, 8192, True),
    (150, 8192, True),
    (1, 8192, True),
    (0, 8192, False),
    (600, 8192, False),
    (150, 4096, False),
    (500, 16_384, False),
], ids=["as asked", "less (placed by use)", "the least", "none: no compute limit at all", "more",
        "less memory", "more memory"])
def test_a_share_record_may_grant_less_compute_never_none_or_more(granted_milli: int, granted_memory: int,
                                                                   believed: bool) -> None:
    pod = share_pod(500, 8192)
    demand = pod_demand(pod)
    granted = Request("team-a/p1", gpu_count=1, gpu_milli=granted_milli, gpu_memory_mib=granted_memory)
    written = record(granted, (1,), job=job_base(demand, pod), vc="team-a")
    problem = disagreement(pod, written, demand, default_vc="default")
    assert (problem is None) == believed, problem
    if not believed:
        assert problem is not None
        assert "at most 500 milli, 8192 MiB" in problem
