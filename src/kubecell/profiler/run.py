"""One profiling pass: the jobs the API server shows, their series from Prometheus, saved in the history.

The profiler runs again and again (``kubecell profile collect --every``): a running job is saved each time with
what it used so far, and once more when it has finished; a finished job already saved with the same end is not
read again, nor made again from fewer pods once the garbage collector deletes some of them. Pods disappear from
the API some time after they finish, so a job is only as complete as the passes that saw it: run the profiler
more often than finished pods are deleted. While a job runs, a pass reads its last day
(``RUNNING_WINDOW_SECONDS``), not its whole life again; the pass after it ends reads its whole life once. A job
none of whose pods started costs no query. A job whose series are missing
or bad is saved with its problems (one message per pod and metric); a query of the job that Prometheus refuses,
answers only in part, or answers with a series or sample that is no number costs that job alone (``Pass.refused``,
with the reason); Prometheus or the database failing stops the pass with that error, since no job could be
profiled.

A share job's record also keeps how its pods used their GPUs alone and beside each partner family
(:mod:`kubecell.profiler.pairs`); partners are named from the pods this pass lists, so a partner already
deleted is not counted, and a pod is taken to be on a GPU only where this pass's pods put it
(:func:`pod_places`: its allocation record, else its node), not where its series' labels say. The jobs of a pass
share one reader of whole GPUs
(:class:`~kubecell.profiler.pairs.GpuSeries`), so two jobs on one GPU read its series once.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from kubecell.core.errors import KubecellError
from kubecell.core.model import MILLI_PER_GPU
from kubecell.kube import pods as pod_fields
from kubecell.kube.records import AllocationRecord, RecordError
from kubecell.profiler.collect import Job, collect
from kubecell.profiler.history import JobHistory, JobRecord, Outcome, PodRecord, SharedUse
from kubecell.profiler.identity import family_of
from kubecell.profiler.jobs import FoundJob, created_at, finished_at, parse_time
from kubecell.profiler.pairs import GpuSeries, Place, PodId, observe_sharing
from kubecell.profiler.prometheus import Prometheus, PrometheusError
from kubecell.profiler.sources import METRICS
from kubecell.profiler.store.errors import JobOfAnotherNamespaceError

RUNNING_WINDOW_SECONDS = 86_400.0
"""How much of a running job's life a pass reads (a week-long job would otherwise be read whole every pass)."""


@dataclass(frozen=True)
class Pass:
    """What one pass did: jobs saved, jobs skipped as already complete, and jobs the history refused (their
    uid and why: text their pods carry that it cannot keep), which the next pass tries again."""

    saved: tuple[JobRecord, ...]
    unchanged: tuple[str, ...]
    refused: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class SharePod:
    """A pod kubecell placed to share its GPU by time-slicing (``accounting`` isolation), the only sharing whose
    per-pod utilization is a speed (:mod:`kubecell.profiler.pairs`): its family (``namespace/family``, the key
    it is counted under as a partner) and the (node, GPU UUID) its record gives it, where the node agent labels
    its series (None: not one GPU)."""

    family: str
    gpu: tuple[str, str] | None


def _pod_records(jobs: Iterable[FoundJob]) -> Iterator[tuple[PodId, Mapping[str, Any], AllocationRecord | None]]:
    """Every pod of ``jobs`` with its allocation record (None: none, or one that cannot be read)."""
    for job in jobs:
        for pod in job.pods:
            try:
                record = pod_fields.record_of(pod)
            except RecordError:
                record = None  # a record it cannot read grants nothing
            yield (job.namespace, str(pod["metadata"]["name"])), pod, record


def share_pods(jobs: Iterable[FoundJob]) -> dict[PodId, SharePod]:
    """(namespace, pod) -> :class:`SharePod` of every time-sliced pod of ``jobs``: the partners a pass counts,
    and the pods it observes."""
    found: dict[PodId, SharePod] = {}
    for key, pod, record in _pod_records(jobs):
        if record is None or record.isolation != "accounting":
            continue
        one = record.gpus[0].uuid if len(record.gpus) == 1 else ""
        found[key] = SharePod("/".join(family_of(pod)), (record.node, one) if record.node and one else None)
    return found


