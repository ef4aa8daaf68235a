"""The job history: what each job asked for, where it ran, how long, how it ended and what it really used.

A job is what an owner (a controller: Job, PyTorchJob, ElasticJob...) or a gang stands for; its owner's uid is
its key, so saving a job again (the profiler revisits running jobs) replaces it, pods and distributions
included, in one transaction: a reader never sees a job with half of its pods. SQLite (a file) is the default,
PostgreSQL serves a cluster; :meth:`JobHistory.open` migrates either to this code's schema and refuses one newer.
Every failure a user can cause is a :class:`ProfilerStoreError` with a one-line message.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from sqlalchemy import ColumnElement, Engine, Select, delete, func, insert, or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, selectinload

from kubecell.profiler.distribution import Distribution, DistributionError
from kubecell.profiler.identity import name_family
from kubecell.profiler.store import migrate
from kubecell.profiler.store.errors import JobOfAnotherNamespaceError, ProfilerStoreError, describe
from kubecell.profiler.store.schema import (
    KEY_LENGTH,
    METRIC_LENGTH,
    PARTNER_LENGTH,
    SHORT_LENGTH,
    UID_LENGTH,
    JobMetricRow,
    JobRow,
    PodMetricRow,
    PodRow,
    SharingRow,
    decile_values,
    deciles_of,
)

__all__ = ["DEFAULT_LIMIT", "GANG_KEY_PREFIX", "GANG_KIND", "FamilySharing", "JobHistory", "JobRecord", "Outcome",
           "PodRecord", "ProfilerStoreError", "SharedUse"]

DEFAULT_LIMIT = 1000

GANG_KIND = "Gang"
"""The owner kind of a job that is an owner-less gang (``kubecell.profiler.jobs``)."""
GANG_KEY_PREFIX = "gang-"
"""How an owner-less gang's key begins: ``gang-<sha256 of its namespace and gang>`` and its run. The digest is
of the gang's own namespace, so no other namespace's gang has it, and no API server's uid (a UUID) begins so:
the profiler never takes an owner uid that does for a key (``kubecell.profiler.jobs``)."""

NAMES_PER_QUERY = 500
"""Pod names per query when a pass looks a gang's run up by its pods (SQLite and PostgreSQL bound the number of
parameters of one statement; a gang may have thousands of pods)."""


class Outcome(StrEnum):
    """How a job (or pod) stands or ended; the values are Kubernetes' pod phases."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


def _text(where: str, value: str | None, limit: int | None = None) -> None:
    """Refuse what a backend would refuse differently (PostgreSQL rejects NUL, SQLite keeps it) or not at all."""
    if value is None:
        return
    if "\x00" in value:
        raise ProfilerStoreError(f"{where} contains a NUL character, which PostgreSQL cannot store")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ProfilerStoreError(f"{where} is not valid Unicode text: {error.reason}") from error
    if limit is not None and len(value) > limit:
        raise ProfilerStoreError(f"{where} is {len(value)} characters; the history keeps at most {limit}")


def _instant(where: str, value: datetime | None) -> datetime | None:
    if value is None:
        return None
    if value.tzinfo is None or value.utcoffset() is None:
        raise ProfilerStoreError(f"{where} {value.isoformat()} has no time zone; give UTC times")
    return value.astimezone(UTC)


def _metrics(where: str, metrics: Mapping[str, Distribution]) -> None:
    for metric, dist in metrics.items():
        _text(f"{where} metric name", metric, METRIC_LENGTH)
        if not metric:
            raise ProfilerStoreError(f"{where} has a metric with an empty name")
        if not all(math.isfinite(value) for value in (*dist.deciles, dist.seconds)):
            raise ProfilerStoreError(f"{where} metric {metric!r} has a NaN or infinite decile or duration")


@dataclass(frozen=True)
class PodRecord:
    """One pod of a job: where it ran, when, how it ended, and its own distribution of each metric."""

    name: str
    node: str | None = None
    phase: Outcome = Outcome.UNKNOWN
    started: datetime | None = None
    finished: datetime | None = None
    metrics: Mapping[str, Distribution] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _text("pod name", self.name)
        _text(f"pod {self.name[:80]!r} node", self.node)
        object.__setattr__(self, "phase", Outcome(self.phase))
        object.__setattr__(self, "started", _instant("pod start", self.started))
        object.__setattr__(self, "finished", _instant("pod finish", self.finished))
        _metrics(f"pod {self.name[:80]!r}", self.metrics)


