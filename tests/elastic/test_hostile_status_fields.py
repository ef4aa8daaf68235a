"""Whoever may patch ``elasticjobs/status`` (the scheduler's ServiceAccount writes its conditions and goodput models
there; any user granted status rights) rewrites ``status.restarts`` or ``status.targetReplicas`` on a running
ElasticJob. Before, the controller took both for its own memory: a forged restart count made every worker stale
(each is labelled with the rendezvous run it joins, the count when it was made), so the whole job restarted; a
count forged to ``maxRestarts`` made the next failure final; a forged target passed for a first start or a
resize. Now the controller keeps both in its own record (the ConfigMap ``kubecell-elastic-finished``, one entry
per job, written after the status and before any action: a change it cannot keep there is not acted on), and
writes a status that disagrees back, with one ``StatusNotObserved`` Warning. A job it ran before it kept counts
takes the count its status and its newest worker's run label both allow.

No API server: the in-memory store of ``test_hostile_controller``, with the record of ``test_hostile_finality``."""

from __future__ import annotations

from typing import Any

import pytest

from kubecell.kube import elasticjobs as ej
from kubecell.kube.elasticjob_objects import worker_pod
from kubecell.kube.watch import Event
from tests.elastic.test_hostile_controller import NS, Store, controller_over, job, pod_path, reconcile
from tests.elastic.test_hostile_finality import RecordStore, pods, running, set_workers

JOB = ej.job_path(NS, "bert")
ENTRY = f"{NS}.bert"
NOT_OBSERVED = "StatusNotObserved"


def forge(store: Store, **fields: Any) -> None:
    """What a status writer sends: a merge patch of ``/status``."""
    store.patch(f"{JOB}/status", {"status": fields})


def status(store: Store) -> dict[str, Any]:
    return dict(store.objects[JOB]["status"])


def workers_now(store: Store) -> dict[str, tuple[str, str]]:
    """Worker name -> (its pod's uid, its rendezvous run label)."""
    return {obj["metadata"]["name"]: (obj["metadata"]["uid"], obj["metadata"]["labels"][ej.LABEL_RUN])
            for obj in pods(store) if obj["metadata"]["labels"].get(ej.LABEL_ROLE) == ej.ROLE_WORKER}


def told(store: Store, reason: str = NOT_OBSERVED) -> list[str]:
    return [message for kind, message in store.warnings() if kind == reason]


def reasons(store: Store) -> list[str]:
    return [event["reason"] for event in store.events]


def seen(store: Store, controller: Any, passes: int = 2) -> None:
    """The watch shows the pods as the store holds them, then ``passes`` reconciles (deleted workers made again)."""
    for _ in range(passes):
        controller._apply(Event("pods", "SYNC", objects=pods(store)))
        reconcile(controller, store)


def fail(store: Store, controller: Any, name: str) -> None:
    """Worker ``name`` exits non-zero (torchrun gave up); the watch shows it."""
    obj = store.objects[pod_path(name)]
    obj["status"] = {"phase": "Failed", "conditions": [{"type": "Ready", "status": "False"}]}
    controller._apply(Event("pods", "SYNC", objects=pods(store)))


# --- status.restarts -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("forged", [1, 3, 1000], ids=["one-more", "maxRestarts", "past-maxRestarts"])
def test_a_forged_restart_count_replaces_no_worker_and_is_written_back(forged: int) -> None:
    store = RecordStore()
    controller = running(store)
    before, events = workers_now(store), len(store.events)
    forge(store, restarts=forged)
    reconcile(controller, store, passes=3)
    assert not [path for path in store.deleted if "/pods/" in path], "no worker deleted"
    assert workers_now(store) == before, "no worker replaced: they stay in run 0"
    assert status(store)["restarts"] == 0, "the status written back"
    assert status(store)["phase"] == "Running"
    assert store.record()[ENTRY] == {"uid": "bert-uid", "restarts": 0, "target": 2}
    assert reasons(store)[events:] == [NOT_OBSERVED], store.events[events:]
    assert f"status.restarts said {forged}" in told(store)[0]


def test_a_restart_count_forged_to_max_restarts_does_not_make_the_next_failure_final() -> None:
    """Forged to ``maxRestarts`` (3), the count made the next failure the last: the job Failed, its workers
    stopped. It is written back, and one failure is the first restart of three."""
    store = RecordStore()
    controller = running(store)
    forge(store, restarts=3)
    reconcile(controller, store)
    fail(store, controller, "bert-worker-0")
    reconcile(controller, store)
    seen(store, controller)
    written = status(store)
    assert written["phase"] == "Restarting", told(store, "MaxRestartsExceeded")
    assert written["restarts"] == 1
    assert "phase" not in store.record()[ENTRY], "not recorded as ended"
    assert store.record()[ENTRY]["restarts"] == 1
    assert set(workers_now(store)) == {"bert-worker-0", "bert-worker-1"}
    assert {run for _, run in workers_now(store).values()} == {"1"}, "made again in run 1"


