"""One profiling pass: the jobs the API server shows, their series from Prometheus, saved in the history.

The profiler runs again and again (``kubecell profile collect --every``): a running job is saved each time with
what it used so far, and once more when it has finished; a finished job already saved with the same end is not
read again. Pods disappear from the API some time after they finish, so a job is only as complete as the
passes that saw it: run the profiler more often than finished pods are deleted. A job whose series are missing
or bad is saved with its problems (one message per pod and metric); Prometheus or the database failing stops
the pass with that error, since no job could be profiled.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from kubecell.kube import pods as pod_fields
from kubecell.profiler.collect import Job, collect
from kubecell.profiler.history import JobHistory, JobRecord, Outcome, PodRecord, ProfilerStoreError
from kubecell.profiler.jobs import FoundJob, finished_at, parse_time
from kubecell.profiler.prometheus import Prometheus


@dataclass(frozen=True)
class Pass:
    """What one pass did: jobs saved, jobs skipped as already complete, and jobs the history refused (their
    uid and why: text their pods carry that it cannot keep), which the next pass tries again."""

    saved: tuple[JobRecord, ...]
    unchanged: tuple[str, ...]
    refused: tuple[tuple[str, str], ...] = ()


def record_of(job: FoundJob, client: Prometheus, now: datetime) -> JobRecord:
    """``job`` with its series read over its life so far (from its first start, or its creation, to its end)."""
    start = (job.started or job.created).timestamp()
    end = max((job.finished or now).timestamp(), start + 1.0)
    profile = collect(client, Job(job.namespace, job.pod_names, start, end))
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
    problems = (*job.problems, *(f"pod {p.pod}: {p.metric}: {p.reason}" for p in profile.problems))
    return JobRecord(
        uid=job.uid, namespace=job.namespace, owner_kind=job.owner_kind, owner_name=job.owner_name,
        created=job.created, user=job.user, vc=job.vc, image=job.image, pod_count=len(job.pods),
        gpus_per_pod=job.gpus_per_pod, milli_gpu_per_pod=job.milli_gpu_per_pod,
        gpu_memory_mib_per_pod=job.gpu_memory_mib_per_pod, gpu_model_requested=job.gpu_model_requested,
        nodes=job.nodes, started=job.started, finished=job.finished, outcome=job.outcome, pods=tuple(pods),
        metrics={metric: found.job for metric, found in profile.metrics.items() if found.job is not None},
        problems=problems)


def profile_jobs(jobs: Iterable[FoundJob], client: Prometheus, history: JobHistory, *,
                 now: datetime | None = None, gpu_only: bool = True) -> Pass:
    """Profile and save ``jobs`` (those that asked for GPUs or whose request cannot be read, unless ``gpu_only``
    is False)."""
    now = now or datetime.now(UTC)
    saved: list[JobRecord] = []
    unchanged: list[str] = []
    refused: list[tuple[str, str]] = []
    for job in jobs:
        if gpu_only and job.gpus_per_pod <= 0 and not job.problems:
            continue  # a job whose request cannot be read may hold GPUs: profiled, with its problems
        if job.finished is not None:
            known = history.get(job.uid)
            if known is not None and known.finished == job.finished and len(known.pods) == len(job.pods):
                unchanged.append(job.uid)
                continue
        try:
            record = record_of(job, client, now)  # a record the history would refuse fails here, before I/O
        except ProfilerStoreError as error:
            refused.append((job.uid, str(error)))
            continue
        history.save(record)
        saved.append(record)
    return Pass(tuple(saved), tuple(unchanged), tuple(refused))