@dataclass(frozen=True)
class SharedUse:
    """How a job's share pods used their GPUs while one pod of the ``partner`` family (``namespace/family``) was
    the only other pod on the GPU, or while they were alone on it (``partner`` ``""``): the seconds observed and
    ``busy_seconds``, the integral of the pods' own utilization ratio of the GPU over them (at most
    ``seconds``). Where a family's jobs are busy for less of the time beside a partner than alone, time-slicing
    gave them less of the GPU: ``kubecell.profiler.pairs`` reads that ratio as their speed beside it."""

    partner: str
    seconds: float
    busy_seconds: float

    def __post_init__(self) -> None:
        _text("sharing partner", self.partner, PARTNER_LENGTH)
        seconds, busy = float(self.seconds), float(self.busy_seconds)
        if not (math.isfinite(seconds) and math.isfinite(busy) and seconds > 0 and 0 <= busy <= seconds):
            raise ProfilerStoreError(f"sharing beside {self.partner[:80]!r}: {busy} busy seconds of {seconds}; "
                                     "expected 0 <= busy seconds <= seconds, seconds > 0")
        object.__setattr__(self, "seconds", seconds)
        object.__setattr__(self, "busy_seconds", busy)


@dataclass(frozen=True)
class FamilySharing:
    """:class:`SharedUse` summed over the jobs of one family (``namespace/family``) beside one ``partner``."""

    family: str
    partner: str
    seconds: float
    busy_seconds: float


@dataclass(frozen=True)
class JobRecord:
    """A job in the history. ``family`` defaults to :func:`name_family` of the owner's name; times are
    timezone-aware and kept in UTC; ``problems`` are the series the profiler could not read, one message each."""

    uid: str
    namespace: str
    owner_kind: str
    owner_name: str
    created: datetime
    user: str | None = None
    vc: str | None = None
    image: str | None = None
    family: str = ""
    pod_count: int = 1
    gpus_per_pod: int = 0
    milli_gpu_per_pod: int = 0
    gpu_memory_mib_per_pod: int | None = None
    gpu_model_requested: str | None = None
    nodes: tuple[str, ...] = ()
    gpu_model: str | None = None
    started: datetime | None = None
    finished: datetime | None = None
    outcome: Outcome = Outcome.UNKNOWN
    pods: tuple[PodRecord, ...] = ()
    metrics: Mapping[str, Distribution] = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    sharing: tuple[SharedUse, ...] = ()

    def __post_init__(self) -> None:
        if not self.uid:
            raise ProfilerStoreError("a job record needs its owner's uid")
        _text("uid", self.uid, UID_LENGTH)
        where = f"job {self.uid}"
        for name, limit in (("namespace", KEY_LENGTH), ("user", KEY_LENGTH), ("vc", KEY_LENGTH),
                            ("family", KEY_LENGTH), ("owner_kind", SHORT_LENGTH), ("owner_name", None),
                            ("image", None), ("gpu_model_requested", None), ("gpu_model", None)):
            _text(f"{where} {name}", getattr(self, name), limit)
        for node in self.nodes:
            _text(f"{where} node", node)
        for problem in self.problems:
            _text(f"{where} problem", problem)
        for name in ("pod_count", "gpus_per_pod", "milli_gpu_per_pod", "gpu_memory_mib_per_pod"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < 2**31:
                raise ProfilerStoreError(f"{where} {name} = {value}: expected 0 to {2**31 - 1}")
        if not self.family:
            object.__setattr__(self, "family", name_family(self.owner_name))
        object.__setattr__(self, "outcome", Outcome(self.outcome))
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "pods", tuple(self.pods))
        object.__setattr__(self, "problems", tuple(self.problems))
        object.__setattr__(self, "sharing", tuple(sorted(self.sharing, key=lambda use: use.partner)))
        partners = [use.partner for use in self.sharing]
        if len(set(partners)) != len(partners):
            raise ProfilerStoreError(f"{where} names a sharing partner twice: {partners}")
        for name in ("created", "started", "finished"):
            object.__setattr__(self, name, _instant(f"{where} {name}", getattr(self, name)))
        _metrics(where, self.metrics)

    @property
    def seconds(self) -> float | None:
        """How long it ran (finished - started), where both are known."""
        if self.started is None or self.finished is None:
            return None
        return (self.finished - self.started).total_seconds()


