"""What the ElasticJob controller keeps of each job where only it writes: the ConfigMap ``kubecell-elastic-finished``
in the controller's own namespace, one key ``<namespace>.<name>`` per job (its uid, its restart count and the
target its workers follow, and how it ended once it did).

Why not the job's status: whoever may patch ``elasticjobs/status`` (the scheduler writes its conditions and its
goodput model there) could write ``phase: Succeeded`` on a running job, and a finished job's rendezvous is
removed and, ``Failed``, its running workers stopped; or ``restarts: 1``, and every worker, labelled with the
rendezvous run it joins (the count when it was made), was stale and replaced (``restarts`` at ``maxRestarts``:
the next failure final); or a ``targetReplicas`` that passed for a first start or a resize. The controller
decides these from what it observes (its workers' exits, its restarts spent: ``states``), writes the status
(conditional on the version it read, so a decision on a stale copy is taken again) and keeps them here before it
acts; a status that says otherwise decides nothing and is written back (``memory``, ``disowned``). Why a record
at all, rather than the workers each time: ended pods do not last (the pod garbage collector deletes them past
its threshold, and those of a deleted node), a restart deletes every worker before it makes them again, and a
restarted controller that saw neither record nor pods would start a finished training again. Why not an
annotation on the job: the controller may not write the job itself, only its status and ``/scale``
(``deploy/elastic/rbac.yaml``), and whoever may update the job could write one too. The controller's namespace
is written by kubecell alone; the rules grant the controller these ConfigMaps, by name.

Kept: one entry per job that still exists (taken out when the job is deleted, or found gone at a relist), about 150
bytes each, spread by a hash of the job's key over ``SHARDS`` ConfigMaps (``kubecell-elastic-finished``,
``kubecell-elastic-finished-1`` ...), so that some 7,000 jobs fit in each one's 1 MiB and about 110,000 in all (in
one ConfigMap, a cluster that kept 8,000 ElasticJobs, finished ones included, started no more; a job's
``spec.ttlSecondsAfterFinished`` deletes it, and its entry, once it has ended: ``elastic.expiry``); an entry is
written when the job starts, resizes, restarts or ends. Past that a write is refused and logged: an end is acted on
all the same (it was decided from the workers: their GPUs are freed), kept in memory and written again at each pass;
a start, resize or restart waits (a ``RecordRefused`` Warning), since workers made in a run the record does not hold
would be taken for stale ones by the next controller. Read with checks, as every object in the API: an entry that
fails one is dropped.

Upgrade: where a ConfigMap of the record does not exist yet, the first controller to keep it takes on the ends the
job statuses state then for the jobs it holds (written by the controller before it, which trusted them) and makes
it, so that this happens once. Deleting one makes the next controller to start trust the statuses' ends again,
once. A job without an entry (started before the record kept counts) takes the lower of its status' count and its
newest worker's run label, and its status' target where it has workers (once: they are recorded at that pass); a
job that ended before keeps its status' counts (nothing is decided from them).
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from kubecell.elastic.states import TERMINAL, Phase
from kubecell.elastic.status import MAX_COUNT, StatusView, read_status
from kubecell.kube.elasticjobs import MAX_REPLICAS, is_object_uid
from kubecell.kube.rest import ApiError, Kube

log = logging.getLogger("kubecell.elastic")

CONFIGMAP = "kubecell-elastic-finished"
MAX_EPOCH_SECONDS = 10**11
"""The latest end time an entry may state (the year 5138): a bound on what is read, not a policy."""
SHARDS = 16
"""How many ConfigMaps the record is spread over (the rules name each: ``deploy/elastic/rbac.yaml``)."""


def shard_of(key: str) -> int:
    """Which ConfigMap of the record holds job ``key``'s entry (a hash: the same in every process)."""
    return zlib.crc32(key.encode("utf-8", "surrogatepass")) % SHARDS


def configmap_name(shard: int) -> str:
    """The name of the record's ConfigMap ``shard`` (the first keeps the record's unsharded name)."""
    return CONFIGMAP if shard == 0 else f"{CONFIGMAP}-{shard}"
MAX_VALUE_CHARS = 256
"""The longest value read (one written is under 200 characters)."""


REASON_NOT_OBSERVED = "StatusNotObserved"
"""The Warning of a status whose restart count or target is not the controller's (``disowned``)."""


