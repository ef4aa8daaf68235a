"""The ElasticJob sizer against a hostile tenant and a flaky cluster: what a tenant writes (its job's status, its
workers' step reports, deleting and making again its job) and what a failing API server answers must not give a
job more than its goodput warrants, keep GPUs from other jobs, nor cost the scheduler's loop more than a bounded
number of calls. Writes are recorded, not sent (``elastic_sizer_support``)."""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest

from kubecell.kube import elasticjobs
from kubecell.kube.elasticjobs import ElasticRef
from kubecell.kube.kept_holds import decode, entry_key
from kubecell.kube.names import ANNOTATION_STEP_REPORT
from kubecell.kube.rest import ApiError
from kubecell.kube.step_reports import build_step_report
from kubecell.scheduler.elastic import ElasticSizer
from tests.core.support import engine, make_nodes
from tests.scheduler.elastic_sizer_support import RecordingSizer, report_from_both, reporting_job, worker
from tests.scheduler.test_elastic_holds import LLAMA, SizerByJob, gpt_worker
from tests.scheduler.test_shrink_pods import Loop

BERT = ElasticRef("ns", "bert", "job-uid")


class FailingGets(RecordingSizer):
    """Every GET of the ElasticJob fails (an API server that answers 503) while ``failing``; GETs counted."""

    def __init__(self) -> None:
        super().__init__()
        self.failing = True
        self.gets = 0

    def _get(self, ref: Any) -> dict[str, Any]:
        self.gets += 1
        if self.failing:
            raise ApiError(503, "Service Unavailable", "etcdserver: leader changed", method="GET", path="/apis")
        return super()._get(ref)

    def _read_model(self, ref: Any) -> Any:
        self._get(ref)
        return super()._read_model(ref)


def test_a_failing_api_is_asked_once_per_job_and_pass_not_once_per_worker() -> None:
    """The job's model is made at its first report, from two GETs (its batch range, its kept model). While the
    API fails, every worker's report tried again: a job of thousands of workers sent thousands of GETs per pass
    to an API server that was already failing, on the scheduling thread."""
    sizer, loop = FailingGets(), reporting_job()
    start = time.time()
    report_from_both(loop, start, replicas=2, local=32, step=0.4, var=50.0)
    sizer.grow(loop.state, loop.mirror, start)
    assert sizer.gets == 2, "one attempt for the job's model, not one per worker's report, and one for its " \
        "conditions (is a False one there to be replaced?)"
    sizer.grow(loop.state, loop.mirror, start + 1)
    assert sizer.gets == 3, "the model's again at the next pass; its conditions wait a minute after a refusal"
    sizer.failing = False
    sizer.grow(loop.state, loop.mirror, start + 2)
    (sized,) = sizer.jobs.values()
    assert sized.model is not None, "once the API answers, the reports that waited are read"
    assert set(sized.consumed) == {"uid-0", "uid-1"}, "every worker's, none lost"


class CountingExists(SizerByJob):
    def __init__(self) -> None:
        super().__init__()
        self.looked_up: list[str] = []

    def _exists(self, ref: Any) -> bool | None:
        self.looked_up.append(ref.name)
        return super()._exists(ref)


def llama_worker_leaving(loop: Loop) -> None:
    """Llama's old worker (one of 4 GPUs), bound and now ending: the move evicted it, with a day's grace."""
    body = copy.deepcopy(gpt_worker(0))
    meta = body["metadata"]
    meta["name"], meta["uid"] = "llama-worker-0", "llama-0"
    meta["annotations"]["kubecell.io/group"] = "llama"
    meta["ownerReferences"] = [{**meta["ownerReferences"][0], "name": "llama", "uid": LLAMA.uid}]
    loop.add(body)
    loop.cycle(1)
    leaving = copy.deepcopy(loop.mirror.pods["llama-0"])
    leaving["metadata"].update(deletionTimestamp="2026-12-01T00:00:00Z",
                               deletionGracePeriodSeconds=elasticjobs.MAX_GRACE_SECONDS)
    loop.add(leaving)
    (name,) = [name for name, tracked in loop.state.tracked.items() if tracked.elastic == LLAMA]
    loop.state.tracked[name].moving = True