def _gang_key(record: JobRecord) -> bool:
    """Whether ``record`` is a run of an owner-less gang under its own key (see :data:`GANG_KEY_PREFIX`)."""
    return record.owner_kind == GANG_KIND and record.uid.startswith(GANG_KEY_PREFIX)


def _job_values(record: JobRecord) -> dict[str, Any]:
    return {"uid": record.uid, "namespace": record.namespace, "owner_kind": record.owner_kind,
            "owner_name": record.owner_name, "user_name": record.user, "vc": record.vc, "image": record.image,
            "family": record.family, "pod_count": record.pod_count, "gpus_per_pod": record.gpus_per_pod,
            "milli_gpu_per_pod": record.milli_gpu_per_pod, "gpu_memory_mib_per_pod": record.gpu_memory_mib_per_pod,
            "gpu_model_requested": record.gpu_model_requested, "nodes": list(record.nodes),
            "gpu_model": record.gpu_model, "created": record.created, "started": record.started,
            "finished": record.finished, "outcome": str(record.outcome), "problems": list(record.problems)}


def _distribution_values(dist: Distribution) -> dict[str, Any]:
    return {**decile_values(dist.deciles), "mean": dist.mean, "samples": dist.samples, "seconds": dist.seconds}


def _distribution(row: JobMetricRow | PodMetricRow) -> Distribution:
    return Distribution(deciles_of(row), row.mean, row.samples, row.seconds)


def _record(row: JobRow) -> JobRecord:
    pods = tuple(PodRecord(name=pod.name, node=pod.node, phase=Outcome(pod.phase), started=pod.started,
                           finished=pod.finished, metrics={m.metric: _distribution(m) for m in pod.metrics})
                 for pod in row.pods)
    return JobRecord(uid=row.uid, namespace=row.namespace, owner_kind=row.owner_kind, owner_name=row.owner_name,
                     created=row.created, user=row.user_name, vc=row.vc, image=row.image, family=row.family,
                     pod_count=row.pod_count, gpus_per_pod=row.gpus_per_pod, milli_gpu_per_pod=row.milli_gpu_per_pod,
                     gpu_memory_mib_per_pod=row.gpu_memory_mib_per_pod, gpu_model_requested=row.gpu_model_requested,
                     nodes=tuple(row.nodes), gpu_model=row.gpu_model, started=row.started, finished=row.finished,
                     outcome=Outcome(row.outcome), pods=pods,
                     metrics={m.metric: _distribution(m) for m in row.metrics}, problems=tuple(row.problems),
                     sharing=tuple(SharedUse(use.partner, use.seconds, use.busy_seconds) for use in row.sharing))


def _conditions(namespace: str | None, family: str | None, user: str | None, vc: str | None,
                finished_since: datetime | None) -> list[ColumnElement[bool]]:
    conditions = [column == value for column, value in ((JobRow.namespace, namespace), (JobRow.family, family),
                                                        (JobRow.user_name, user), (JobRow.vc, vc))
                  if value is not None]
    if finished_since is not None:
        conditions.append(JobRow.finished >= _instant("finished_since", finished_since))
    return conditions


