"""Whoever may patch ``elasticjobs/status`` writes ``phase: Succeeded`` (or ``Failed``) on a running ElasticJob.
Before, the controller took the phase for the job's end: its rendezvous Service and host were deleted (with
``Failed``, its running workers too), killing the training. Now an end is what the controller itself saw (its
workers' exits, its restarts spent), recorded in the ConfigMap ``kubecell-elastic-finished`` of its own
namespace before any action; a status that claims one without that record is corrected, with a Warning, and
a job that did end stays ended after its pods are gone, across a restart of the controller.

No API server: the in-memory store of ``test_hostile_controller``, which also keeps ConfigMaps."""

from __future__ import annotations

import copy
import json
from typing import Any

import yaml

from kubecell.elastic import finished
from kubecell.elastic.controller import ElasticController
from kubecell.kube import elasticjobs as ej
from kubecell.kube.rest import ApiError
from kubecell.kube.watch import Event
from tests.elastic.support import DEPLOY
from tests.elastic.test_hostile_controller import (
    NOW,
    NS,
    Store,
    controller_over,
    job,
    pod_path,
    reconcile,
    service_path,
)

RECORDS = [f"/api/v1/namespaces/kubecell-system/configmaps/{finished.configmap_name(shard)}"
           for shard in range(finished.SHARDS)]
KEY = f"{NS}/bert"


def record_of(key: str) -> str:
    """The path of the record's ConfigMap that holds job ``key``."""
    return RECORDS[finished.shard_of(key)]


class RecordStore(Store):
    """The store, with a ConfigMap's ``data`` merged by a patch as the API server does (None takes a key out)."""

    def __init__(self, *, keeping: bool = True) -> None:
        super().__init__()
        self.refuse_record = False
        self.record_full = False
        if keeping:  # a controller of this version ran before: the record exists
            for shard, path in enumerate(RECORDS):
                self.put(path, {"apiVersion": "v1", "kind": "ConfigMap", "data": {},
                                "metadata": {"name": finished.configmap_name(shard), "namespace": "kubecell-system"}})

    def get(self, path: str, **query: Any) -> dict[str, Any]:
        if path in RECORDS and self.refuse_record:
            raise ApiError(403, "Forbidden", "configmaps is forbidden")
        return super().get(path, **query)

    def patch(self, path: str, body: dict[str, Any], **query: Any) -> dict[str, Any]:
        if "/configmaps/" not in path:
            return super().patch(path, body, **query)
        if path not in self.objects:
            raise ApiError(404, "NotFound", f"{path} not found")
        if self.record_full:
            raise ApiError(422, "Invalid", "ConfigMap \"kubecell-elastic-finished\" is invalid: []: Too long: "
                                           "must have at most 1048576 bytes")
        data = self.objects[path].setdefault("data", {})
        for key, value in body["data"].items():
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value
        return copy.deepcopy(self.objects[path])

    def record(self) -> dict[str, Any]:
        """Every entry of the record, from whichever of its ConfigMaps holds it."""
        return {key: json.loads(value) for path in RECORDS
                for key, value in (self.objects.get(path, {}).get("data") or {}).items()}


def pods(store: Store) -> tuple[dict[str, Any], ...]:
    return tuple(obj for path, obj in store.objects.items() if "/pods/" in path)


def set_workers(store: Store, controller: ElasticController, phase: str, *, ready: bool = True) -> None:
    """Every worker bound and in ``phase`` (Ready when Running), as the kubelet writes it; the watch shows it."""
    for path, obj in store.objects.items():
        if "/pods/" in path and obj["metadata"]["labels"].get(ej.LABEL_ROLE) == ej.ROLE_WORKER:
            obj["spec"]["nodeName"] = "n1"
            obj["status"] = {"phase": phase, "conditions": [{"type": "Ready", "status": str(ready)}]}
    controller._apply(Event("pods", "SYNC", objects=pods(store)))