def test_a_job_deleted_during_its_move_holds_nothing_for_the_day_its_template_states() -> None:
    """A move is held for its workers' grace period (the job's template says how long, up to a day) and the
    pods'. A tenant whose job was moved and then deleted kept the GPUs the move was given from every other
    job's growth on that model, in every VC, for that day: nothing of the job ever ran there to end the hold."""
    now = 1_796_090_400.0
    eng = engine(make_nodes(3), {"a": {"gpus": 24}}, resize_min_interval_seconds=0)
    loop, sizer = Loop(eng), CountingExists()
    loop.add(worker(0, vc="a", size=1), gpt_worker(0))  # one worker of 4 GPUs each
    loop.cycle(1)
    llama_worker_leaving(loop)  # 12 of 24 GPUs idle
    sizer.holds_restored = True  # a sizer that has run a while (no restart: nothing kept to take on)
    sizer.holds.hold(LLAMA, "move", "V100M32", target=3, runs=0, member_gpus=4,
                     until=now + elasticjobs.MAX_GRACE_SECONDS + sizer.pending_grace_seconds, now=now)
    sizer.grow(loop.state, loop.mirror, now)
    assert sizer.targets == {}, "llama's move was given the 12 idle GPUs"
    sizer.grow(loop.state, loop.mirror, now + sizer.pending_grace_seconds + 1)
    assert sizer.targets == {}, "llama still exists: its workers end with their grace period"
    assert sizer.looked_up == ["llama"], "looked up once the hold lasted the pods' grace"
    sizer.grow(loop.state, loop.mirror, now + sizer.pending_grace_seconds + 2)
    assert sizer.looked_up == ["llama"], "and not again at every pass"
    sizer.deleted.add("llama")
    later = now + 2 * sizer.pending_grace_seconds + 3
    sizer.grow(loop.state, loop.mirror, later)
    assert LLAMA not in sizer.holds.held, "deleted: what it was given is let go"
    assert entry_key(LLAMA) not in sizer.store.data, "and taken out of the holds' ConfigMap"
    assert sum(target - 1 for target in sizer.targets.values()) == 3, "the 12 idle GPUs are offered again"
    assert sizer.looked_up == ["llama", "llama"]
    sizer.grow(loop.state, loop.mirror, later + 1000)
    assert sizer.looked_up == ["llama", "llama"], "no hold, nothing looked up"


def test_a_move_whose_replacements_are_never_made_holds_for_the_pods_grace_once_its_workers_have_ended() -> None:
    """The move's old workers have ended and its replacements are not made (a quota refuses them): the GPUs
    the move was given stayed held from every other job's growth for the rest of the workers' grace period
    the job's template states (up to a day), though nothing of the job was left to end."""
    now = 1_796_090_400.0
    eng = engine(make_nodes(2), {"a": {"gpus": 16}}, resize_min_interval_seconds=0)
    loop, sizer = Loop(eng), SizerByJob()
    loop.add(worker(0, vc="a", size=1), gpt_worker(0))  # 8 of 16 GPUs idle; llama has no pod left
    loop.cycle(1)
    sizer.holds_restored = True
    sizer.holds.hold(LLAMA, "move", "V100M32", target=2, runs=0, member_gpus=4,
                     until=now + elasticjobs.MAX_GRACE_SECONDS + sizer.pending_grace_seconds, now=now)
    sizer.grow(loop.state, loop.mirror, now)
    assert sizer.targets == {}, "its replacements have the pods' grace to form its gang"
    kept = decode(entry_key(LLAMA), sizer.store.data[entry_key(LLAMA)])
    assert kept is not None
    assert kept.until == now + sizer.pending_grace_seconds, "kept shortened: a restarted scheduler holds no longer"
    sizer.grow(loop.state, loop.mirror, now + sizer.pending_grace_seconds - 1)
    assert sizer.targets == {}
    sizer.grow(loop.state, loop.mirror, now + sizer.pending_grace_seconds + 1)
    assert LLAMA not in sizer.holds.held
    assert sum(target - 1 for target in sizer.targets.values()) == 2, "the 8 idle GPUs are offered again"


def test_a_move_whose_workers_are_still_ending_keeps_its_hold() -> None:
    now = 1_796_090_400.0
    eng = engine(make_nodes(3), {"a": {"gpus": 24}}, resize_min_interval_seconds=0)
    loop, sizer = Loop(eng), SizerByJob()
    loop.add(worker(0, vc="a", size=1), gpt_worker(0))
    loop.cycle(1)
    llama_worker_leaving(loop)
    sizer.holds_restored = True
    until = now + elasticjobs.MAX_GRACE_SECONDS + sizer.pending_grace_seconds
    sizer.holds.hold(LLAMA, "move", "V100M32", target=3, runs=0, member_gpus=4, until=until, now=now)
    for later in (now, now + 3600, now + 7200):
        sizer.grow(loop.state, loop.mirror, later)
        assert sizer.targets == {}, "its old worker ends with its grace period: the move is still on its way"
    assert sizer.holds.held[LLAMA].until == until


