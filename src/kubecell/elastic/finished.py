"""Which ElasticJobs the controller saw end: the ConfigMap ``kubecell-elastic-finished`` in the controller's own
namespace, one key ``<namespace>.<name>`` per finished job (its uid and how it ended).

Why not the job's status: whoever may patch ``elasticjobs/status`` (the scheduler writes its conditions and its
goodput model there) could write ``phase: Succeeded`` on a running job, and a finished job's rendezvous is
removed and, ``Failed``, its running workers stopped. The controller decides that a job ended from what it
observes (its workers' exits, its restarts spent: ``states``), writes the status (conditional on the version it
read, so a decision on a stale copy is taken again) and records the end here before it acts on it; a status
that claims an end without a record decides nothing. Why a record at all, rather than the workers'
exits each time: ended pods do not last (the pod garbage collector deletes them past its threshold, and those
of a deleted node), and a restarted controller that saw neither record nor pods would start a finished
training again. Why not an annotation on the job: the controller may not write the job itself, only its
status and ``/scale`` (``deploy/elastic/rbac.yaml``), and whoever may update the job could write one too. The
controller's namespace is written by kubecell alone; the rules grant the controller this one ConfigMap.

Kept: one entry per finished job that still exists (taken out when the job is deleted, or found gone at a
relist), about 100 bytes each, so some 10,000 finished jobs fit in a ConfigMap's 1 MiB; past that the record is
refused and logged, and the end is acted on all the same (it was decided from the workers), so a Failed job's
workers still stop; what is lost is only the memory of it once its pods are gone. Read with checks, as every
object in the API: an entry that fails one is dropped.

Upgrade: where the ConfigMap does not exist yet, the first controller to keep it takes on the ends the job
statuses state then (written by the controller before it, which trusted them) and makes it, so that this
happens once. Deleting it makes the next controller to start trust the statuses again, once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubecell.elastic.states import TERMINAL, Phase
from kubecell.elastic.status import read_status
from kubecell.kube.elasticjobs import is_object_uid
from kubecell.kube.rest import ApiError, Kube

log = logging.getLogger("kubecell.elastic")

CONFIGMAP = "kubecell-elastic-finished"
MAX_VALUE_CHARS = 256
"""The longest value read (one written is under 200 characters)."""


@dataclass(frozen=True, slots=True)
class Finished:
    """How job ``uid`` ended, as the controller recorded it."""

    uid: str
    phase: Phase


def entry_key(key: str) -> str:
    """``<namespace>.<name>`` for the controller's ``<namespace>/<name>``: a ConfigMap key (a namespace is a DNS
    label, without dots, so no two jobs share one)."""
    return key.replace("/", ".", 1)


def job_key(entry: str) -> str:
    return entry.replace(".", "/", 1)


def encode(finished: Finished) -> str:
    return json.dumps({"uid": finished.uid, "phase": str(finished.phase)}, sort_keys=True)


def decode(text: Any) -> Finished | None:
    """The end kept in ``text``, or None where anything fails a check."""
    if not isinstance(text, str) or len(text) > MAX_VALUE_CHARS:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, Mapping) or not is_object_uid(value.get("uid")):
        return None
    phase = value.get("phase")
    if phase not in {str(p) for p in TERMINAL}:
        return None
    return Finished(value["uid"], Phase(phase))


def claimed(jobs: Mapping[str, Mapping[str, Any]]) -> dict[str, Finished]:
    """The ends the jobs' statuses state (``key`` -> uid and phase): what a first controller to keep the record
    takes on."""
    found = {}
    for key, obj in jobs.items():
        uid = (obj.get("metadata") or {}).get("uid")
        phase = read_status(obj).phase
        if is_object_uid(uid) and phase in TERMINAL:
            found[key] = Finished(uid, phase)
    return found


class FinishedJobs:
    """The record's reads and writes, and the controller's copy of it (read once, then written through)."""

    def __init__(self, kube: Kube, namespace: str, scope: str | None = None) -> None:
        self.kube = kube
        self.namespace = namespace
        self.scope = scope
        """The namespace of the jobs this controller runs (None: all): it takes out only entries of those."""
        self.kept: dict[str, Finished] | None = None
        """Job key -> how it ended (None: not read yet)."""
        self.dropped: set[str] = set()
        """Entries to take out (their jobs are gone) at the next ``flush``."""

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/configmaps/{CONFIGMAP}"

    @property
    def loaded(self) -> bool:
        return self.kept is not None

    def _mine(self, key: str) -> bool:
        return self.scope is None or key.split("/", 1)[0] == self.scope

    def load(self, jobs: Mapping[str, Mapping[str, Any]]) -> None:
        """Read the record once (raises ``ApiError``); where it does not exist, take on the ends ``jobs``' statuses
        state and make it. Entries of jobs that are gone are taken out at the next ``flush``."""
        if self.kept is not None:
            return
        try:
            data = self._data(self.kube.get(self.path))
        except ApiError as error:
            if not error.not_found:
                raise
            adopted = {key: end for key, end in claimed(jobs).items() if self._mine(key)}
            made = self._make(adopted)
            if made is None:
                self.kept = adopted
                log.info("kept no record of finished ElasticJobs yet: took on the %d ends their statuses state "
                         "(ConfigMap %s/%s made)", len(adopted), self.namespace, CONFIGMAP)
                return
            data = made
        kept: dict[str, Finished] = {}
        for entry, text in data.items():
            end = decode(text)
            if end is None:
                log.warning("ConfigMap %s/%s: entry %r unreadable, taken out", self.namespace, CONFIGMAP, entry[:300])
                self.dropped.add(job_key(str(entry)))
            else:
                kept[job_key(str(entry))] = end
        self.kept = kept
        self.prune(jobs)

    def ready(self, jobs: Mapping[str, Mapping[str, Any]]) -> bool:
        """``load`` and ``flush``; False, logged, while the record cannot be read: the controller then acts on no
        job (one whose end it holds would be started again)."""
        try:
            self.load(jobs)
        except ApiError as error:
            log.error("cannot read the record of finished ElasticJobs (ConfigMap %s/%s): %s; no job is reconciled "
                      "until it can be", self.namespace, CONFIGMAP, error)
            return False
        self.flush()
        return True

    def phase_of(self, key: str, uid: str) -> Phase | None:
        """How job ``key`` of ``uid`` ended, as recorded; None where it has not (or another job of its name did)."""
        end = (self.kept or {}).get(key)
        return end.phase if end is not None and end.uid == uid else None

    def record(self, key: str, uid: str, phase: Phase) -> None:
        """Record that job ``key`` of ``uid`` ended so; raises ``ApiError`` where the API refused (the caller
        does not make the job final then)."""
        end = Finished(uid, phase)
        self._write({entry_key(key): encode(end)})
        if self.kept is not None:
            self.kept[key] = end
        self.dropped.discard(key)

    def forget(self, key: str) -> None:
        """Job ``key`` is gone (or another was made under its name): its entry goes at the next ``flush``."""
        if self.kept is not None and self.kept.pop(key, None) is not None:
            self.dropped.add(key)

    def prune(self, jobs: Mapping[str, Mapping[str, Any]]) -> None:
        """Forget the entries of this controller's jobs that ``jobs`` (a full list) no longer holds."""
        for key, end in list((self.kept or {}).items()):
            if self._mine(key) and ((jobs.get(key) or {}).get("metadata") or {}).get("uid") != end.uid:
                self.forget(key)

    def flush(self) -> None:
        """Take out the entries of jobs that are gone; a refusal is logged and tried again at the next call."""
        if not self.dropped:
            return
        dropped = set(self.dropped)
        try:
            self._write(dict.fromkeys(entry_key(key) for key in dropped))
        except ApiError as error:
            log.warning("cannot take %d finished ElasticJobs out of ConfigMap %s/%s: %s", len(dropped),
                        self.namespace, CONFIGMAP, error)
            return
        self.dropped -= dropped

    @staticmethod
    def _data(found: Mapping[str, Any]) -> Mapping[str, Any]:
        data = found.get("data")
        return data if isinstance(data, Mapping) else {}

    def _make(self, ends: Mapping[str, Finished]) -> Mapping[str, Any] | None:
        """Make the ConfigMap with ``ends``; None when made, else the data of the one another replica made
        meanwhile (409)."""
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": CONFIGMAP, "namespace": self.namespace,
                             "labels": {"app.kubernetes.io/part-of": "kubecell"}},
                "data": {entry_key(key): encode(end) for key, end in ends.items()}}
        try:
            self.kube.create(f"/api/v1/namespaces/{self.namespace}/configmaps", body)
        except ApiError as error:
            if not error.conflict:
                raise
            return self._data(self.kube.get(self.path))
        return None

    def _write(self, changes: Mapping[str, str | None]) -> None:
        """Set (a value) or take out (None) entries: a merge patch, each entry alone; the ConfigMap made again
        with every entry kept where it was deleted."""
        try:
            self.kube.patch(self.path, {"data": dict(changes)})
        except ApiError as error:
            if not error.not_found:
                raise
            ends = {key: end for key, end in (self.kept or {}).items() if entry_key(key) not in changes}
            ends.update({job_key(entry): end for entry, text in changes.items()
                         if text is not None and (end := decode(text)) is not None})
            if self._make(ends) is not None:  # made meanwhile: the patch now finds it
                self.kube.patch(self.path, {"data": dict(changes)})
