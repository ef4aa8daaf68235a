"""A scheduler SIGKILLed between any two of its writes loses nothing and doubles nothing.

A real ``kubecell scheduler`` process places a workload of three gangs and six shares and kills itself
(SIGKILL, no cleanup) right after its n-th write to the API server, for every n from the first record to
the last binding. A new scheduler then starts on what the dead one left: every gang must end up bound
whole, every bound pod must carry a valid record naming its node, no GPU may be held beyond its capacity
by the records on the API server, and the new engine's state must pass its invariant check.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest

from kubecell.kube.actions import CRASH_AFTER_WRITES
from kubecell.kube.names import ANNOTATION_ALLOCATION
from kubecell.kube.records import parse_record
from kubecell.kube.rest import Kube
from kubecell.testbed.control_plane import ControlPlaneState
from tests.cluster_fixtures import RunningScheduler
from tests.scheduler.test_scheduler import make_pod
from tests.support import wait_for

GANG_A = {"kubecell.io/group": "a", "kubecell.io/group-size": "3"}
GANG_B = {"kubecell.io/group": "b", "kubecell.io/group-size": "2", "kubecell.io/topology": "nvlink"}
GANG_C = {"kubecell.io/group": "c", "kubecell.io/group-size": "3"}
WORKLOAD: list[tuple[str, dict[str, str], dict[str, str]]] = [
    *((f"a-{i}", {"nvidia.com/gpu": "8"}, GANG_A) for i in range(3)),
    *((f"b-{i}", {"nvidia.com/gpu": "4"}, GANG_B) for i in range(2)),
    *((f"c-{i}", {"nvidia.com/gpu": "2"}, GANG_C) for i in range(3)),
    *((f"share-{i}", {"kubecell.io/gpu-milli": "400"}, {}) for i in range(6)),
]
GANG_PODS = sum(1 for _, _, extra in WORKLOAD if extra)
WRITES = 2 * GANG_PODS + (len(WORKLOAD) - GANG_PODS)  # a gang member: record, then binding; a pod alone: a
# binding that carries its record
KILL_POINTS = range(1, WRITES + 1)


def records_everywhere(kube: Kube) -> Counter[tuple[str, int]]:
    """Milli-GPU held per (node, GPU) by every recorded pod on the cluster that still counts."""
    held: Counter[tuple[str, int]] = Counter()
    for pod in kube.get("/api/v1/pods")["items"]:
        meta = pod["metadata"]
        text = (meta.get("annotations") or {}).get(ANNOTATION_ALLOCATION)
        if not text or meta.get("deletionTimestamp") or pod["status"].get("phase") in ("Succeeded", "Failed"):
            continue
        record = parse_record(text, pod=f"{meta['namespace']}/{meta['name']}", uid=meta["uid"])
        for gpu in record.gpus:
            held[(record.node, gpu.index)] += gpu.milli
    return held


def all_bound(kube: Kube, namespace: str) -> list[dict[str, Any]] | None:
    pods = kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
    return pods if len(pods) == len(WORKLOAD) and all(p["spec"].get("nodeName") for p in pods) else None


@pytest.mark.parametrize("kill_after", KILL_POINTS)
def test_sigkill_after_any_write_is_completed_or_rolled_back(
        kill_after: int, testbed: ControlPlaneState, kube: Kube, namespace: str,
        start_scheduler: type[RunningScheduler]) -> None:
    for name, limits, extra in WORKLOAD:
        make_pod(kube, namespace, name, limits, extra)
    env = {**os.environ, CRASH_AFTER_WRITES: str(kill_after)}
    doomed = subprocess.run([sys.executable, "-m", "kubecell.cli.main", "scheduler", "--kubeconfig",
                             testbed.admin_kubeconfig, "--no-leader-elect", "--listen", ""],
                            env=env, capture_output=True, text=True, timeout=120, check=False)
    assert doomed.returncode == -9, f"the scheduler should have been killed:\n{doomed.stderr[-2000:]}"
    assert all(gpu_milli <= 1000 for gpu_milli in records_everywhere(kube).values())
    survivor = start_scheduler(testbed)
    pods = wait_for("every pod to be bound after the restart", lambda: all_bound(kube, namespace))
    for pod in pods:
        meta = pod["metadata"]
        record = parse_record(meta["annotations"][ANNOTATION_ALLOCATION], pod=f"{namespace}/{meta['name']}",
                              uid=meta["uid"])
        assert record.node == pod["spec"]["nodeName"]
    for gang, size in (("a", 3), ("b", 2), ("c", 3)):
        nodes = [p["spec"]["nodeName"] for p in pods if p["metadata"]["name"].startswith(f"{gang}-")]
        assert len(nodes) == size
    b_gpus = {record_gpu for p in pods if p["metadata"]["name"].startswith("b-")
              for record_gpu in _gpu_indices(p)}
    assert all(indices in ((0, 1, 2, 3), (4, 5, 6, 7)) for indices in b_gpus), "gang b keeps its NVLink quads"
    overfull = {slot: milli for slot, milli in records_everywhere(kube).items() if milli > 1000}
    assert not overfull, f"GPUs held twice: {overfull}"
    engine = survivor.scheduler.engine
    assert engine is not None
    engine.check_invariants()


def _gpu_indices(pod: dict[str, Any]) -> list[tuple[int, ...]]:
    meta = pod["metadata"]
    record = parse_record(meta["annotations"][ANNOTATION_ALLOCATION], pod=f"{meta['namespace']}/{meta['name']}",
                          uid=meta["uid"])
    return [tuple(gpu.index for gpu in record.gpus)]
