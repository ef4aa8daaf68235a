"""``spec.ttlSecondsAfterFinished``: a finished ElasticJob is deleted that long after its end, as the controller
recorded it (never as its status says), conditional on its uid. Without it a cluster that ran thousands of jobs a
day kept every one, and the controller's record of them filled. No API server: the in-memory store of
``test_hostile_controller`` (the testbed's turn is in ``test_hostile_finality_testbed``)."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from prometheus_client import generate_latest

from kubecell.elastic import finished
from kubecell.elastic.controller import ElasticController
from kubecell.elastic.states import Phase
from kubecell.kube import elasticjobs as ej
from kubecell.kube.rest import ApiError
from tests.elastic.test_hostile_controller import NOW, NS, controller_over, reconcile
from tests.elastic.test_hostile_finality import RecordStore, forge, running, set_workers

JOB = ej.job_path(NS, "bert")


def with_ttl(store: RecordStore, seconds: Any) -> None:
    store.objects[JOB]["spec"]["ttlSecondsAfterFinished"] = seconds


def finish(store: RecordStore, controller: ElasticController, ttl: int) -> None:
    """The job's workers exit 0 at ``NOW``: its end is recorded then."""
    with_ttl(store, ttl)
    set_workers(store, controller, "Succeeded", ready=False)
    reconcile(controller, store)
    assert store.objects[JOB]["status"]["phase"] == "Succeeded"


def test_a_finished_job_is_deleted_its_ttl_after_its_recorded_end_and_not_before() -> None:
    store = RecordStore()
    controller = running(store)
    finish(store, controller, 60)
    assert controller.expiries.expire(NOW + 59) == []
    assert JOB in store.objects
    assert controller.expiries.expire(NOW + 60) == [f"{NS}/bert"]
    assert JOB not in store.objects


def test_ttl_zero_deletes_at_the_first_pass_after_the_end_and_absent_keeps_it() -> None:
    store = RecordStore()
    controller = running(store)
    finish(store, controller, 0)
    assert controller.expiries.expire(NOW) == [f"{NS}/bert"]
    kept = RecordStore()
    controller = running(kept)
    set_workers(kept, controller, "Succeeded", ready=False)
    reconcile(controller, kept)
    assert controller.expiries.expire(NOW + 10 * 365 * 86400) == []
    assert JOB in kept.objects


def test_a_forged_end_in_the_status_deletes_nothing() -> None:
    """Whoever may write the status says ``Succeeded`` on a running job with a time to live of 0: the controller
    saw no end, so nothing is due."""
    store = RecordStore()
    controller = running(store)
    with_ttl(store, 0)
    forge(store, "Succeeded")
    store.objects[JOB]["status"]["conditions"] = [{"type": "Succeeded", "status": "True",
                                                   "lastTransitionTime": "2020-01-01T00:00:00Z"}]
    reconcile(controller, store, passes=2)
    assert controller.expiries.expire(NOW + 86400) == []
    assert JOB in store.objects


def test_a_restarted_controller_counts_from_the_recorded_end() -> None:
    """The end recorded at NOW; a new controller starts 30 s later: the job goes at NOW + 60, as it would
    have, not 60 s after the restart (nor never, had each restart started the count again)."""
    store = RecordStore()
    controller = running(store)
    finish(store, controller, 60)
    later = controller_over(store, store.objects[JOB])
    later.clock = lambda: NOW + 30
    reconcile(later, store)
    assert later.expiries.due[f"{NS}/bert"][0] == NOW + 60
    assert later.expiries.expire(NOW + 60) == [f"{NS}/bert"]


def test_another_job_under_the_name_is_not_deleted_and_a_refused_delete_is_tried_again(
        caplog: pytest.LogCaptureFixture) -> None:
    store = RecordStore()
    controller = running(store)
    finish(store, controller, 0)
    store.objects[JOB]["metadata"]["uid"] = "another-uid"  # deleted and made again between two watch events
    assert controller.expiries.expire(NOW) == []
    assert JOB in store.objects
    assert f"{NS}/bert" not in controller.expiries.due, "409 (the uid precondition): forgotten"

    store = RecordStore()
    controller = running(store)
    finish(store, controller, 0)
    refusing = store.delete

    def forbidden(path: str, body: dict[str, Any] | None = None, **query: Any) -> dict[str, Any]:
        if path == JOB:
            raise ApiError(403, "Forbidden", "elasticjobs.kubecell.io \"bert\" is forbidden")
        return refusing(path, body, **query)

    store.delete = forbidden  # type: ignore[method-assign]
    with caplog.at_level(logging.DEBUG, "kubecell.elastic"):
        for second in (0, 10, 30):
            assert controller.expiries.expire(NOW + second) == []
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "ttlSecondsAfterFinished" in r.message]
    assert len(warned) == 1, "told once, not at every pass"
    assert "deploy/elastic/rbac.yaml" in warned[0].message
    store.delete = refusing  # type: ignore[method-assign]
    assert controller.expiries.expire(NOW + 60) == [f"{NS}/bert"], "tried again, 30 s after each refusal"
    scraped = generate_latest(controller.metrics.registry).decode()
    assert 'kubecell_elastic_expired_jobs_total{outcome="refused"} 2.0' in scraped
    assert 'kubecell_elastic_expired_jobs_total{outcome="deleted"} 1.0' in scraped


@pytest.mark.parametrize("value", [-1, 2**31, "1h", True, 1.5])
def test_a_ttl_out_of_range_is_a_spec_error_and_deletes_nothing(value: Any) -> None:
    body = {"metadata": {"name": "bert", "namespace": NS, "uid": "bert-uid"},
            "spec": {"minReplicas": 1, "maxReplicas": 2, "ttlSecondsAfterFinished": value,
                     "template": {"spec": {"containers": [{"name": "t", "image": "i"}]}}}}
    with pytest.raises(ej.ElasticJobSpecError, match="ttlSecondsAfterFinished"):
        ej.read_elastic_job(body)
    assert ej.ttl_after_finished(body) is None


@pytest.mark.parametrize("text", [
    {"uid": "bert-uid", "restarts": 0, "target": 2, "ended": 5},  # an end time without an end
    {"uid": "bert-uid", "phase": "Succeeded", "ended": -1},
    {"uid": "bert-uid", "phase": "Succeeded", "ended": 10**12},
    {"uid": "bert-uid", "phase": "Succeeded", "ended": "yesterday"},
])
def test_a_recorded_end_time_that_fails_a_check_is_not_believed(text: dict[str, Any]) -> None:
    assert finished.decode(json.dumps(text)) is None
    assert finished.decode(json.dumps({"uid": "bert-uid", "phase": "Succeeded", "ended": 5})) == finished.Entry(
        "bert-uid", Phase("Succeeded"), None, None, 5)