class JobHistory:
    """The job history in one database; open with :meth:`open`, close with :meth:`close` (or ``with``)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._where = migrate.where(engine)

    @classmethod
    def open(cls, url: str, *, create: bool = True) -> JobHistory:
        """Open (creating where needed, unless ``create`` is False) the history at ``url`` and migrate it to this
        code's schema. A command that only reads opens with ``create`` False, so that a mistyped URL is an error,
        not an empty history that looks like no data (and a SQLite file it would have left behind)."""
        if not create:
            parsed = migrate.parse_url(url)
            file = parsed.database if parsed.get_backend_name() == "sqlite" else None
            if file and file != ":memory:" and not file.startswith("file:") and not Path(file).is_file():
                raise ProfilerStoreError(f"no job history at {url}: no such file; "
                                         f"'kubecell profile collect --db {url}' makes one")
        engine = migrate.create(url)
        try:
            migrate.upgrade(engine, create=create)
        except BaseException:
            engine.dispose()
            raise
        return cls(engine)

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> JobHistory:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @contextmanager
    def _session(self, doing: str) -> Iterator[Session]:
        try:
            with Session(self._engine, expire_on_commit=False) as session, session.begin():
                yield session
        except (SQLAlchemyError, DistributionError, ValueError, OverflowError, TypeError, RecursionError) as error:
            # a store anyone can edit: text in an INTEGER column (SQLite keeps it) is a TypeError, a JSON value
            # nested 100,000 deep a RecursionError, once read back
            raise ProfilerStoreError(f"{doing} in {self._where}: {describe(error)}") from error

    def save(self, record: JobRecord) -> None:
        """Insert or replace the job ``record.uid``, with exactly ``record``'s pods and distributions."""
        values = _job_values(record)
        dialect = self._engine.dialect.name
        dialect_insert = postgresql.insert(JobRow) if dialect == "postgresql" else sqlite.insert(JobRow)
        upsert = dialect_insert.values(values).on_conflict_do_update(
            index_elements=[JobRow.uid], set_={key: value for key, value in values.items() if key != "uid"})
        with self._session(f"saving job {record.uid}") as session:
            kept = session.scalar(select(JobRow.namespace).where(JobRow.uid == record.uid))
            if kept is not None and kept != record.namespace and not _gang_key(record):
                raise JobOfAnotherNamespaceError(
                    f"job {record.uid} of namespace {record.namespace}: the history keeps a job of namespace {kept} "
                    "under that owner uid; not replaced (a pod's owner reference names another namespace's owner)")
            # a gang's key held by another namespace is a squat saved before the profiler refused owner uids
            # that begin as gangs' keys do (the key is a digest of the gang's own namespace): replaced
            session.execute(upsert)
            for table in (PodMetricRow, JobMetricRow, SharingRow):
                session.execute(delete(table).where(table.job_uid == record.uid))
            session.execute(delete(PodRow).where(PodRow.job_uid == record.uid))
            if record.pods:
                session.execute(insert(PodRow), [
                    {"job_uid": record.uid, "position": position, "name": pod.name, "node": pod.node,
                     "phase": str(pod.phase), "started": pod.started, "finished": pod.finished}
                    for position, pod in enumerate(record.pods)])
            pod_metrics = [{"job_uid": record.uid, "pod_position": position, "metric": metric,
                            **_distribution_values(dist)}
                           for position, pod in enumerate(record.pods) for metric, dist in pod.metrics.items()]
            if pod_metrics:
                session.execute(insert(PodMetricRow), pod_metrics)
            if record.metrics:
                session.execute(insert(JobMetricRow), [
                    {"job_uid": record.uid, "metric": metric, **_distribution_values(dist)}
                    for metric, dist in record.metrics.items()])
            if record.sharing:
                session.execute(insert(SharingRow), [
                    {"job_uid": record.uid, "partner": use.partner, "seconds": use.seconds,
                     "busy_seconds": use.busy_seconds} for use in record.sharing])

    def _load(self, query: Select[JobRow], doing: str) -> list[JobRecord]:
        query = query.options(selectinload(JobRow.pods).selectinload(PodRow.metrics), selectinload(JobRow.metrics),
                              selectinload(JobRow.sharing))
        with self._session(doing) as session:
            return [_record(row) for row in session.scalars(query)]

    def get(self, uid: str) -> JobRecord | None:
        """The job ``uid``, or None when the history has no such job."""
        found = self._load(select(JobRow).where(JobRow.uid == uid), f"reading job {uid[:UID_LENGTH]}")
        return found[0] if found else None

    def run_holding(self, gang: str, pods: Iterable[tuple[str, datetime]], *, namespace: str) -> str | None:
        """The uid of the saved run of the owner-less gang ``gang`` of ``namespace`` that holds one of ``pods``
        (name, start time), or None. A pass sees a run again by its pods, not by its key: the key carries the run's
        first creation time, which changes when that pod is deleted (the pod garbage collector deletes the oldest
        first), while a pod keeps its name and start. Runs saved under ``gang`` itself (before runs were told
        apart) are found the same way. Only ``namespace``'s jobs are looked at: a job another namespace keeps
        under a key like the gang's (saved before such keys were refused to owners) is never its run."""
        wanted = {(name, _instant("pod start", started)) for name, started in pods}
        if not wanted:
            return None
        names = sorted({name for name, _ in wanted})
        of_gang = or_(PodRow.job_uid == gang, PodRow.job_uid.startswith(f"{gang}.", autoescape=True))
        held = Counter[str]()
        with self._session(f"finding the run of {gang[:UID_LENGTH]}") as session:
            for first in range(0, len(names), NAMES_PER_QUERY):  # a bound parameter per name, within any server's limit
                chunk = names[first:first + NAMES_PER_QUERY]
                query = select(PodRow.job_uid, PodRow.name, PodRow.started).join(JobRow, JobRow.uid == PodRow.job_uid)
                query = query.where(of_gang, JobRow.namespace == namespace, PodRow.name.in_(chunk))
                held.update(uid for uid, name, started in session.execute(query) if (name, started) in wanted)
        return min(held, key=lambda uid: (-held[uid], uid)) if held else None

    def jobs(self, namespace: str | None = None, family: str | None = None, user: str | None = None,
             vc: str | None = None, finished_since: datetime | None = None,
             limit: int = DEFAULT_LIMIT) -> list[JobRecord]:
        """Jobs matching every filter given, newest created first, at most ``limit``."""
        query = select(JobRow).where(*_conditions(namespace, family, user, vc, finished_since))
        query = query.order_by(JobRow.created.desc(), JobRow.uid).limit(limit)
        return self._load(query, "listing jobs")

    def durations(self, family: str | None = None, user: str | None = None, vc: str | None = None,
                  outcomes: tuple[Outcome, ...] | None = None, limit: int = DEFAULT_LIMIT,
                  namespace: str | None = None) -> list[float]:
        """Run times in seconds (finished - started) of the finished jobs matching the filters, the most recently
        finished ``limit`` of them, oldest first; ``outcomes`` keeps only jobs that ended so (all when None)."""
        query = select(JobRow.started, JobRow.finished).where(*_conditions(namespace, family, user, vc, None))
        query = query.where(JobRow.started.is_not(None), JobRow.finished.is_not(None),
                            JobRow.finished >= JobRow.started)  # (times a kubelet wrote: its clock may step back)
        if outcomes is not None:
            query = query.where(JobRow.outcome.in_([str(outcome) for outcome in outcomes]))
        query = query.order_by(JobRow.finished.desc(), JobRow.uid).limit(limit)
        with self._session("reading durations") as session:
            rows = session.execute(query).all()
        return [(finished - started).total_seconds() for started, finished in reversed(rows)
                if started is not None and finished is not None]

    def sharing(self, created_since: datetime | None = None) -> list[FamilySharing]:
        """Per family and partner, the :class:`SharedUse` of its jobs (those created since ``created_since``,
        all when None) summed: one row per pair a pass ever saw, the history's whole knowledge of sharing."""
        query = select(JobRow.namespace, JobRow.family, SharingRow.partner, func.sum(SharingRow.seconds),
                       func.sum(SharingRow.busy_seconds)).join(SharingRow, SharingRow.job_uid == JobRow.uid)
        if created_since is not None:
            query = query.where(JobRow.created >= _instant("created_since", created_since))
        query = query.group_by(JobRow.namespace, JobRow.family, SharingRow.partner)
        with self._session("reading sharing") as session:
            rows = session.execute(query).all()
        return [FamilySharing(f"{namespace}/{family}", partner, float(seconds), float(busy))
                for namespace, family, partner, seconds, busy in rows]