def running(store: RecordStore) -> ElasticController:
    """A job of two Ready workers, its rendezvous Service and host made by the controller."""
    controller = controller_over(store, job())
    reconcile(controller, store)
    controller._apply(Event("pods", "SYNC", objects=pods(store)))
    set_workers(store, controller, "Running")
    reconcile(controller, store)
    assert store.objects[ej.job_path(NS, "bert")]["status"]["phase"] == "Running"
    return controller


def forge(store: Store, phase: str) -> None:
    """What a status writer sends: a merge patch of ``/status``."""
    store.patch(f"{ej.job_path(NS, 'bert')}/status", {"status": {"phase": phase}})


def test_a_forged_succeeded_stops_nothing_and_is_corrected_with_a_warning() -> None:
    store = RecordStore()
    controller = running(store)
    forge(store, "Succeeded")
    reconcile(controller, store, passes=3)
    assert service_path() in store.objects, "the rendezvous Service is kept"
    assert pod_path("bert-rdzv") in store.objects, "and its host"
    assert store.objects[ej.job_path(NS, "bert")]["status"]["phase"] == "Running", "the status corrected"
    told = [message for reason, message in store.warnings() if reason == "PhaseNotObserved"]
    assert len(told) == 1, store.warnings()
    assert "Succeeded" in told[0]
    assert store.record() == {f"{NS}.bert": {"uid": "bert-uid", "restarts": 0, "target": 2}}, "no end recorded"


def test_a_forged_failed_deletes_no_worker() -> None:
    store = RecordStore()
    controller = running(store)
    forge(store, "Failed")
    reconcile(controller, store, passes=2)
    assert not [path for path in store.deleted if "/pods/" in path], store.deleted
    assert store.objects[ej.job_path(NS, "bert")]["status"]["phase"] == "Running"


def test_a_job_that_ended_stays_ended_after_its_pods_are_gone_and_a_restart() -> None:
    """Its workers exit 0: the end is recorded (uid, phase) before the rendezvous goes. Then the pod garbage
    collector deletes the ended workers, a status writer rewrites the phase, and a new controller starts: the
    job is still Succeeded, and no worker is made again."""
    store = RecordStore()
    controller = running(store)
    set_workers(store, controller, "Succeeded", ready=False)
    reconcile(controller, store)
    assert store.objects[ej.job_path(NS, "bert")]["status"]["phase"] == "Succeeded"
    assert store.record() == {f"{NS}.bert": {"uid": "bert-uid", "phase": "Succeeded", "restarts": 0, "target": 2,
                                             "ended": int(NOW)}}
    assert service_path() not in store.objects
    for path in [path for path in store.objects if "/pods/" in path]:
        del store.objects[path]
    forge(store, "Running")
    again = controller_over(store, store.objects[ej.job_path(NS, "bert")])
    reconcile(again, store, passes=3)
    assert not pods(store), "no worker made again"
    assert store.objects[ej.job_path(NS, "bert")]["status"]["phase"] == "Succeeded"
    assert not [r for r, _ in store.warnings() if r in ("WorkerLost", "PhaseNotObserved")], store.warnings()


def test_an_end_the_record_refuses_is_acted_on_all_the_same() -> None:
    """The record is full (some 8,000 jobs that still exist): the end was decided from the workers, not
    from a status, so it is still acted on (the rendezvous goes) rather than left holding what it held."""
    store = RecordStore()
    controller = running(store)
    store.record_full = True
    set_workers(store, controller, "Succeeded", ready=False)
    reconcile(controller, store, passes=2)
    assert store.objects[ej.job_path(NS, "bert")]["status"]["phase"] == "Succeeded"
    assert service_path() not in store.objects, "the rendezvous Service removed although the record refused"
    assert "phase" not in store.record()[KEY.replace("/", ".")], "refused: the entry of the running job is left"


def test_the_first_controller_to_keep_the_record_takes_on_the_ends_statuses_state() -> None:
    """An upgrade: no record yet, a job its earlier controller made Succeeded, its pods long gone. It is taken on
    (and the record made), not started again."""
    store = RecordStore(keeping=False)
    controller = controller_over(store, job(status={"phase": "Succeeded", "targetReplicas": 2}))
    reconcile(controller, store, passes=2)
    assert not pods(store)
    # (its end time is when this controller took it on: a time to live counts from then, never from a status)
    assert store.record() == {f"{NS}.bert": {"uid": "bert-uid", "phase": "Succeeded", "ended": int(NOW)}}