def test_a_real_restart_is_recorded_and_outlives_a_forged_count_and_a_controller_restart() -> None:
    """The count is recorded before the workers go; a status writer then says 0 again (as a count of 0 would
    have made the run-1 workers stale), and a new controller starts: nothing is replaced."""
    store = RecordStore()
    controller = running(store)
    fail(store, controller, "bert-worker-1")
    reconcile(controller, store)
    assert store.record()[ENTRY] == {"uid": "bert-uid", "restarts": 1, "target": 2}
    seen(store, controller)  # the old workers are gone: made again in run 1
    set_workers(store, controller, "Running")
    reconcile(controller, store)
    assert status(store)["phase"] == "Running"
    before, deleted = workers_now(store), len(store.deleted)
    assert {run for _, run in before.values()} == {"1"}
    forge(store, restarts=0)
    again = controller_over(store, store.objects[JOB])
    reconcile(again, store, passes=3)
    assert workers_now(store) == before, "the run-1 workers are not stale"
    assert len(store.deleted) == deleted
    assert status(store)["restarts"] == 1
    assert len(told(store)) == 1


def test_the_same_forgery_repeated_is_told_once() -> None:
    store = RecordStore()
    controller = running(store)
    for _ in range(5):
        forge(store, restarts=2)
        reconcile(controller, store)
    assert status(store)["restarts"] == 0
    assert len(told(store)) == 1, store.warnings()


# --- status.targetReplicas -------------------------------------------------------------------------------------


@pytest.mark.parametrize("forged", [0, 4, 3, 1], ids=["zero", "maxReplicas", "above", "below"])
def test_a_forged_target_changes_no_worker_and_is_written_back(forged: int) -> None:
    """0 passed for a first start (a Created Event, the phase Pending, the rendezvous clock reset); another value
    for a resize (Resizing from it). The workers follow ``spec.replicas`` alone, as before."""
    store = RecordStore()
    controller = running(store)
    before, events = workers_now(store), len(store.events)
    stamp = status(store).get("lastResizeTime")
    forge(store, targetReplicas=forged)
    reconcile(controller, store, passes=3)
    assert workers_now(store) == before
    assert not [path for path in store.deleted if "/pods/" in path]
    written = status(store)
    assert (written["targetReplicas"], written["phase"]) == (2, "Running")
    assert written.get("lastResizeTime") == stamp, "no change of the workers"
    assert reasons(store)[events:] == [NOT_OBSERVED], store.events[events:]
    assert f"status.targetReplicas said {forged}" in told(store)[0]


def test_both_forged_then_a_worker_fails_counts_one_restart() -> None:
    store = RecordStore()
    controller = running(store)
    forge(store, restarts=3, targetReplicas=0)
    fail(store, controller, "bert-worker-1")
    reconcile(controller, store, passes=3)
    written = status(store)
    assert (written["phase"], written["restarts"], written["targetReplicas"]) == ("Restarting", 1, 2)
    assert "Created" not in reasons(store)[2:], "not taken for a first start"


def test_a_scale_through_spec_replicas_is_still_followed() -> None:
    """What the scheduler decides (``/scale``) moves the workers; the record follows."""
    store = RecordStore()
    controller = running(store)
    store.patch(f"{JOB}/scale", {"spec": {"replicas": 3}})
    reconcile(controller, store)
    assert status(store)["targetReplicas"] == 3
    assert store.record()[ENTRY]["target"] == 3
    assert "bert-worker-2" in workers_now(store)
    assert not told(store)


# --- where the record has no entry, or refuses one -------------------------------------------------------------


