"""The ElasticJob object as the scheduler's sizer reads and writes it: its ``/scale`` target and the fields it
keeps in the job's status (``status.gpuModel``, ``status.goodputModel``, its own two conditions), always on the
job its pods name, checked by uid (and written only as that GET read it: ``_patch_as_read``); and its holds, kept
in a ConfigMap of the scheduler's own namespace (``kube.kept_holds``), never in a job's status, and let go when
their job is gone.

Why apart from ``scheduler.elastic``: what the sizer decides and how it keeps it in the API server change for
different reasons (a status field, a retry policy), and every read here treats the object as input a user may
have replaced (deleted and made again under the same name: another uid, not this job).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from kubecell.core.errors import InvalidInputError
from kubecell.kube import elasticjobs
from kubecell.kube.clock import rfc3339
from kubecell.kube.elasticjobs import ElasticRef
from kubecell.kube.kept_holds import HoldStore, KeptHold, entry_key
from kubecell.kube.rest import ApiError
from kubecell.scheduler.elastic_conditions import Said, merged
from kubecell.scheduler.elastic_holds import Hold, Holds
from kubecell.scheduler.elastic_sized import Sized
from kubecell.scheduler.elastic_tell import SizerTelling

log = logging.getLogger("kubecell.scheduler.elastic")

SAY_RETRY_SECONDS = 60.0
"""How long after a refused condition write the job's conditions are tried again."""