def test_a_kept_model_of_a_world_the_job_can_never_form_is_dropped_as_such_a_report_is() -> None:
    """A step report of more replicas than the job's workers can run is refused (believed, it would lift the
    model's exploration limit, ``replica_limit``). Whoever may write the job's status wrote the same measurement
    into ``status.goodputModel``, which a restarted scheduler took up with no such check: the way around it."""
    sizer, loop = RecordingSizer(), reporting_job()
    shapes = [[1, 2, 32, 0.4, 0.05], [1, 4096, 16, 0.3, 0.03]]  # bert runs at most 4 workers of one process
    sizer.model_kept = {"version": 1, "batchSize": {"min": 64, "max": 1024}, "noise": None,
                        "types": [{"gpuType": "V100M32", "shapes": shapes}]}
    start = time.time()
    report_from_both(loop, start, replicas=2, local=32, step=0.4, var=50.0)
    sizer.grow(loop.state, loop.mirror, start)
    (sized,) = sizer.jobs.values()
    assert sized.model is not None
    assert {row[1] for row in sized.model.measurements()["V100M32"]} == {2}, "only what its pods report"
    assert sized.model.replica_limit("V100M32") == 16, "8 times the 2 it ran at, not 8 times 4096"
    (dropped,) = [message for reason, message in sizer.events if reason == "GoodputModelDropped"]
    assert "can never form" in dropped


def report_from(loop: Loop, uid: str, at: float, *, replicas: int, local: int, step: float = 0.4) -> None:
    text = build_step_report(time=at, replicas=replicas, nodes=1, local_batch=local, accumulation_steps=1,
                             step_seconds=step, sync_seconds=step / 8, grad_sqr=1.0, grad_var=50.0, steps=10)
    body = copy.deepcopy(loop.mirror.pods[uid])
    body["metadata"]["annotations"][ANNOTATION_STEP_REPORT] = text
    loop.mirror.pods[uid] = body


@pytest.mark.parametrize(("replicas", "local"), [(4096, 32), (2, 1 << 31)], ids=["world", "batch"])
def test_a_refused_first_report_does_not_set_the_batch_of_a_job_that_states_none(replicas: int, local: int) -> None:
    """A job that states no ``batchSize`` is priced at the global batch of its first report. A report of a world
    the job can never form was refused, but only after its batch had become the job's, for the job's life in
    this scheduler (and in its status): one forged report priced every placement at a batch the job never runs,
    131072 here, where its workers run 64. Nor is a batch above what any ElasticJob may state taken."""
    sizer, loop = RecordingSizer(batchSize=None), reporting_job()
    start = time.time()
    report_from(loop, "uid-0", start, replicas=replicas, local=local)
    sizer.grow(loop.state, loop.mirror, start)
    (sized,) = sizer.jobs.values()
    assert sized.model is None, "a refused report makes no model"
    assert [reason for reason, _ in sizer.events] == ["UntrustedReport"]
    report_from(loop, "uid-1", start + 1, replicas=2, local=32)
    sizer.grow(loop.state, loop.mirror, start + 1)
    assert sized.model is not None
    assert (sized.model.initial_bsz, sized.model.max_bsz) == (64, 64), "the batch its workers run at"