@dataclass(frozen=True, slots=True)
class Entry:
    """What the controller recorded of job ``uid``: how it ended (None: it has not), its restarts and the target
    its workers follow (None: an entry kept before the record kept counts)."""

    uid: str
    phase: Phase | None = None
    restarts: int | None = None
    target: int | None = None
    ended_at: int | None = None
    """When this controller (or one before it) recorded the end, in seconds since the epoch: what a finished job's
    ``spec.ttlSecondsAfterFinished`` counts from (``elastic.expiry``). None: not ended, or ended before the record
    kept the time (stamped at the next pass)."""


def entry_key(key: str) -> str:
    """``<namespace>.<name>`` for the controller's ``<namespace>/<name>``: a ConfigMap key (a namespace is a DNS
    label, without dots, so no two jobs share one)."""
    return key.replace("/", ".", 1)


def job_key(entry: str) -> str:
    return entry.replace(".", "/", 1)


def encode(entry: Entry) -> str:
    fields = {"uid": entry.uid, "phase": entry.phase and str(entry.phase), "restarts": entry.restarts,
              "target": entry.target, "ended": entry.ended_at}
    return json.dumps({key: value for key, value in fields.items() if value is not None}, sort_keys=True)


def _bounded(value: Any, most: int) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= most)


def decode(text: Any) -> Entry | None:
    """The entry kept in ``text``, or None where anything fails a check."""
    if not isinstance(text, str) or len(text) > MAX_VALUE_CHARS:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, Mapping) or not is_object_uid(value.get("uid")):
        return None
    phase, restarts, target = value.get("phase"), value.get("restarts"), value.get("target")
    ended = value.get("ended")
    if (phase is not None and phase not in {str(p) for p in TERMINAL}) or (restarts is None) != (target is None) \
            or not _bounded(restarts, MAX_COUNT) or not _bounded(target, MAX_REPLICAS) \
            or (phase is None and restarts is None) or not _bounded(ended, MAX_EPOCH_SECONDS) \
            or (phase is None and ended is not None):
        return None
    return Entry(value["uid"], None if phase is None else Phase(phase), restarts, target, ended)


def claimed(jobs: Mapping[str, Mapping[str, Any]]) -> dict[str, Entry]:
    """The ends the jobs' statuses state (``key`` -> uid and phase): what a first controller to keep the record
    takes on."""
    found = {}
    for key, obj in jobs.items():
        uid = (obj.get("metadata") or {}).get("uid")
        phase = read_status(obj).phase
        if is_object_uid(uid) and phase in TERMINAL:
            found[key] = Entry(uid, phase)
    return found


def memory(entry: Entry | None, previous: StatusView, runs: Iterable[int | None]) -> tuple[int, int]:
    """The restart count and the target the controller decides the job from: its entry's (``entry``: nothing it
    acted on is missing there, ``FinishedJobs.keep``). Without one (a job started before the record kept counts;
    ``previous`` its status, ``runs`` the rendezvous run labels of the workers it made): no worker, a job not
    started; else the count its status and its newest worker both allow (each is written by others: the status by
    whoever has status rights, a label by whoever may patch pods) and its status' target, once (then recorded). A
    job that ended before the record kept counts keeps its status' (nothing is decided from them)."""
    if entry is not None and entry.restarts is not None and entry.target is not None:
        return entry.restarts, entry.target
    if entry is not None and entry.phase is not None:
        return previous.restarts, previous.target
    made = max((run for run in runs if run is not None), default=None)
    return (0, 0) if made is None else (min(made, previous.restarts), previous.target)


def disowned(previous: StatusView, restarts: int, target: int, written: tuple[int, int]) -> str | None:
    """What to say of a status whose restart count or target is neither the controller's (``restarts``,
    ``target``) nor what it writes now (``written``: a status it wrote before its record, then stopped), or
    None."""
    wrong = [f"status.{field} said {said}, this controller recorded {kept}"
             for field, said, kept, now in (("restarts", previous.restarts, restarts, written[0]),
                                            ("targetReplicas", previous.target, target, written[1]))
             if said not in (kept, now)]
    if not wrong:
        return None
    return (f"{'; '.join(wrong)} (kept where only it writes): written back; the workers follow spec.replicas and "
            "the restarts this controller counted")


