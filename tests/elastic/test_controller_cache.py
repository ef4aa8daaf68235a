"""What the ElasticJob controller keeps between events stays bounded by what exists: pods of label values never
seen again, and the state of jobs deleted while the watch was down, are let go. (The cache alone, fed the events
its watch would give: no API server is involved.)"""

from __future__ import annotations

from typing import Any

from kubecell.elastic.controller import ElasticController
from kubecell.elastic.expectations import Expectations
from kubecell.kube.watch import Event


def labelled(uid: str, job: str) -> dict[str, Any]:
    return {"metadata": {"uid": uid, "namespace": "ns", "name": f"{job}-worker-0",
                         "labels": {"kubecell.io/elastic-job": job, "kubecell.io/elastic-role": "worker"}}}


def test_pods_of_label_values_never_seen_again_leave_nothing_behind() -> None:
    controller = ElasticController(None)  # type: ignore[arg-type]  # the cache only: nothing is sent
    for index in range(100):
        pod = labelled(f"p{index}", f"job{index}")
        controller._apply(Event("pods", "ADDED", pod))
        controller._apply(Event("pods", "DELETED", pod))
    assert controller.pods == {}
    assert controller.pods_of == {}


def test_a_resync_forgets_the_jobs_deleted_meanwhile() -> None:
    controller = ElasticController(None)  # type: ignore[arg-type]
    for key in ("ns/gone", "ns/kept"):
        controller.expectations[key] = Expectations()
        controller.writes.services[key] = (True, 0.0)
        controller.job_events.told[key] = ("a refused create",)
    kept = {"metadata": {"namespace": "ns", "name": "kept"}}
    controller._apply(Event("elasticjobs", "SYNC", objects=(kept,)))
    told = set(controller.job_events.told)
    assert set(controller.expectations) == set(controller.writes.services) == told == {"ns/kept"}
