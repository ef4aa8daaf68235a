"""Which GPU model an ElasticJob runs on: the one its gang is pinned to when it forms, and the moves and starts
the allocator decides (``core.elastic.targets``), carried out in Kubernetes terms.

A data-parallel gang steps at the pace of its slowest GPU, and no goodput model prices a placement across
models, so an ElasticJob whose pods accept several models (a template with ``kubecell.io/gpu-models: A,B``, or
none) runs on one at a time:

* **Pin.** When its gang forms, the intake asks ``pin_model`` for the model its job accepts: the one the sizer
  chose last (``Sized.pin``), else where its minimum is idle and its goodput model prices a GPU highest
  (``targets.start_type``). The engine job accepts that model alone; the pods keep what they accept (a pod
  that replaces a worker joins the gang when it accepts the same, ``jobs.groups_for``).
* **Start.** A gang that waits is a candidate of the allocator with the room each model it accepts has for it
  (``Engine.queries.room_on``); where the allocator starts it elsewhere, the sizer pins that model and has the gang
  formed again (its engine job is withdrawn; its pods form a new one at the next reconcile).
* **Move.** A running job whose reports price another model where at least its minimum is idle now may be
  moved there by the allocator (only when the gain pays for a restart, ``spec.restartSeconds``). The sizer
  pins that model, sets the target to the size the allocator gives it, and evicts every worker (with the
  workers' grace period, to checkpoint). The old job takes no new pod and holds its GPUs until its pods are
  gone; the controller replaces the evicted workers (``WorkerLost``, not counted), and the new pods form a new
  gang on the new model. What the move was given there is held for that gang meanwhile (``elastic_holds``), and
  where a pod the sizer does not place took it anyway, the gang waits and is started where there is room. A
  Normal ``Move`` Event on the ElasticJob gives the allocator's reason; a ``Start`` one says where a waiting
  gang was started instead.

Across a scheduler restart: a restored gang is pinned to the model its members run on. The model chosen for a
job's next gang (a move under way, a waiting gang started elsewhere) is kept in the ElasticJob's
``status.gpuModel``, written when it changes and before a move's evictions; a restarted scheduler reads it when
the job's first gang forms (only a model the gang's pods accept counts: the status is input like any other).
A move's terminating pods are no members of a restored job (``restore``), so their replacements form the next
gang, there.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

import numpy as np

from kubecell.core.book import IntArray
from kubecell.core.elastic.targets import GrowthChoice, start_type
from kubecell.core.engine.job import Job, JobPhase, JobSpec
from kubecell.core.engine.shrink import shrinkable
from kubecell.kube.elasticjobs import DEFAULT_GRACE_SECONDS, ElasticRef
from kubecell.scheduler.elastic_holds import Holds
from kubecell.scheduler.elastic_sized import Sized
from kubecell.scheduler.jobs import Tracked
from kubecell.scheduler.tracking import Tracking

log = logging.getLogger("kubecell.scheduler.elastic")

EvictPod = Callable[[str, str], bool]
"""(pod uid, reason) -> whether an eviction was sent or is under way (``Binder.evict_pod``)."""
Reform = Callable[[Tracking, str], None]
"""(state, job name): withdraw a waiting job so that its pods form it again (``Intake.renew``)."""
ReadPin = Callable[[ElasticRef], str | None]
"""The ElasticJob's ``status.gpuModel`` as stored (None: absent, unreadable, or the job is gone)."""
WritePin = Callable[[ElasticRef, str], bool]
"""Write ``status.gpuModel``; whether it was written."""


class NothingKnown:
    """The goodput estimate of a gang that has not reported: nothing is known anywhere (the allocator then
    offers it its minimum on each model, at a guessed worth)."""

    def goodput(self, gpu_type: str, num_nodes: int, num_replicas: int) -> float:
        return 0.0


NOTHING_KNOWN = NothingKnown()