class ApiOfOneJob:
    """The API server as the testbed shows it for an ElasticJob's ``/scale`` and ``/status`` (both ignore a
    ``metadata.uid`` in the patch, both refuse a stale ``metadata.resourceVersion`` with 409), holding one job
    that ``between`` may change after a GET, before the PATCH that follows it."""

    def __init__(self) -> None:
        self.job: dict[str, Any] = {
            "apiVersion": "kubecell.io/v1alpha1", "kind": "ElasticJob",
            "metadata": {"name": "bert", "namespace": "ns", "uid": "job-uid", "resourceVersion": "1"},
            "spec": {"minReplicas": 1, "maxReplicas": 4, "replicas": 2,
                     "template": {"spec": {"containers": [{"name": "t", "image": "i"}]}}}}
        self.between: list[Any] = []
        """Changes made after each GET, in turn (a job deleted and made again, its controller's write)."""
        self.gets = self.patches = 0

    def get(self, path: str) -> dict[str, Any]:
        self.gets += 1
        seen = copy.deepcopy(self.job)
        if self.between:
            self.between.pop(0)(self.job)
        return seen

    def patch(self, path: str, body: Any) -> dict[str, Any]:
        self.patches += 1
        version = (body.get("metadata") or {}).get("resourceVersion")
        if version is not None and version != self.job["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", "the object has been modified", method="PATCH", path=path)
        if path.endswith("/scale"):
            self.job["spec"]["replicas"] = body["spec"]["replicas"]
        else:
            self.job.setdefault("status", {}).update(body["status"])
        self.job["metadata"]["resourceVersion"] = str(int(self.job["metadata"]["resourceVersion"]) + 1)
        return copy.deepcopy(self.job)

    def create(self, path: str, body: Any) -> dict[str, Any]:
        return dict(body)  # the sizer's Events


def made_again(job: dict[str, Any]) -> None:
    """Deleted and made again under its name by its tenant: another uid, another resourceVersion."""
    job["metadata"].update(uid="another-uid", resourceVersion="40")
    job.pop("status", None)


def status_written(job: dict[str, Any]) -> None:
    """Its controller wrote the status: the same job, a new resourceVersion."""
    job["metadata"]["resourceVersion"] = str(int(job["metadata"]["resourceVersion"]) + 1)


def real_sizer(api: ApiOfOneJob) -> ElasticSizer:
    sizer = ElasticSizer(api, "kubecell")  # type: ignore[arg-type]
    sizer._sized(BERT)
    return sizer


def test_a_job_made_again_between_the_get_and_the_patch_is_not_written() -> None:
    """Every write checks with a GET that the job of that name has the uid its pods name, then PATCHes. The uid
    the status patch carried was meant to refuse it where the job was made again meanwhile, but a custom
    resource's /status and /scale ignore it: the old job's target, GPU model and goodput model were written on
    the new one. The patch now carries the resourceVersion the GET read."""
    api = ApiOfOneJob()
    sizer = real_sizer(api)
    api.between = [made_again]
    assert not sizer._write(sizer.jobs[BERT], 4, "grown")
    assert api.job["spec"]["replicas"] == 2, "the new job's target is its own"
    assert api.gets == 2, "the conflict is read again once: another uid, nothing written"
    api = ApiOfOneJob()
    sizer = real_sizer(api)
    api.between = [made_again]
    assert not sizer._write_pin(BERT, "A100")
    assert not sizer._write_model(sizer.jobs[BERT], {"version": 1})
    assert "status" not in api.job, "nor its status"


def test_a_write_that_meets_its_controllers_write_is_read_again_once() -> None:
    """The controller writes the job's status too: a conflict of the same job is read again and written."""
    api = ApiOfOneJob()
    sizer = real_sizer(api)
    api.between = [status_written]
    assert sizer._write(sizer.jobs[BERT], 4, "grown")
    assert api.job["spec"]["replicas"] == 4
    api.between = [status_written]
    assert sizer._write_pin(BERT, "A100")
    assert api.job["status"] == {"gpuModel": "A100"}
    api.between = [status_written, status_written]
    assert not sizer._write(sizer.jobs[BERT], 1, "given back"), "a second conflict waits for the next pass"
    assert api.job["spec"]["replicas"] == 4


def test_the_end_of_a_deleted_jobs_hold_does_not_take_out_the_hold_of_the_job_made_again_under_its_name() -> None:
    """The holds' ConfigMap keeps one hold per job name (``<namespace>.<name>``). A job deleted while held and
    made again under its name, and held in turn: the end of the old job's hold took the new one's out, so a
    scheduler restarted then would offer its GPUs to another job."""
    sizer = RecordingSizer()
    again = ElasticRef("ns", "bert", "another-uid")
    sizer.holds.hold(BERT, "move", "A100", target=2, runs=0, member_gpus=4, until=100.0, now=0.0)
    sizer.holds.hold(again, "start", "A100", target=3, runs=0, member_gpus=4, until=100.0, now=1.0)
    sizer.holds.release(BERT)
    kept = decode(entry_key(again), sizer.store.data.get(entry_key(again)))
    assert kept is not None, "the new job's hold is still kept"
    assert (kept.ref, kept.replicas) == (again, 3)
    sizer.holds.release(again)
    assert entry_key(again) not in sizer.store.data, "and taken out when it ends"