class FinishedJobs:
    """The record's reads and writes, and the controller's copy of it (read once, then written through)."""

    def __init__(self, kube: Kube, namespace: str, scope: str | None = None) -> None:
        self.kube = kube
        self.namespace = namespace
        self.scope = scope
        """The namespace of the jobs this controller runs (None: all): it takes out only entries of those."""
        self.kept: dict[str, Entry] | None = None
        """Job key -> its entry (None: not read yet)."""
        self.dropped: set[str] = set()
        """Entries to take out (their jobs are gone) at the next ``flush``."""
        self.unsaved: set[str] = set()
        """Entries kept here that the API refused: written again at the next ``flush``."""
        self._stray: dict[int, set[str]] = {}
        """Per ConfigMap, the keys of entries that fail a check there: taken out at the next ``flush``."""

    def path(self, shard: int) -> str:
        return f"/api/v1/namespaces/{self.namespace}/configmaps/{configmap_name(shard)}"

    @property
    def loaded(self) -> bool:
        return self.kept is not None

    def _mine(self, key: str) -> bool:
        return self.scope is None or key.split("/", 1)[0] == self.scope

    def load(self, jobs: Mapping[str, Mapping[str, Any]]) -> None:
        """Read the record once, every ConfigMap of it (raises ``ApiError``); where one does not exist, take on the
        ends ``jobs``' statuses state for the jobs it holds and make it. Entries of jobs that are gone, or in a
        ConfigMap that does not hold their key, are taken out at the next ``flush``."""
        if self.kept is not None:
            return
        claims = {key: end for key, end in claimed(jobs).items() if self._mine(key)}
        kept: dict[str, Entry] = {}
        for shard in range(SHARDS):
            try:
                data = self._data(self.kube.get(self.path(shard)))
            except ApiError as error:
                if not error.not_found:
                    raise
                adopted = {key: end for key, end in claims.items() if shard_of(key) == shard}
                made = self._make(shard, adopted)
                if made is None:
                    kept.update(adopted)
                    log.info("kept no record of ElasticJobs in ConfigMap %s/%s yet: took on the %d ends their "
                             "statuses state, and made it", self.namespace, configmap_name(shard), len(adopted))
                    continue
                data = made
            for entry, text in data.items():
                key, end = job_key(str(entry)), decode(text)
                if end is None or shard_of(key) != shard:
                    log.warning("ConfigMap %s/%s: entry %r unreadable, taken out", self.namespace,
                                configmap_name(shard), str(entry)[:300])
                    self._stray.setdefault(shard, set()).add(str(entry))
                else:
                    kept[key] = end
        self.kept = kept
        self.prune(jobs)

    def ready(self, jobs: Mapping[str, Mapping[str, Any]]) -> bool:
        """``load`` and ``flush``; False, logged, while the record cannot be read: the controller then acts on no
        job (one whose end it holds would be started again)."""
        try:
            self.load(jobs)
        except ApiError as error:
            log.error("cannot read the record of ElasticJobs (ConfigMaps %s/%s...): %s; no job is reconciled "
                      "until it can be", self.namespace, CONFIGMAP, error)
            return False
        self.flush()
        return True

    def entry(self, key: str, uid: str) -> Entry | None:
        """The entry of job ``key`` of ``uid``; None where there is none (or it is another job's of its name)."""
        found = (self.kept or {}).get(key)
        return found if found is not None and found.uid == uid else None

    def phase_of(self, key: str, uid: str) -> Phase | None:
        """How job ``key`` of ``uid`` ended, as recorded; None where it has not (or another job of its name did)."""
        found = self.entry(key, uid)
        return None if found is None else found.phase

    def keep(self, key: str, uid: str, phase: Phase | None, restarts: int, target: int, *, now: float) -> bool:
        """Keep what was decided for job ``key`` of ``uid`` (its end, where ``phase``) before it is acted on, where
        it changed; False where the API refused it (the ConfigMap full, the API server away): a restart or target
        not kept is not acted on (its workers would be made in a run no record holds), and is decided again at the
        next pass. An end is acted on all the same (it came from the workers: their GPUs are freed now), kept in
        this copy and written again at each ``flush``. An entry without counts (an end kept before the record kept
        them) keeps them so. An end is kept with the time it was first recorded (``now``, epoch seconds, where the
        entry has none: an end recorded before the record kept the time counts from this pass)."""
        found = self.entry(key, uid)
        stamped = found.ended_at if found is not None and found.ended_at is not None else int(now)
        if found is not None and found.phase is not None and found.restarts is None:  # counts never kept: left so
            entry = replace(found, ended_at=stamped)
        else:
            entry = Entry(uid, phase, restarts, target, stamped if phase is not None else None)
        if found == entry or self.kept is None:
            return True
        try:
            self._write({entry_key(key): encode(entry)})
            self.unsaved.discard(key)
        except ApiError as error:
            log.warning("ElasticJob %s: ConfigMap %s/%s refused its entry %s: %s; %s", key, self.namespace,
                        configmap_name(shard_of(key)),
                        encode(entry), error, "acted on all the same" if phase else "not acted on until it is kept")
            if phase is None:
                return False
            self.unsaved.add(key)
        self.kept[key] = entry
        self.dropped.discard(key)
        return True

    def forget(self, key: str) -> None:
        """Job ``key`` is gone (or another was made under its name): its entry goes at the next ``flush``."""
        self.unsaved.discard(key)
        if self.kept is not None and self.kept.pop(key, None) is not None:
            self.dropped.add(key)

    def prune(self, jobs: Mapping[str, Mapping[str, Any]]) -> None:
        """Forget the entries of this controller's jobs that ``jobs`` (a full list) no longer holds."""
        for key, end in list((self.kept or {}).items()):
            if self._mine(key) and ((jobs.get(key) or {}).get("metadata") or {}).get("uid") != end.uid:
                self.forget(key)

    def flush(self) -> None:
        """Take out the entries of jobs that are gone, then write those refused before; a refusal is logged and
        tried again at the next call (apart: taking out is what makes room)."""
        for shard, entries in list(self._stray.items()):
            try:
                self._patch(shard, dict.fromkeys(entries))
                del self._stray[shard]
            except ApiError as error:
                log.warning("cannot take %d unreadable entries out of ConfigMap %s/%s: %s", len(entries),
                            self.namespace, configmap_name(shard), error)
        if self.dropped:
            dropped = set(self.dropped)
            try:
                self._write(dict.fromkeys(entry_key(key) for key in dropped))
                self.dropped -= dropped
            except ApiError as error:
                log.warning("cannot take %d ElasticJobs out of the record (ConfigMaps %s/%s*): %s", len(dropped),
                            self.namespace, CONFIGMAP, error)
        unsaved = {key: entry for key in self.unsaved if (entry := (self.kept or {}).get(key)) is not None}
        if not unsaved:
            self.unsaved.clear()
            return
        try:
            self._write({entry_key(key): encode(entry) for key, entry in unsaved.items()})
        except ApiError as error:
            log.warning("cannot write %d ElasticJobs' entries to the record (ConfigMaps %s/%s*): %s", len(unsaved),
                        self.namespace, CONFIGMAP, error)
            return
        self.unsaved -= set(unsaved)

    @staticmethod
    def _data(found: Mapping[str, Any]) -> Mapping[str, Any]:
        data = found.get("data")
        return data if isinstance(data, Mapping) else {}

    def _make(self, shard: int, ends: Mapping[str, Entry]) -> Mapping[str, Any] | None:
        """Make the record's ConfigMap ``shard`` with ``ends``; None when made, else the data of the one another
        replica made meanwhile (409)."""
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": configmap_name(shard), "namespace": self.namespace,
                             "labels": {"app.kubernetes.io/part-of": "kubecell"}},
                "data": {entry_key(key): encode(end) for key, end in ends.items()}}
        try:
            self.kube.create(f"/api/v1/namespaces/{self.namespace}/configmaps", body)
        except ApiError as error:
            if not error.conflict:
                raise
            return self._data(self.kube.get(self.path(shard)))
        return None

    def _write(self, changes: Mapping[str, str | None]) -> None:
        """Set (a value) or take out (None) entries, each in the ConfigMap that holds its key."""
        by_shard: dict[int, dict[str, str | None]] = {}
        for entry, text in changes.items():
            by_shard.setdefault(shard_of(job_key(entry)), {})[entry] = text
        for shard, part in sorted(by_shard.items()):
            self._patch(shard, part)

    def _patch(self, shard: int, changes: Mapping[str, str | None]) -> None:
        """A merge patch of ConfigMap ``shard``, each entry alone; the ConfigMap made again with every entry kept
        for it where it was deleted."""
        try:
            self.kube.patch(self.path(shard), {"data": dict(changes)})
        except ApiError as error:
            if not error.not_found:
                raise
            ends = {key: end for key, end in (self.kept or {}).items()
                    if shard_of(key) == shard and entry_key(key) not in changes}
            ends.update({job_key(entry): end for entry, text in changes.items()
                         if text is not None and (end := decode(text)) is not None})
            if self._make(shard, ends) is not None:  # made meanwhile: the patch now finds it
                self.kube.patch(self.path(shard), {"data": dict(changes)})
