"""The ElasticJob controller against what a tenant or a flaky cluster puts in its way: objects under the names
it uses that it did not make, a status edited by another writer. No API server: the controller's cache is fed
the events its watch would give, and its requests go to a small in-memory store that answers as the API server
does (409 for a name taken or a failed precondition, 404, 422 where the CRD's schema would refuse).

Each test names the attack, and what went wrong before its fix."""

from __future__ import annotations

import copy
import datetime
import itertools
from typing import Any

import pytest

from kubecell.elastic import workers as readers
from kubecell.elastic.controller import ControllerOptions, ElasticController
from kubecell.elastic.status import MAX_CONDITIONS
from kubecell.kube import elasticjobs as ej
from kubecell.kube.elasticjob_objects import owner_reference, rendezvous_pod, rendezvous_service, worker_pod
from kubecell.kube.rest import ApiError
from kubecell.kube.watch import Event

NS = "team-a"
NOW = 1_800_000_000.0


class Store:
    """An API server's answers, in memory: what the controller's ``Kube`` calls need and no more."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.deleted: list[str] = []
        self.versions = itertools.count(100)
        self.uids = itertools.count()
        self.now = NOW
        """The API server's clock (deletion timestamps)."""

    def _stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        obj.setdefault("metadata", {})["resourceVersion"] = str(next(self.versions))
        return obj

    def put(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        """An object made by someone else (a tenant, an older controller)."""
        obj = copy.deepcopy(obj)
        obj["metadata"].setdefault("uid", f"uid-{next(self.uids)}")
        self.objects[path] = self._stamp(obj)
        return obj

    def get(self, path: str, **query: Any) -> dict[str, Any]:
        if path not in self.objects:
            raise ApiError(404, "NotFound", f"{path} not found")
        return copy.deepcopy(self.objects[path])

    def create(self, path: str, body: dict[str, Any], **query: Any) -> dict[str, Any]:
        if path.endswith("/events"):
            self.events.append(copy.deepcopy(body))
            return body
        name = f"{path}/{body['metadata']['name']}"
        if name in self.objects:
            raise ApiError(409, "AlreadyExists", f"{name} already exists")
        return copy.deepcopy(self.put(name, body))

    def patch(self, path: str, body: dict[str, Any], **query: Any) -> dict[str, Any]:
        target, _, sub = path.rpartition("/")
        if sub not in ("status", "scale"):
            target = path
        if target not in self.objects:
            raise ApiError(404, "NotFound", f"{target} not found")
        obj = self.objects[target]
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != obj["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", "the object has been modified")
        if sub == "status":
            conditions = body["status"].get("conditions") or []
            if len(conditions) > MAX_CONDITIONS:  # the CRD's maxItems
                raise ApiError(422, "Invalid", f"status.conditions: Too many: {len(conditions)}: must have at most "
                                              f"{MAX_CONDITIONS} items")
            obj["status"] = {**(obj.get("status") or {}), **copy.deepcopy(body["status"])}
        elif sub == "scale":
            obj["spec"].update(body["spec"])
        else:
            for key, value in (body.get("metadata") or {}).get("annotations", {}).items():
                obj["metadata"].setdefault("annotations", {})[key] = value
        return copy.deepcopy(self._stamp(obj))

    def delete(self, path: str, body: dict[str, Any] | None = None, **query: Any) -> dict[str, Any]:
        if path not in self.objects:
            raise ApiError(404, "NotFound", f"{path} not found")
        uid = ((body or {}).get("preconditions") or {}).get("uid")
        if uid is not None and uid != self.objects[path]["metadata"]["uid"]:
            raise ApiError(409, "Conflict", "Precondition failed: UID in precondition")
        self.deleted.append(path)
        meta = self.objects[path]["metadata"]
        if meta.get("finalizers"):  # kept, Terminating, until whoever set them removes them
            grace = (body or {}).get("gracePeriodSeconds", 30)
            if meta.get("deletionGracePeriodSeconds") is None or grace < meta["deletionGracePeriodSeconds"]:
                meta["deletionGracePeriodSeconds"] = grace
                meta["deletionTimestamp"] = stamp(self.now)
            return copy.deepcopy(self._stamp(self.objects[path]))
        return self.objects.pop(path)

    def warnings(self) -> list[tuple[str, str]]:
        return [(e["reason"], e["message"]) for e in self.events if e["type"] == "Warning"]


def stamp(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def job(name: str = "bert", *, replicas: int = 2, most: int = 4, status: dict[str, Any] | None = None
        ) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": ej.API_VERSION, "kind": ej.KIND,
        "metadata": {"name": name, "namespace": NS, "uid": f"{name}-uid", "generation": 1,
                     "creationTimestamp": "2027-01-15T08:00:00Z"},
        "spec": {"minReplicas": 1, "maxReplicas": most, "replicas": replicas,
                 "template": {"spec": {"containers": [{"name": "trainer", "image": "pytorch/pytorch:2.5.1"}]}}}}
    if status is not None:
        body["status"] = status
    return body


def pod_path(name: str) -> str:
    return f"/api/v1/namespaces/{NS}/pods/{name}"


def service_path(job_name: str = "bert") -> str:
    return f"/api/v1/namespaces/{NS}/services/{ej.rendezvous_name(job_name)}"


def controller_over(store: Store, obj: dict[str, Any]) -> ElasticController:
    """A controller whose watch has listed ``obj`` (stored as the API server holds it) and the store's Pods."""
    stored = store.put(ej.job_path(NS, obj["metadata"]["name"]), obj)
    controller = ElasticController(store, ControllerOptions(namespace=NS), clock=lambda: NOW)  # type: ignore[arg-type]
    controller._apply(Event("elasticjobs", "SYNC", objects=(stored,)))
    pods = tuple(o for path, o in store.objects.items() if "/pods/" in path)
    controller._apply(Event("pods", "SYNC", objects=pods))
    return controller


def reconcile(controller: ElasticController, store: Store, name: str = "bert", passes: int = 1) -> None:
    """``passes`` reconciles, each on the job as the store holds it now (as the watch would show it)."""
    for _ in range(passes):
        stored = store.get(ej.job_path(NS, name))
        controller._apply(Event("elasticjobs", "MODIFIED", stored))
        controller.reconcile(f"{NS}/{name}")


# --- a finished job deletes only its own rendezvous Service ------------------------------------------------------


def test_a_finished_job_never_deletes_a_service_it_does_not_control() -> None:
    """A tenant who may create ElasticJobs but not delete Services names a job after another's Service
    (``web`` for ``web-rdzv``) and lets it fail: the controller, which may delete Services, deleted that
    Service by name when the job ended (its rendezvous host, which it did make, said the rendezvous was
    not gone yet)."""
    store = Store()
    theirs = store.put(service_path("web"), {"apiVersion": "v1", "kind": "Service",
                                             "metadata": {"name": "web-rdzv", "namespace": NS},
                                             "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}})
    store.put(pod_path("web-rdzv"), rendezvous_pod(ej.read_elastic_job(job("web"))))
    controller = controller_over(store, job("web", status={"phase": "Failed", "restarts": 3}))
    reconcile(controller, store, "web", passes=3)
    assert store.objects[service_path("web")]["metadata"]["uid"] == theirs["metadata"]["uid"]
    assert service_path("web") not in store.deleted
    assert pod_path("web-rdzv") not in store.objects  # its own host is removed


def test_a_finished_job_still_deletes_its_own_service() -> None:
    store = Store()
    spec = ej.read_elastic_job(store.put(ej.job_path(NS, "bert"), job()))
    store.put(service_path(), rendezvous_service(spec))
    controller = controller_over(store, job(status={"phase": "Succeeded"}))
    reconcile(controller, store)
    assert service_path() not in store.objects


# --- a status another writer filled ------------------------------------------------------------------------------


def foreign_conditions(count: int) -> list[dict[str, Any]]:
    return [{"type": f"example.com/Checked{i}", "status": "True", "reason": "Checked", "message": "",
             "lastTransitionTime": "2027-01-15T08:00:00Z"} for i in range(count)]


def test_a_status_full_of_other_writers_conditions_does_not_wedge_the_job() -> None:
    """Whoever may patch ``elasticjobs/status`` fills ``status.conditions`` with 16 conditions of their own
    (the CRD's maxItems): the controller wrote them back with its two, 18, which the API server refused (422)
    at every pass, and since the status is written before any action, the job was never acted on again (a
    job shrunk through /scale kept its GPUs)."""
    store = Store()
    controller = controller_over(store, job(replicas=1, status={"phase": "Pending",
                                                                 "conditions": foreign_conditions(16)}))
    reconcile(controller, store)
    written = store.objects[ej.job_path(NS, "bert")]["status"]
    assert len(written["conditions"]) <= MAX_CONDITIONS
    assert {c["type"] for c in written["conditions"]} >= {"Accepted", "Available"}
    assert pod_path(ej.worker_name("bert", 0)) in store.objects


# --- names taken by objects the job does not control -------------------------------------------------------------


def test_a_worker_name_held_by_a_pod_the_job_does_not_control_is_told_once() -> None:
    """A Pod named ``bert-worker-0`` that the job does not control (made by hand, left by an earlier job of the
    same name deleted with ``--cascade=orphan``): every create of worker 0 was answered 409 and taken for a
    worker of its own leaving, for ever, with no Event; the job sat Pending 'waiting for the scheduler'."""
    store = Store()
    spec = ej.read_elastic_job(job())
    orphan = worker_pod(spec, 0)
    orphan["metadata"]["ownerReferences"] = []
    store.put(pod_path("bert-worker-0"), orphan)
    controller = controller_over(store, job())
    reconcile(controller, store, passes=3)
    told = [message for reason, message in store.warnings() if "bert-worker-0" in message]
    assert len(told) == 1, store.warnings()
    assert "does not control" in told[0]
    assert pod_path("bert-worker-0") not in store.deleted


@pytest.mark.parametrize("label", [ej.LABEL_JOB, ej.LABEL_ROLE, ej.LABEL_INDEX])
def test_a_worker_of_its_own_relabelled_out_of_the_job_is_told_once(label: str) -> None:
    """The job's own worker 0 with one of the labels the controller selects by removed: the watch no longer
    shows it (or not as worker 0), so worker 0 is made again, and the 409 was taken for a worker leaving, for
    ever, in silence."""
    store = Store()
    spec = ej.read_elastic_job(job())
    relabelled = worker_pod(spec, 0)
    del relabelled["metadata"]["labels"][label]
    store.put(pod_path("bert-worker-0"), relabelled)
    controller = controller_over(store, job())
    reconcile(controller, store, passes=3)
    told = [message for _, message in store.warnings() if "bert-worker-0" in message]
    assert len(told) == 1, store.warnings()
    assert pod_path("bert-worker-0") not in store.deleted


def test_a_worker_of_its_own_still_leaving_is_not_told() -> None:
    """The ordinary 409: the name is held by the job's own worker, which the cache does not show yet."""
    store = Store()
    spec = ej.read_elastic_job(job())
    store.put(pod_path("bert-worker-0"), worker_pod(spec, 0))
    store.objects[pod_path("bert-worker-0")]["metadata"]["ownerReferences"] = [owner_reference(spec)]
    controller = controller_over(store, job())
    controller.pods, controller.pods_of = {}, {}  # the watch lags: the cache has not seen the worker
    reconcile(controller, store)
    assert not [m for _, m in store.warnings() if "bert-worker-0" in m and "does not control" in m]


def test_a_rendezvous_host_name_held_by_a_pod_the_job_does_not_control_is_told_once() -> None:
    store = Store()
    store.put(pod_path("bert-rdzv"), {"apiVersion": "v1", "kind": "Pod",
                                      "metadata": {"name": "bert-rdzv", "namespace": NS, "labels": {"app": "x"}},
                                      "spec": {"containers": [{"name": "x", "image": "x"}]}})
    controller = controller_over(store, job())
    reconcile(controller, store, passes=3)
    told = [message for _, message in store.warnings() if "bert-rdzv" in message]
    assert len(told) == 1, store.warnings()
    assert "does not control" in told[0]


def test_a_rendezvous_service_the_job_does_not_control_is_told_and_not_trusted() -> None:
    """A Service ``bert-rdzv`` made before the job, selecting other pods: the controller saw that the name
    existed and took it for the job's rendezvous, so the workers met wherever it pointed, and nothing said so."""
    store = Store()
    store.put(service_path(), {"apiVersion": "v1", "kind": "Service",
                               "metadata": {"name": "bert-rdzv", "namespace": NS},
                               "spec": {"selector": {"app": "elsewhere"}, "ports": [{"port": 29400}]}})
    controller = controller_over(store, job())
    reconcile(controller, store, passes=3)
    told = [message for _, message in store.warnings() if "Service" in message and "bert-rdzv" in message]
    assert len(told) == 1, store.warnings()
    assert "does not control" in told[0]
    assert service_path() not in store.deleted
    assert controller.writes.services[f"{NS}/bert"][0] is False


def test_what_an_orphaned_job_left_is_told_once_each_not_at_every_pass() -> None:
    """An earlier ``bert`` deleted with ``--cascade=orphan`` left its Service, host and workers, none controlled
    any more: each is told once. The controller remembered one message per job, so two refusals in one pass
    (the Service, then the host) undid each other's memory and both were told again at every resync."""
    store = Store()
    spec = ej.read_elastic_job(job())
    for index in (0, 1):
        store.put(pod_path(ej.worker_name("bert", index)), {**worker_pod(spec, index), "metadata": {
            **worker_pod(spec, index)["metadata"], "ownerReferences": []}})
    store.put(service_path(), {**rendezvous_service(spec), "metadata": {
        **rendezvous_service(spec)["metadata"], "ownerReferences": []}})
    store.put(pod_path("bert-rdzv"), {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "bert-rdzv", "namespace": NS, "labels": {ej.LABEL_JOB: "bert", ej.LABEL_ROLE: ej.ROLE_RENDEZVOUS}},
        "spec": {"containers": [{"name": "c10d-store", "image": "pytorch/pytorch:2.5.1"}]}})
    controller = controller_over(store, job())
    reconcile(controller, store, passes=4)
    told = sorted(message.split(" not created")[0] for reason, message in store.warnings() if reason == "FailedCreate")
    assert told == ["rendezvous Service", "rendezvous host", "worker 0"], store.warnings()
    assert not store.deleted


def test_its_own_rendezvous_service_pointed_elsewhere_is_made_again() -> None:
    """Someone who may update Services edits the job's own ``bert-rdzv`` to select other pods: the controller
    only ever asked whether the name existed, so the workers met wherever it pointed."""
    store = Store()
    spec = ej.read_elastic_job(job())
    edited = rendezvous_service(spec)
    edited["spec"]["selector"] = {"app": "elsewhere"}
    before = store.put(service_path(), edited)
    controller = controller_over(store, job())
    reconcile(controller, store, passes=2)
    now = store.objects[service_path()]
    assert now["metadata"]["uid"] != before["metadata"]["uid"]
    assert now["spec"]["selector"] == {ej.LABEL_JOB: "bert", ej.LABEL_ROLE: ej.ROLE_RENDEZVOUS}
    assert [m for _, m in store.warnings() if "bert-rdzv" in m and "edited" in m]


@pytest.mark.parametrize("label", [ej.LABEL_JOB, ej.LABEL_ROLE])
def test_its_own_rendezvous_host_relabelled_out_of_its_role_is_told(label: str) -> None:
    """The job's host Pod with a label the controller selects it by removed: not the host any more (the
    Service no longer selects it), and its name blocks a new one; every create was answered 409 and taken for
    the host, in silence."""
    store = Store()
    spec = ej.read_elastic_job(job())
    store.put(service_path(), rendezvous_service(spec))
    host = store.put(pod_path("bert-rdzv"), rendezvous_pod(spec))
    del host["metadata"]["labels"][label]
    store.objects[pod_path("bert-rdzv")] = host
    controller = controller_over(store, job())
    reconcile(controller, store, passes=3)
    told = [m for _, m in store.warnings() if "bert-rdzv" in m]
    assert len(told) == 1, store.warnings()


# --- a pod that a delete cannot end ---------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 12])
def test_pods_held_by_finalizers_are_force_deleted_once_and_told_once(count: int) -> None:
    """Workers stuck Terminating whose finalizer nobody removes (a tenant's, or a controller's gone away): the
    controller's force delete (grace 0) cannot end them, and it deleted each again, with another PodForceDeleted
    Warning, every time its expectation expired (each minute), for ever."""
    store = Store()
    spec = ej.read_elastic_job(job(replicas=count, most=16))
    for index in range(count):
        stuck = worker_pod(spec, index)
        stuck["metadata"].update({"finalizers": ["example.com/hold"], "deletionGracePeriodSeconds": 30,
                                  "deletionTimestamp": stamp(NOW - 3600)})
        stuck["spec"]["nodeName"] = "lost-node"
        store.put(pod_path(ej.worker_name("bert", index)), stuck)
    clock = [NOW]
    controller = controller_over(store, job(replicas=count, most=16))
    controller.clock = lambda: clock[0]
    for _ in range(6):  # an hour: every pass sees the pods as the watch would show them after the last one
        for index in range(count):
            pod = store.get(pod_path(ej.worker_name("bert", index)))
            controller._apply(Event("pods", "MODIFIED", readers.trimmed(pod)))
        reconcile(controller, store)
        clock[0] = store.now = clock[0] + 600
    assert len(store.deleted) == count  # once each
    assert len([m for r, m in store.warnings() if r == "PodForceDeleted"]) == count
    held = [m for _, m in store.warnings() if "example.com/hold" in m]
    assert len(held) == 1, store.warnings()
    assert "bert-worker-0" in held[0]


# --- a job being deleted -------------------------------------------------------------------------------------------


def test_a_job_being_deleted_in_the_foreground_makes_nothing_again() -> None:
    """``kubectl delete --cascade=foreground``: the job stays, with a deletionTimestamp, until the garbage
    collector has deleted its Pods; the controller took each Pod the collector deleted for a lost worker and
    made it again (a WorkerLost Warning, a new Pod for the collector to delete, and the scheduler placing it),
    racing the deletion it was keeping from finishing."""
    store = Store()
    spec = ej.read_elastic_job(job())
    store.put(pod_path("bert-worker-1"), worker_pod(spec, 1))  # worker 0 already deleted by the collector
    store.put(service_path(), rendezvous_service(spec))
    deleting = job(status={"phase": "Running", "targetReplicas": 2})
    deleting["metadata"].update({"deletionTimestamp": stamp(NOW - 5), "finalizers": ["foregroundDeletion"]})
    controller = controller_over(store, deleting)
    reconcile(controller, store, passes=2)
    assert pod_path("bert-worker-0") not in store.objects
    assert pod_path("bert-rdzv") not in store.objects
    assert not store.warnings()


# --- a job replaced under its name while the watch was down ---------------------------------------------------------


def test_a_job_replaced_under_its_name_while_unwatched_starts_from_nothing() -> None:
    """``bert`` deleted and made again while the controller's watch was down (a relist after 410 Gone): what it
    kept for the old job, by name, was taken for the new one's. Its rendezvous Service, believed to exist, was
    not made for a minute, and the old job's expectations and told Warnings stood for the new one."""
    store = Store()
    old = job()
    old["metadata"]["uid"] = "old-uid"
    controller = controller_over(store, old)
    reconcile(controller, store)
    assert service_path() in store.objects
    # deleted (its Service and workers with it) and made again under the name, unseen by the watch
    for path in [path for path in store.objects if "/pods/" in path or "/services/" in path]:
        del store.objects[path]
    new = store.put(ej.job_path(NS, "bert"), job())
    controller._apply(Event("elasticjobs", "SYNC", objects=(new,)))
    controller._apply(Event("pods", "SYNC", objects=()))
    controller.reconcile(f"{NS}/bert")
    assert service_path() in store.objects
    assert store.objects[service_path()]["metadata"]["ownerReferences"][0]["uid"] == "bert-uid"
    assert store.objects[pod_path("bert-worker-0")]["metadata"]["ownerReferences"][0]["uid"] == "bert-uid"


# --- a namespace whose quota refuses the rendezvous -----------------------------------------------------------------


class QuotaStore(Store):
    """A namespace whose ResourceQuota is spent: every Pod create is refused (403), as the API server refuses it."""

    def create(self, path: str, body: dict[str, Any], **query: Any) -> dict[str, Any]:
        if path.endswith("/pods"):
            raise ApiError(403, "Forbidden", f'pods "{body["metadata"]["name"]}" is forbidden: exceeded quota: '
                                             "pods, requested: pods=1, used: pods=4, limited: pods=4")
        return super().create(path, body, **query)


def test_a_rendezvous_host_the_quota_refuses_is_told_once_and_logged_once(caplog: pytest.LogCaptureFixture
                                                                          ) -> None:
    """The quota refuses the rendezvous host: the controller logged the refusal with a traceback, as a bug, at
    every resync (every 5 s, for as long as the quota stayed spent). Now: one Event, one line in the log, the
    reconciles counted as ``refused``, and no worker made without a rendezvous to join."""
    store = QuotaStore()
    controller = controller_over(store, job())
    with caplog.at_level("DEBUG", logger="kubecell.elastic"):
        for _ in range(4):
            controller.dirty.add(f"{NS}/bert")
            controller.reconcile_dirty()
    assert [reason for reason, _ in store.warnings()] == ["FailedCreate"]
    assert "exceeded quota" in store.warnings()[0][1]
    assert controller.metrics.reconciles.labels("refused")._value.get() == 4
    assert controller.metrics.reconciles.labels("error")._value.get() == 0
    warned = [r for r in caplog.records if r.levelname == "WARNING" and "bert" in r.getMessage()]
    assert len(warned) == 1
    assert "rendezvous host not created" in warned[0].getMessage()
    assert not [r for r in caplog.records if r.exc_info], "a refusal is not a bug: no traceback"
    assert not [path for path in store.objects if "-worker-" in path]


def test_an_api_server_that_is_unavailable_is_still_an_error() -> None:
    """A 503 on the rendezvous host is not a refusal to remember: it is tried again and counted as an error."""

    class Flaky(Store):
        def create(self, path: str, body: dict[str, Any], **query: Any) -> dict[str, Any]:
            if path.endswith("/pods"):
                raise ApiError(503, "ServiceUnavailable", "etcd leader changed")
            return super().create(path, body, **query)

    store = Flaky()
    controller = controller_over(store, job())
    controller.reconcile_dirty()
    assert controller.metrics.reconciles.labels("error")._value.get() == 1
    assert not store.warnings()


# --- a worker whose init container crash-loops ----------------------------------------------------------------------


def bound_and_waiting(status: dict[str, Any]) -> Store:
    """A store holding bert's two workers, bound to a node, each with ``status`` as its kubelet wrote it."""
    store = Store()
    spec = ej.read_elastic_job(job())
    for index in range(2):
        worker = worker_pod(spec, index)
        worker["metadata"]["ownerReferences"] = [owner_reference(spec)]
        worker["spec"]["nodeName"] = "n1"
        worker["status"] = copy.deepcopy(status)
        store.put(pod_path(ej.worker_name("bert", index)), worker)
    return store


def test_a_worker_whose_init_container_crash_loops_restarts_the_job_and_is_told() -> None:
    """``restartPolicy: OnFailure`` and an init container that fails at every start (a dataset it cannot fetch):
    the kubelet restarts it for ever and the Pod stays Pending on its node. The controller read the worker as
    Scheduled, so the job sat Pending, "waiting for the scheduler", holding the GPUs its workers were bound to,
    with no CrashLoop condition, no Event and no restart counted."""
    store = bound_and_waiting({"phase": "Pending",
                               "initContainerStatuses": [{"name": "fetch", "restartCount": 7,
                                                          "state": {"waiting": {"reason": "CrashLoopBackOff"}}}],
                               "containerStatuses": [{"name": "trainer", "restartCount": 0,
                                                      "state": {"waiting": {"reason": "PodInitializing"}}}]})
    controller = controller_over(store, job(status={"phase": "Pending", "targetReplicas": 2}))
    reconcile(controller, store)
    status = store.objects[ej.job_path(NS, "bert")]["status"]
    assert (status["phase"], status["restarts"]) == ("Restarting", 1)
    available = next(c for c in status["conditions"] if c["type"] == "Available")
    assert (available["status"], available["reason"]) == ("False", "CrashLoop")
    assert [reason for reason, _ in store.warnings()] == ["CrashLoop"]
    assert {pod_path("bert-worker-0"), pod_path("bert-worker-1")} <= set(store.deleted)


# --- a worker the kubelet cannot start -------------------------------------------------------------------------------


@pytest.mark.parametrize("reason", ["ImagePullBackOff", "CreateContainerConfigError"])
def test_workers_the_kubelet_cannot_start_are_named_once_not_restarted(reason: str) -> None:
    """An image that cannot be pulled (a typo, a missing pull secret) or a Secret the container names that is not
    there: the workers stay bound and Pending, holding their GPUs, and no restart would start them. The job said
    only "waiting for the scheduler", and nothing named the pods or the reason."""
    store = bound_and_waiting({"phase": "Pending", "containerStatuses": [
        {"name": "trainer", "restartCount": 0, "state": {"waiting": {"reason": reason}}}]})
    controller = controller_over(store, job(status={"phase": "Pending", "targetReplicas": 2}))
    reconcile(controller, store, passes=3)
    status = store.objects[ej.job_path(NS, "bert")]["status"]
    assert (status["phase"], status.get("restarts", 0)) == ("Pending", 0), "waits: a restart would not help"
    available = next(c for c in status["conditions"] if c["type"] == "Available")
    assert f"bert-worker-0 ({reason}), bert-worker-1 ({reason})" in available["message"]
    assert [why for why, _ in store.warnings()] == ["WorkerCannotStart"], "told once, not at every pass"
    assert not store.deleted, "no worker deleted"


def test_a_worker_still_pulling_its_image_is_not_told() -> None:
    waiting = {"state": {"waiting": {"reason": "ContainerCreating"}}}
    pod: dict[str, Any] = {"metadata": {"name": "bert-worker-0"}, "spec": {"nodeName": "n1"},
                           "status": {"phase": "Pending", "containerStatuses": [waiting]}}
    assert readers.cannot_start(pod) is None
    pod["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] = "ErrImagePull"
    assert readers.cannot_start(pod) == "ErrImagePull"
    assert readers.cannot_start(readers.trimmed(pod)) == "ErrImagePull", "what the watch keeps is enough"
    pod["spec"]["nodeName"] = None
    assert readers.cannot_start(pod) is None, "not bound: the scheduler's to place"