def pod_places(jobs: Iterable[FoundJob]) -> dict[PodId, Place]:
    """(namespace, pod) -> where the API server's objects put every pod of ``jobs``: the node and GPUs its
    allocation record grants (the scheduler's, which the node agent enforces), else its ``spec.nodeName`` (any
    GPU there). What a pass believes of a series' ``node`` and ``gpu`` labels (:mod:`kubecell.profiler.pairs`)."""
    found: dict[PodId, Place] = {}
    for key, pod, record in _pod_records(jobs):
        if record is not None and record.gpus:
            # a MIG instance's UUID is not the GPU's the agent labels: its node alone
            found[key] = Place(record.node, frozenset(grant.uuid for grant in record.gpus)
                               if record.isolation != "mig" else None)
        else:
            found[key] = Place(pod_fields.node_of(pod))
    return found


def record_of(job: FoundJob, client: Prometheus, now: datetime,
              partners: Mapping[PodId, SharePod] | None = None, gpus: GpuSeries | None = None,
              places: Mapping[PodId, Place] | None = None) -> JobRecord:
    """``job`` with its series read over its life so far (from its first start, or its creation, to its end;
    while it runs, its last ``RUNNING_WINDOW_SECONDS``), and, for a share job, its sharing beside the
    ``partners`` (:func:`share_pods`, which names the job's own time-sliced pods too: the only ones observed),
    its GPUs read through the pass's ``gpus``. ``places`` (:func:`pod_places` of the pass's pods) says where a
    pod can have been: a series of a pod it puts on another GPU is left out (None: the job's own pods' places,
    every other pod's series believed)."""
    # start and finish are what kubelets wrote (a node's to choose: 1970, 9999), the creation time is the API
    # server's and now is ours: the window stays within them, or one pod would cost a query per hour of decades
    created = job.created.timestamp()
    start = max((job.started or job.created).timestamp(), created)
    end = max(min((job.finished or now).timestamp(), now.timestamp()), start + 1.0)
    if job.finished is None:  # read again at every pass while it runs: its last day only, its whole life once ended
        start = max(start, end - RUNNING_WINDOW_SECONDS)
    # each pod's samples from its own creation on: before it, a pod of the same name was another pod
    since = {str(pod["metadata"]["name"]): moment.timestamp() for pod in job.pods
             if (moment := created_at(pod)) is not None}
    # a job none of whose pods started has no series: nothing is asked of Prometheus for it
    profile = collect(client, Job(job.namespace, job.pod_names, start, end, since),
                      METRICS if job.started else ())
    sharing: tuple[SharedUse, ...] = ()
    sharing_problems: tuple[str, ...] = ()
    partners = partners or {}
    sliced = {name: partners[(job.namespace, name)] for name in job.pod_names if (job.namespace, name) in partners}
    if job.gpus_per_pod == 1 and job.milli_gpu_per_pod < MILLI_PER_GPU and sliced:
        placed = {name: share.gpu for name, share in sliced.items() if share.gpu is not None}

        def family(pod: PodId) -> str | None:
            share = partners.get(pod)
            return share.family if share is not None else None

        known = places if places is not None else pod_places([job])

        def present(pod: PodId, node: str, gpu: str) -> bool:
            place = known.get(pod)
            return place is None or place.holds(node, gpu)  # a pod not listed: there, and never named

        observed = observe_sharing(client, job.namespace, list(sliced), start, end, family, gpus=gpus,
                                   placed=placed, created=since, present=present)
        sharing, sharing_problems = observed.sharing, observed.problems
    started, finished, clock_problems = _run_between(job, now)
    pods = []
    for pod in job.pods:
        name = str(pod["metadata"]["name"])
        status = pod.get("status") or {}
        phase = pod_fields.phase(pod)
        pods.append(PodRecord(
            name=name, node=pod_fields.node_of(pod) or None,
            phase=Outcome(phase) if phase in Outcome.__members__.values() else Outcome.UNKNOWN,
            started=parse_time(status.get("startTime")), finished=finished_at(pod),
            metrics={metric: found.pods[name] for metric, found in profile.metrics.items() if name in found.pods}))
    problems = (*job.problems, *clock_problems, *(f"pod {p.pod}: {p.metric}: {p.reason}" for p in profile.problems),
                *(f"sharing: {problem}" for problem in sharing_problems))
    return JobRecord(
        uid=job.uid, namespace=job.namespace, owner_kind=job.owner_kind, owner_name=job.owner_name,
        created=job.created, user=job.user, vc=job.vc, image=job.image, pod_count=len(job.pods),
        gpus_per_pod=job.gpus_per_pod, milli_gpu_per_pod=job.milli_gpu_per_pod,
        gpu_memory_mib_per_pod=job.gpu_memory_mib_per_pod, gpu_model_requested=job.gpu_model_requested,
        nodes=job.nodes, started=started, finished=finished, outcome=job.outcome, pods=tuple(pods),
        metrics={metric: found.job for metric, found in profile.metrics.items() if found.job is not None},
        problems=problems, sharing=sharing)