def test_a_deleted_job_takes_its_record_with_it() -> None:
    store = RecordStore()
    for key, uid, phase in ((KEY, "bert-uid", "Succeeded"), (f"{NS}/gone", "gone-uid", "Failed"),
                            ("other-ns/kept", "kept-uid", "Failed")):
        store.objects[record_of(key)]["data"][finished.entry_key(key)] = json.dumps({"uid": uid, "phase": phase})
    controller = controller_over(store, job(status={"phase": "Succeeded"}))
    controller.dirty.add(KEY)
    controller.reconcile_dirty()
    kept = set(store.record())
    assert kept == {f"{NS}.bert", "other-ns.kept"}, "a job deleted meanwhile goes; another namespace's job stays"
    controller._apply(Event("elasticjobs", "DELETED", store.objects[ej.job_path(NS, "bert")]))
    controller.dirty.add("elsewhere/x")
    controller.reconcile_dirty()
    assert set(store.record()) == {"other-ns.kept"}


def test_an_unreadable_record_stops_the_controller_not_a_job() -> None:
    """Without the record, a job whose pods are gone cannot be told from one that ended: nothing is reconciled
    (no worker made again) until the record can be read, and the controller does not say it is ready."""
    store = RecordStore()
    store.refuse_record = True
    controller = controller_over(store, job(status={"phase": "Succeeded", "targetReplicas": 2}))
    controller.dirty.add(KEY)
    assert controller.reconcile_dirty() == 0
    assert not pods(store)
    assert KEY in controller.dirty, "tried again at the next pass"
    store.refuse_record = False
    assert controller.reconcile_dirty() == 1


def test_the_record_is_spread_over_its_configmaps_and_read_back_whole() -> None:
    """In one ConfigMap the record held some 8,000 jobs (1 MiB), and past that no job started: each entry now goes
    to the ConfigMap a hash of its key names, and a new controller reads all of them back. An entry found in a
    ConfigMap that does not hold its key (written by hand) is taken out, never believed."""
    store = RecordStore()
    keeper = finished.FinishedJobs(store, "kubecell-system")  # type: ignore[arg-type]
    keeper.load({})
    keys = [f"ns-{i}/job-{i}" for i in range(200)]
    for i, key in enumerate(keys):
        assert keeper.keep(key, f"uid-{i}", None, i % 3, 2, now=NOW)
    used = {path for path in RECORDS if store.objects[path].get("data")}
    assert len(used) == finished.SHARDS, "every ConfigMap of the record holds some"
    for key in keys:
        assert finished.entry_key(key) in store.objects[record_of(key)]["data"]
    misplaced = next(path for path in RECORDS if path != record_of("ns-x/stray"))
    store.objects[misplaced]["data"]["ns-x.stray"] = json.dumps({"uid": "stray-uid", "phase": "Failed"})
    again = finished.FinishedJobs(store, "kubecell-system")  # type: ignore[arg-type]
    jobs = {key: {"metadata": {"uid": f"uid-{i}"}} for i, key in enumerate(keys)}
    again.load({**jobs, "ns-x/stray": {"metadata": {"uid": "stray-uid"}}})
    assert again.entry("ns-7/job-7", "uid-7") == finished.Entry("uid-7", None, 1, 2)
    assert again.entry("ns-x/stray", "stray-uid") is None, "an entry in another key's ConfigMap is not believed"
    assert all(again.entry(key, f"uid-{i}") is not None for i, key in enumerate(keys))
    again.flush()
    assert "ns-x.stray" not in store.objects[misplaced]["data"]


def test_the_shipped_rules_name_every_configmap_of_the_record() -> None:
    rules = [doc for doc in yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text())
             if doc and doc.get("kind") == "Role" and doc["metadata"]["namespace"] == "kubecell-system"]
    named = {name for role in rules for rule in role["rules"] for name in rule.get("resourceNames", ())}
    assert {finished.configmap_name(shard) for shard in range(finished.SHARDS)} <= named