def upgraded(store: RecordStore, run: int, **fields: Any) -> Any:
    """A job an earlier controller ran (no entry in the record), its two workers in run ``run``, Ready."""
    spec = ej.read_elastic_job(job())
    for index in range(2):
        made = worker_pod(spec, index, run)
        made["spec"]["nodeName"] = "n1"
        made["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        store.put(pod_path(made["metadata"]["name"]), made)
    return controller_over(store, job(status={"phase": "Running", "targetReplicas": 2, **fields}))


def test_an_upgrade_takes_the_count_from_the_workers_it_made() -> None:
    store = RecordStore()
    controller = upgraded(store, 1, restarts=1)
    before = workers_now(store)
    reconcile(controller, store, passes=2)
    assert workers_now(store) == before, "nothing replaced"
    assert store.record()[ENTRY] == {"uid": "bert-uid", "restarts": 1, "target": 2}
    assert not told(store)


def test_an_upgrade_does_not_take_a_count_its_workers_deny() -> None:
    """The status says 3, the workers the controller made say run 0: they are kept, and the count is 0."""
    store = RecordStore()
    controller = upgraded(store, 0, restarts=3)
    before = workers_now(store)
    reconcile(controller, store, passes=2)
    assert workers_now(store) == before
    assert status(store)["restarts"] == 0
    assert store.record()[ENTRY]["restarts"] == 0
    assert len(told(store)) == 1


def test_a_restart_the_record_refuses_waits_until_it_is_kept() -> None:
    """The record is full (or the API server away): a restart it does not hold is not acted on (its workers would
    be made in a run no record holds, and a restarted controller would take them for stale), told once; once
    the record takes it, the job restarts, counted once."""
    store = RecordStore()
    controller = running(store)
    store.record_full = True
    fail(store, controller, "bert-worker-0")
    for _ in range(3):  # as the loop does: the refusal costs the pass, logged in one line
        controller._apply(Event("elasticjobs", "MODIFIED", store.get(JOB)))
        assert controller.reconcile_dirty() == 1
    assert not [path for path in store.deleted if "/pods/" in path], "nothing acted on"
    assert store.record()[ENTRY]["restarts"] == 0
    assert len(told(store, "RecordRefused")) == 1, store.warnings()
    store.record_full = False
    reconcile(controller, store)
    seen(store, controller)
    assert store.record()[ENTRY] == {"uid": "bert-uid", "restarts": 1, "target": 2}
    assert status(store)["restarts"] == 1
    assert {run for _, run in workers_now(store).values()} == {"1"}
    assert not told(store), "the status the controller wrote first is its own"


# --- the rendezvous deadline's clock --------------------------------------------------------------------------


def test_a_forged_resize_time_does_not_make_a_rendezvous_time_out() -> None:
    """Fewer than minReplicas workers Ready: the rendezvous deadline counts. A status writer moved
    ``lastResizeTime`` and the ``Available`` condition's transition time years back, and the controller counted
    from them: the job was restarted at once (``RendezvousTimeout``). The clock is now the controller's own."""
    store = RecordStore()
    body = job()
    body["spec"].update(minReplicas=2, rendezvousTimeoutSeconds=900)
    clock = [1_800_000_000.0 + 10 * 86_400]  # ten days after the job was made (its creationTimestamp)
    controller = controller_over(store, body)
    controller.clock = lambda: clock[0]
    reconcile(controller, store)
    set_workers(store, controller, "Running", ready=False)
    reconcile(controller, store)
    before = workers_now(store)
    forge(store, lastResizeTime="2020-01-01T00:00:00Z",
          conditions=[{"type": "Available", "status": "False", "lastTransitionTime": "2020-01-01T00:00:00Z",
                       "reason": "Starting", "message": "forged"}])
    clock[0] += 60
    seen(store, controller, passes=3)
    assert workers_now(store) == before, "no worker replaced: the rendezvous has had a minute, not years"
    assert status(store)["restarts"] == 0
    clock[0] += 900
    seen(store, controller, passes=2)
    assert status(store)["restarts"] == 1, "past the deadline on the controller's clock, it still restarts"
    assert any(c.get("reason") == "RendezvousTimeout" for c in status(store)["conditions"]), status(store)


@pytest.mark.parametrize("max_restarts", [0, 3])
def test_time_spent_waiting_for_the_scheduler_is_no_stuck_rendezvous(max_restarts: int) -> None:
    """The gang waited for capacity longer than the rendezvous timeout (a busy cluster). Before, the clock ran
    from the workers' creation, so the job was restarted (or, with ``maxRestarts: 0``, failed) the first time its
    workers were seen running and not yet Ready. The deadline counts from when minReplicas have started."""
    store = RecordStore()
    body = job()
    body["spec"].update(minReplicas=2, rendezvousTimeoutSeconds=900, maxRestarts=max_restarts)
    clock = [1_800_000_000.0]
    controller = controller_over(store, body)
    controller.clock = lambda: clock[0]
    reconcile(controller, store)
    controller._apply(Event("pods", "SYNC", objects=pods(store)))
    for _ in range(3):  # the workers wait, unscheduled, for half an hour
        clock[0] += 600
        seen(store, controller, passes=1)
    assert status(store)["phase"] == "Pending"
    set_workers(store, controller, "Running", ready=False)
    clock[0] += 10
    seen(store, controller, passes=2)
    assert status(store)["phase"] not in ("Failed", "Restarting"), status(store)
    assert status(store)["restarts"] == 0
    assert "RendezvousTimeout" not in reasons(store)
    clock[0] += 900
    seen(store, controller, passes=2)
    assert "RendezvousTimeout" in reasons(store), "a rendezvous stuck once its workers started still times out"