def _run_between(job: FoundJob, now: datetime) -> tuple[datetime | None, datetime | None, tuple[str, ...]]:
    """The job's start and finish as its record keeps them (what a family's run time and the report's GPU-hours
    are made of), and why they differ from what its pods say. A kubelet writes the finish by its node's clock,
    which can say 9999: a job has finished before the pass that sees it finished, so its finish is held to that
    pass's time (and a finish so held before the start leaves the run time unknown)."""
    started, finished = job.started, job.finished
    problems = []
    if finished is not None and finished > now:
        problems.append(f"finished ({finished.isoformat()}) after {now.isoformat()}, when this pass saw it "
                        "finished, as its pods' status says (a node's clock?): taken as finished then")
        finished = now
        if started is not None and finished < started:
            problems.append("its finish, held so, is before its start: its run time is unknown")
            started = None
    return started, finished, tuple(problems)


def saved_run(history: JobHistory, job: FoundJob) -> FoundJob:
    """``job`` under the key the history already keeps it by, where it is a run of an owner-less gang saved
    before under another key (its first pod since deleted, or saved before runs were told apart)."""
    if job.run_of is None:
        return job
    started = [(str(pod["metadata"]["name"]), moment) for pod in job.pods
               if (moment := parse_time((pod.get("status") or {}).get("startTime"))) is not None]
    uid = history.run_holding(job.run_of, started, namespace=job.namespace)
    return replace(job, uid=uid) if uid is not None and uid != job.uid else job


def profile_jobs(jobs: Iterable[FoundJob], client: Prometheus, history: JobHistory, *,
                 now: datetime | None = None, gpu_only: bool = True) -> Pass:
    """Profile and save ``jobs`` (those that asked for GPUs or whose request cannot be read, unless ``gpu_only``
    is False)."""
    now = now or datetime.now(UTC)
    jobs = list(jobs)
    partners = share_pods(jobs)
    places = pod_places(jobs)
    gpus = GpuSeries(client)
    saved: list[JobRecord] = []
    unchanged: list[str] = []
    refused: list[tuple[str, str]] = []
    for job in jobs:
        if gpu_only and job.gpus_per_pod <= 0 and not job.request_unread:
            continue  # a job whose request cannot be read may hold GPUs: profiled, with its problems
        job = saved_run(history, job)
        if job.finished is not None:
            known = history.get(job.uid)
            # kept as it was saved once its pods are all in it: the pod garbage collector deletes a finished
            # job's oldest pods first, and a record made again from what is left would lose them (and its length)
            # (another namespace's job under its key is not its record: the save below refuses or replaces it)
            if known is not None and known.namespace == job.namespace and known.finished is not None \
                    and set(job.pod_names) <= {pod.name for pod in known.pods}:
                unchanged.append(job.uid)
                continue
        try:
            # a record the history would refuse fails here, before I/O
            record = record_of(job, client, now, partners, gpus, places)
        except PrometheusError as error:
            if not error.refused:
                raise  # Prometheus is down or failing: the pass stops, as every job would fail alike
            # refused, too large, partial, or a series or sample of its answer that is no number: this job's
            # query is at fault, not Prometheus; the others are profiled, and this one is tried again next pass
            refused.append((job.uid, str(error)))
            continue
        except (KubecellError, ArithmeticError) as error:
            # one job's pods or series (a user's names, a node's values) never stop the others' profiles
            reason = str(error) if isinstance(error, KubecellError) else f"{type(error).__name__}: {error}"
            refused.append((job.uid, reason))
            continue
        try:
            history.save(record)
        except JobOfAnotherNamespaceError as error:
            refused.append((job.uid, str(error)))
            continue
        saved.append(record)
    return Pass(tuple(saved), tuple(unchanged), tuple(refused))
