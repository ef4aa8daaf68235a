"""The queue order a VC's users see on a real control plane, with run times from a real job history: the scheduler
(``--queue-order shortest-expected --history``) reads each waiting pod's family's past runs from the profiler's
store and, when a node frees, binds the job expected to end soonest first; by age (the default) the older one.
``bench/queue_order_live.py`` measures what that order does to JCTs on the testbed."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from kubecell.kube.rest import Kube
from kubecell.profiler.history import JobHistory, JobRecord, Outcome
from kubecell.profiler.knowledge import HistoryKnowledge
from kubecell.scheduler.options import SchedulerOptions
from kubecell.testbed.control_plane import ControlPlaneState
from tests.cluster_fixtures import RunningScheduler
from tests.scheduler.trust_support import create_pod, pod
from tests.support import wait_for

NODE = "philly-033"
PINNED = {"nodeSelector": {"kubernetes.io/hostname": NODE}}
RUN_SECONDS = {"long": 3600.0, "short": 30.0}


@pytest.fixture
def history(tmp_path: Path) -> Iterator[JobHistory]:
    with JobHistory.open(f"sqlite:///{tmp_path / 'history.db'}") as opened:
        yield opened


def file_past_runs(history: JobHistory, namespace: str) -> None:
    """Three Succeeded runs of each family yesterday, as ``kubecell profile collect`` files them."""
    start = datetime.now(UTC) - timedelta(days=1)
    for family, seconds in RUN_SECONDS.items():
        for index in range(3):
            begun = start + timedelta(hours=index)
            history.save(JobRecord(uid=f"{namespace}-{family}-{index}", namespace=namespace, owner_kind="Pod",
                                   owner_name=f"{family}-{index + 100}", created=begun, started=begun,
                                   finished=begun + timedelta(seconds=seconds), outcome=Outcome.SUCCEEDED,
                                   gpus_per_pod=8))


def waiting(kube: Kube, namespace: str, name: str) -> bool:
    """The scheduler has seen the pod and told it it waits."""
    conditions = pod(kube, namespace, name)["status"].get("conditions") or []
    return any(c["type"] == "PodScheduled" and c["status"] == "False" for c in conditions)


@pytest.mark.parametrize(("order", "first"), [("shortest-expected", "short-1"), ("age", "long-1")])
def test_a_freed_node_goes_to_the_job_its_history_expects_to_end_first(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler],
        history: JobHistory, order: str, first: str) -> None:
    file_past_runs(history, namespace)
    start_scheduler(testbed, SchedulerOptions(queue_order=order, knowledge=HistoryKnowledge(history)))
    create_pod(kube, namespace, "blocker", {"nvidia.com/gpu": "8"}, spec=PINNED)
    wait_for("the blocker to take the node", lambda: pod(kube, namespace, "blocker")["spec"].get("nodeName") == NODE)
    create_pod(kube, namespace, "long-1", {"nvidia.com/gpu": "8"}, spec=PINNED)  # older: first by age
    wait_for("the long job to wait", lambda: waiting(kube, namespace, "long-1"))
    create_pod(kube, namespace, "short-1", {"nvidia.com/gpu": "8"}, spec=PINNED)
    wait_for("the short job to wait", lambda: waiting(kube, namespace, "short-1"))

    kube.delete(f"/api/v1/namespaces/{namespace}/pods/blocker", gracePeriodSeconds=0)
    bound = wait_for("a waiting job to take the freed node",
                     lambda: [name for name in ("long-1", "short-1")
                              if pod(kube, namespace, name)["spec"].get("nodeName")])
    assert bound == [first], f"{order}: {bound} bound first"