class SizerStatus(SizerTelling):
    """The sizer's reads, ``/scale`` and status writes of ElasticJobs, and its kept holds (a base of
    ``ElasticSizer``, which sets ``jobs``, ``holds``, ``hold_store`` and ``pending_grace_seconds``)."""

    jobs: dict[ElasticRef, Sized]
    holds: Holds
    hold_store: HoldStore
    pending_grace_seconds: float
    report_max_age_seconds: float
    holds_checked: dict[ElasticRef, float]
    """Per held job, since when it is held, or when its ElasticJob was last found to exist
    (``_let_go_of_deleted``)."""
    moves_unformed: dict[ElasticRef, float]
    """Per moved job with no gang (its old workers ended, its replacements not formed), since when
    (``_end_unformed_moves``)."""

    def _keep_hold(self, ref: ElasticRef, hold: Hold | None) -> None:
        """Keep a hold made (or ended: None) where a restarted scheduler reads it (``kube.kept_holds``). The
        ConfigMap keeps one hold per job name: where a job made again under the name of one whose hold ends is
        held itself, its hold is kept instead of the end (else the end of the old job's hold would take out the
        new job's)."""
        if hold is None:
            key = entry_key(ref)
            namesake = next((other for other in self.holds.held if entry_key(other) == key and other != ref), None)
            if namesake is not None:
                ref, hold = namesake, self.holds.held[namesake]
        self.hold_store.keep(ref, None if hold is None else KeptHold(ref, hold.kind, hold.model, hold.target,
                                                                     hold.member_gpus, hold.until))

    def _restore_holds(self, now: float) -> bool:
        """Take on the holds a previous scheduler kept (False: the API did not answer; asked again at the next
        pass), each for no longer than the longest hold the sizer makes (a move's: its workers' grace, at most
        a day, and the pods' grace). A refusal (RBAC without ``deploy/base/rbac.yaml``'s rule) is told once:
        the sizer then holds what it gives from now on, as before holds were kept."""
        try:
            kept = self.hold_store.restore(now)
        except ApiError as error:
            log.warning("cannot read the holds a previous scheduler kept%s: %s",
                        " (asked again at the next pass)" if error.unavailable else "", error)
            return not error.unavailable
        longest = elasticjobs.MAX_GRACE_SECONDS + self.pending_grace_seconds
        taken, gone = 0, []
        for hold in kept:
            if self._exists(hold.ref) is False:  # deleted while no scheduler held for it
                gone.append(hold.ref)
                continue
            self.holds.restore(hold.ref, hold.kind, hold.gpu_model, target=hold.replicas,
                               member_gpus=hold.member_gpus, until=min(hold.until, now + longest), now=now)
            taken += 1
        for ref in gone:
            self.hold_store.keep(ref, None)
        if kept:
            log.info("took on %d holds a previous scheduler kept (%d of deleted jobs let go)", taken, len(gone))
        return True

    def _let_go_of_deleted(self, now: float) -> None:
        """Let go of the holds of ElasticJobs deleted (or made again under their name: another uid) while held.

        A hold ends when its job runs what it was given, or when its time is up; a move's time is its workers'
        grace period, which the job's template states (up to a day), and the pods' grace. A job deleted during
        its move runs nothing again, so its hold kept the GPUs it was given from every other job's growth on
        that model, in every VC, for as long as its template said. Each hold that has lasted
        ``pending_grace_seconds`` (a raise's pods are made and bound by then) has its job looked up once per
        that time: one GET per long hold, and none while the API cannot say (the hold stays)."""
        checked: dict[ElasticRef, float] = {}
        for ref in list(self.holds.held):
            since = self.holds_checked.get(ref, now)
            if now - since < self.pending_grace_seconds:
                checked[ref] = since
            elif self._exists(ref) is False:
                log.info("ElasticJob %s/%s (uid %s) is gone: what it was given is held no more", ref.namespace,
                         ref.name, ref.uid)
                self.holds.release(ref)
            else:
                checked[ref] = now
        self.holds_checked = checked

    def _end_unformed_moves(self, live: set[ElasticRef], now: float) -> None:
        """A move is held for its workers' grace period (the job's template states it, up to a day) and the
        pods': its old workers end first, then their replacements are made and form its gang on the new model.
        Where the replacements are never made (a quota that refuses them, an admission webhook), the GPUs the
        move was given stayed held from every other job's growth, in every VC, for the rest of that grace period
        after the old workers had ended. Now a moved job that has no gang at all (``live``: its old one ended,
        no new one formed) keeps its hold for the pods' grace from when it was first seen so, no longer."""
        unformed: dict[ElasticRef, float] = {}
        for ref, hold in list(self.holds.held.items()):
            if hold.kind != "move" or ref in live:
                continue
            since = unformed[ref] = self.moves_unformed.get(ref, now)
            self.holds.shorten(ref, since + self.pending_grace_seconds)
        self.moves_unformed = unformed

    def _exists(self, ref: ElasticRef) -> bool | None:
        """Whether the ElasticJob is there (its uid checked) and not being deleted (its namespace, say); None
        where the API cannot say."""
        try:
            current = self._own(ref)
        except ApiError as error:
            return False if error.not_found else None
        return current is not None and not (current.get("metadata") or {}).get("deletionTimestamp")

    def _read_pin(self, ref: ElasticRef) -> str | None:
        """The model ``status.gpuModel`` keeps, from the job the pods name (its uid checked), or None."""
        try:
            current = self._own(ref)
        except ApiError as error:
            if not error.not_found:
                log.warning("cannot read the GPU model of ElasticJob %s/%s: %s", ref.namespace, ref.name, error)
            return None
        return elasticjobs.kept_gpu_model(current) if current is not None else None

    def _read_model(self, ref: ElasticRef) -> Any:
        """What ``status.goodputModel`` holds, from the job the pods name (its uid checked), or None; raises
        ``ApiError`` when the API cannot say (a model made without it would overwrite it at its first save)."""
        try:
            current = self._own(ref)
        except ApiError as error:
            if error.not_found:
                return None
            raise
        status = current.get("status") if current is not None else None
        return status.get("goodputModel") if isinstance(status, Mapping) else None

    def _write_pin(self, ref: ElasticRef, model: str) -> bool:
        """Keep the job's model in its ``status.gpuModel``."""
        return self._write_status(ref, {"gpuModel": model}, f"the GPU model {model}")

    def _write_model(self, sized: Sized, value: dict[str, Any]) -> bool:
        """Keep the job's goodput model in its ``status.goodputModel``."""
        return self._write_status(sized.ref, {"goodputModel": value}, "the goodput model")

    # -- the /scale target ------------------------------------------------------------------------------

    def _write(self, sized: Sized, target: int, reason: str) -> bool:
        """Set the job's ``/scale`` target after checking that the job the pods name is the one that exists, on
        that very object (``_patch_as_read``: a job deleted and made again between the GET and the PATCH is not
        resized)."""
        ref = sized.ref
        try:
            try:
                written = self._scale(ref, target)
            except ApiError as error:
                if not error.conflict:
                    raise
                written = self._scale(ref, target)  # changed since the GET (its controller writes the status)
        except (ApiError, InvalidInputError) as error:
            self._refused(sized, f"cannot resize ElasticJob {ref.namespace}/{ref.name} to {target}", error)
            return False
        if written is None:
            return False
        current, before, target = written
        if self.recorder is not None:
            self.recorder.elastic_resizes.labels("grow" if target > before else "shrink").inc()
        log.info("ElasticJob %s/%s: target %d -> %d (%s)", ref.namespace, ref.name, before, target, reason)
        self._event(elasticjobs.involved(current), "Normal", "Resize",
                    f"target {before} -> {target} workers: {reason}")
        return True

    def _scale(self, ref: ElasticRef, target: int) -> tuple[dict[str, Any], int, int] | None:
        """One GET and PATCH of ``_write``: the job as read, its target before and the one written (clamped to
        its ``minReplicas..maxReplicas``), or None where nothing was written (the job of that name is another
        one, or its target is that already); raises ``ApiError``, ``InvalidInputError``."""
        current = self._own(ref)
        if current is None:
            log.warning("ElasticJob %s/%s is not the one its pods name (uid %s): not resized",
                        ref.namespace, ref.name, ref.uid)
            return None
        spec = elasticjobs.read_elastic_job(current)
        target = max(spec.min_replicas, min(target, spec.max_replicas))
        if spec.replicas == target:
            return None
        self._patch_as_read(ref, "scale", current, {"spec": {"replicas": target}})
        return current, spec.replicas, target

    def _write_status(self, ref: ElasticRef, fields: dict[str, Any], what: str) -> bool:
        """A merge patch of ``fields`` alone into the status (the controller's fields are untouched), on the
        job the pods name only, as a GET of it showed it (``_patch_as_read``)."""
        try:
            try:
                return self._status_once(ref, fields)
            except ApiError as error:
                if not error.conflict:
                    raise
                return self._status_once(ref, fields)  # changed since the GET (its controller writes there too)
        except ApiError as error:
            sized = self.jobs.get(ref)
            message = f"cannot keep {what} of ElasticJob {ref.namespace}/{ref.name}"
            if sized is not None:
                self._refused(sized, message, error)
            else:
                log.warning("%s: %s", message, error)
            return False

    def _say_conditions(self, sized: Sized, running_since: float | None, now: float) -> None:
        """Keep the job's ``MaxReplicasReachable`` and ``StepReports`` conditions as the sizer last found them
        (``elastic_conditions``); a job whose workers run on several GPU models has its reports unread
        (``MixedGpuModels``), so nothing is said of them."""
        saying = [sized.reach] if sized.reach is not None else []
        if ("", "MixedGpuModels") not in sized.told:
            if sized.model_kept is not None:
                sized.reports.taken = True  # an earlier scheduler's model, taken up: the job is sized on goodput
            said = sized.reports.condition(running_since, now, self.report_max_age_seconds)
            saying += [said] if said is not None else []
        self._say(sized, saying, now)

    def _say(self, sized: Sized, saying: Sequence[Said], now: float) -> None:
        """Keep the sizer's conditions on the job (``elastic_conditions``), those whose status or reason changed
        since this scheduler last wrote or read them: one GET, and one merge patch of the whole list only where
        ``merged`` finds something to write, as that GET showed it (a controller's write in between makes it a
        409, and the next pass reads its conditions again). A refusal is told as any write's is (``_refused``)
        and the job's conditions are tried again ``SAY_RETRY_SECONDS`` later (the sizer passes after every
        cycle: a lasting refusal, RBAC without the status rule, would otherwise cost a GET per job and pass)."""
        changed = [said for said in saying if sized.said.get(said.kind) != said.key]
        if not changed or now < sized.say_after:
            return
        stamp = rfc3339()
        try:
            try:
                self._say_once(sized.ref, changed, stamp)
            except ApiError as error:
                if not error.conflict:
                    raise
                self._say_once(sized.ref, changed, stamp)  # changed since the GET (its controller writes there too)
        except ApiError as error:
            kinds = ", ".join(said.kind for said in changed)
            self._refused(sized, f"cannot keep the condition(s) {kinds} of ElasticJob {sized.ref.namespace}/"
                          f"{sized.ref.name}", error)
            sized.say_after = now + SAY_RETRY_SECONDS
            return
        sized.said.update((said.kind, said.key) for said in changed)

    def _say_once(self, ref: ElasticRef, saying: Sequence[Said], stamp: str) -> None:
        """One GET and, where there is something to write, one PATCH of ``_say`` (nothing on a job made again
        under the name: its uid differs)."""
        current = self._own(ref)
        if current is None:
            return
        status = current.get("status")
        conditions = status.get("conditions") if isinstance(status, Mapping) else None
        write = False
        for said in saying:
            written = merged(conditions, said, stamp)
            if written is not None:
                conditions, write = written, True
        if write:
            self._patch_as_read(ref, "status", current, {"status": {"conditions": conditions}})

    def _status_once(self, ref: ElasticRef, fields: dict[str, Any]) -> bool:
        """One GET and PATCH of ``_write_status``: False where the job of that name is another one."""
        current = self._own(ref)
        if current is None:
            return False
        self._patch_as_read(ref, "status", current, {"status": fields})
        return True

    def _patch_as_read(self, ref: ElasticRef, subresource: str, current: Mapping[str, Any],
                       body: dict[str, Any]) -> None:
        """PATCH the job's ``subresource`` (``scale``, ``status``) with ``body`` only if the object is still the
        one ``current`` (a GET) showed: the patch carries its ``resourceVersion``, so the API server refuses it
        (409 Conflict) where the object changed since, deleted and made again under its name included. Its uid
        in the patch would not do: a custom resource's ``/status`` and ``/scale`` ignore ``metadata.uid`` and
        write to the object of that name, whatever its uid (``tests/scheduler/test_hostile_sizer_testbed.py``).
        Raises ``ApiError``."""
        version = (current.get("metadata") or {}).get("resourceVersion")
        if isinstance(version, str) and version:
            body = {**body, "metadata": {"resourceVersion": version}}
        self.kube.patch(f"{elasticjobs.job_path(ref.namespace, ref.name)}/{subresource}", body)

    def _own(self, ref: ElasticRef) -> dict[str, Any] | None:
        """The ElasticJob the pods name, or None where the object of that name is another one (deleted and
        made again: its uid differs); raises ``ApiError``."""
        current = self._get(ref)
        return current if (current.get("metadata") or {}).get("uid") == ref.uid else None

    def _get(self, ref: ElasticRef) -> dict[str, Any]:
        """The ElasticJob as stored now (raises ``ApiError``)."""
        return self.kube.get(elasticjobs.job_path(ref.namespace, ref.name))