class GpuTypes:
    """Pins, starts and moves of ElasticJobs' gangs between GPU models (see the module)."""

    def __init__(self, sized_of: Callable[[ElasticRef], Sized], event: Callable[[ElasticRef, str, str], None],
                 write_target: Callable[[Sized, int, str], bool], holds: Holds,
                 pending_grace_seconds: float) -> None:
        self.sized_of = sized_of
        self.holds = holds
        """What starts and moves were given and do not run yet (``elastic_holds``): no other job is offered it."""
        self.pending_grace_seconds = pending_grace_seconds
        """How long a start's or a move's pods may wait to be bound (the sizer's)."""
        self.event = event
        """(the ElasticJob, reason, message): a Normal Event on it."""
        self.write_target = write_target
        self.read_pin: ReadPin | None = None
        """Set by the sizer: the model an earlier scheduler pinned the job to (None: not kept)."""
        self.write_pin: WritePin | None = None
        """Set by the sizer: keep the pin in the job's status (None: kept in memory only)."""
        self.on_move: Callable[[], None] | None = None
        """Told of every move carried out (the scheduler's metrics count them)."""
        self.on_start: Callable[[str], None] | None = None
        """Told of every waiting gang started on another model: ``move`` where a move sent it to the model it
        waited on and it never ran there (the GPUs the move counted on were taken), else ``wait``."""
        self.evict_pod: EvictPod | None = None
        """Set by the scheduler (the binder's eviction); None: moves are not carried out."""
        self.reform: Reform | None = None
        """Set by the scheduler (the intake's renew); None: waiting gangs are not started elsewhere."""

    # -- which models ---------------------------------------------------------------------------------------

    @staticmethod
    def nodes_of(state: Tracking, spec: JobSpec) -> IntArray:
        """The book's indices of the GPU nodes the gang may use (``JobSpec.nodes``: its pods' constraints); one
        vectorised pass over the nodes for a gang without constraints, its own nodes otherwise."""
        book = state.engine.book
        if spec.nodes is None:
            return np.flatnonzero(book.gpu_count > 0)
        known = sorted(book.index[name] for name in spec.nodes if name in book.index)
        indices = np.array(known, dtype=np.int64)
        return indices[book.gpu_count[indices] > 0]

    def accepted(self, state: Tracking, spec: JobSpec, models: frozenset[str] | None) -> list[str]:
        """The GPU models of the nodes a gang of whole-GPU members that accept ``models`` (None: any) may use;
        empty for a gang that cannot be pinned (groups of several shapes, shares, CPU members)."""
        member = spec.member
        if spec.heterogeneous or not member.wants_gpu or not member.is_whole:
            return []
        book = state.engine.book
        present = sorted(book.model_names[i] for i in np.unique(book.model_id[self.nodes_of(state, spec)]))
        return [model for model in present if models is None or model in models]

    def pin_model(self, state: Tracking, ref: ElasticRef, spec: JobSpec) -> str | None:
        """The model a forming gang of ElasticJob ``ref`` runs on (``Intake.pin``), or None where its pods accept
        one model or cannot be pinned."""
        models = self.accepted(state, spec, spec.member.gpu_models)
        if len(models) < 2:
            return None
        sized = self.sized_of(ref)
        if not sized.pin_read and self.read_pin is not None:
            sized.pin_read = True  # first gang of this scheduler's life: an earlier one may have chosen
            sized.pin_kept = self.read_pin(ref)
            if sized.pin is None and sized.pin_kept in models:
                sized.pin = sized.pin_kept
                log.info("ElasticJob %s/%s: its gang runs on %s, as kept in its status", ref.namespace, ref.name,
                         sized.pin)
        if sized.pin in models:
            return sized.pin
        book = state.engine.book
        nodes = self.nodes_of(state, spec)
        members = np.bincount(book.model_id[nodes], weights=book.full_count[nodes] // max(spec.member.gpu_count, 1),
                              minlength=len(book.model_names))
        idle = {name: int(members[i]) for i, name in enumerate(book.model_names)}
        above: Counter[str] = Counter()
        for name, tracked in state.tracked.items():
            job = state.engine.jobs.get(name)
            if tracked.pinned is not None and job is not None and job.phase == JobPhase.RUNNING:
                above[tracked.pinned] += len(shrinkable(job))
        model = sized.estimate()  # one worker's goodput per model: its processes together
        price = {m: model.goodput(m, 1, 1) if model is not None else 0.0 for m in models}
        sized.pin = start_type(models, idle, above, price, spec.minimum)
        log.info("ElasticJob %s/%s: its gang runs on %s", ref.namespace, ref.name, sized.pin)
        self.keep_pin(sized)
        return sized.pin

    def keep_pin(self, sized: Sized) -> None:
        """Write a changed pin into the job's ``status.gpuModel`` (one PATCH per change, on the scheduling
        thread, before the evictions of a move are sent): a restarted scheduler reads it back in ``pin_model``
        instead of choosing afresh. A failed write costs only that: the pin is still used in memory."""
        if sized.pin is None or sized.pin == sized.pin_kept or self.write_pin is None:
            return
        if self.write_pin(sized.ref, sized.pin):
            sized.pin_kept = sized.pin

    def rooms(self, state: Tracking, job: Job, tracked: Tracked, now: float) -> dict[str, int]:
        """Per model the gang of ``job`` may use, the members it could run with there if it started there now
        (``Engine.queries.room_on``, less what other jobs' holds keep there); empty where it is not pinned (its pods
        accept one model)."""
        if tracked.pinned is None:
            return {}
        models = self.accepted(state, job.spec, tracked.models)
        own = tracked.pinned if job.phase == JobPhase.RUNNING else None
        gpus = job.spec.member.gpu_count
        room_on = state.engine.queries.room_on
        return {m: max(room_on(job.name, m, now) - self.holds.members(m, gpus, tracked.elastic, now), 0)
                for m in models if m != own}

    # -- carrying out what the allocator chose -------------------------------------------------------------

    def carry_out(self, state: Tracking, sized: Sized, job: Job, choice: GrowthChoice, now: float) -> None:
        """Start a waiting gang on, or move a running job to, ``choice.gpu_type`` at ``choice.target`` members."""
        model = choice.gpu_type
        tracked = state.tracked.get(job.name)
        if model is None or tracked is None:
            return
        ref = sized.ref
        if job.phase == JobPhase.PENDING:
            # A waiting gang starts with the pods it has, as many as fit (at least its minimum): its target is
            # only ever raised here, to start it larger where the allocator sizes it so.
            if choice.target > tracked.live_pods():
                self.write_target(sized, choice.target, choice.reason)
            after = "move" if self.holds.kind(ref, tracked.pinned) == "move" else "wait"
            kind = "move" if self.holds.kind(ref, model) == "move" else "start"  # still waiting where a move sent it
            self.holds.hold(ref, kind, model, target=choice.target, runs=0,
                            member_gpus=job.spec.member.gpu_count, until=now + self.pending_grace_seconds, now=now)
            if model != tracked.pinned and self.reform is not None:
                if self.on_start is not None:
                    self.on_start(after)
                # Where it waited may be where a move sent it, whose idle GPUs were taken before its new gang
                # formed: say why it runs elsewhere than the Move Event said.
                self.event(ref, "Start", f"waiting on {tracked.pinned}, started on {model}: {choice.reason}")
                sized.pin = model
                self.keep_pin(sized)
                self.reform(state, job.name)  # its pods form the gang again, on the new model
                log.info("ElasticJob %s/%s: starts on %s (%s)", ref.namespace, ref.name, model, choice.reason)
            return
        if job.phase != JobPhase.RUNNING or tracked.moving or self.evict_pod is None:
            return
        sized.pin, sized.moved_at = model, now
        self.keep_pin(sized)  # before the evictions: a scheduler restarted meanwhile forms the next gang there
        grace = DEFAULT_GRACE_SECONDS if sized.grace_seconds is None else sized.grace_seconds
        self.holds.hold(ref, "move", model, target=choice.target, runs=0, member_gpus=job.spec.member.gpu_count,
                        until=now + grace + self.pending_grace_seconds, now=now)  # its workers end first
        sized.served += job.size * max(now - (job.started_at if job.started_at is not None else now), 0.0)
        tracked.moving = True
        state.engine.limit_growth(job.name, (0,))
        self.write_target(sized, choice.target, choice.reason)
        reason = f"moved by kubecell to {model}: {choice.reason}"
        evicted = sum(1 for uid in list(tracked.members.values()) if self.evict_pod(uid, reason))
        self.event(ref, "Move", f"{tracked.pinned} -> {model}, {job.size} -> {choice.target} workers: "
                                f"{choice.reason}; its {evicted} workers restart there")
        if self.on_move is not None:
            self.on_move()
        log.info("ElasticJob %s/%s: moving %s -> %s (%s)", ref.namespace, ref.name, tracked.pinned, model,
                 choice.reason)
