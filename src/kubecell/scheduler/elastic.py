"""The scheduler sizes ElasticJobs: it writes their ``/scale`` target, and their controller follows.

An ElasticJob's workers are one elastic gang (``kubecell.io/group-max``): the engine job's headcount is the
job's maximum, but it binds only the pods the controller made (``Engine.limit_growth``). Who decides how
many pods there should be is this module, after each engine cycle:

* **Shrink.** When the engine shrank the gang (a claim on its capacity: a guaranteed job of another VC, a
  higher priority), the target becomes the members it kept, so the controller does not recreate the
  workers the shrink evicted (they would only wait for capacity that is gone).
* **Grow.** When the engine says more members would fit now (``Engine.queries.headroom``: guarantee room, borrow
  limit, cells, topology, the resize interval), the jobs that have a goodput model are sized together by the
  allocator the simulator measures (``core.elastic.targets``: how far each grows, and whose growth is worth
  more when several want the same GPUs); a job that has not reported yet takes the room. The target is
  raised; the controller creates the pods, they join the running gang (``Intake``) and the engine grows into
  them in its next cycle. Where the idle GPUs do not cover that growth, a job of the VC that has not reported
  gives what it grew first, then one the allocator sizes down (the most-served first); the growing job waits.
* **Hold what was given.** A raise, a start or a move is carried out later than it is decided (pods to make
  and bind; a move's workers to end first), and meanwhile the engine sees those GPUs idle: they are held
  (``elastic_holds``) until the job runs there, so no other job is sized into them, in this pass or the next.
* **Give pods back.** When the job's pods wait to be bound for more than ``pending_grace_seconds`` (the
  capacity a raise counted on was taken meanwhile by a pod the sizer does not place, or a replaced worker
  finds none), the target is lowered to the members it runs; growth raises it again when capacity frees.

The goodput model is fed from the step reports the workers write on their own pods
(``kubecell.io/step-report``, ``kube.step_reports``). A report is untrusted input: one that cannot be read
or that the model refuses gets one Warning Event per pod and kind of problem, and is ignored.

A write goes to the ElasticJob the pod's controller owner reference names, and only after a GET shows that
job exists with that uid, with the resourceVersion that GET read (``SizerStatus._patch_as_read``): a pod cannot
make the scheduler resize someone else's job (nor a job of another namespace: owner references are namespaced),
nor a job made again under its job's name meanwhile. Errors are logged and the decision is taken again next time;
nothing here stops the cycle.

Its API calls are made on the scheduling thread, not through the binder's pool: a shrink's target must be
lowered before the evictions are sent (the pool keeps no order between writes), and the other calls are rare:
one GET and one PATCH per resize (at most one per job per resize interval, or per give-back), two GETs per
job when its model is made (the batch range, and the model its status keeps), and one GET and one PATCH when
the model is kept there (when it learned a new placement shape, else at most every 5 minutes); each write once
more where it met a conflict, and one GET per pods' grace for a job held that long (is it still there?). Reading
reports and asking for headroom make no call.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

from kubecell.core.elastic.allocator import KubecellElasticPolicy
from kubecell.core.elastic.targets import (
    GrowthCandidate,
    engine_candidate,
    plan_targets,
    take_the_room,
)
from kubecell.core.elastic.types import StepReport
from kubecell.core.engine.job import Job, JobPhase
from kubecell.core.errors import InvalidInputError
from kubecell.kube import elasticjobs
from kubecell.kube.elasticjobs import ElasticRef
from kubecell.kube.kept_holds import HoldStore
from kubecell.kube.names import ANNOTATION_STEP_REPORT
from kubecell.kube.rest import ApiError, Kube
from kubecell.kube.step_reports import REASON_UNTRUSTED, ReportProblem, read_step_report
from kubecell.scheduler.cluster import Mirror
from kubecell.scheduler.elastic_conditions import reach
from kubecell.scheduler.elastic_holds import Holds
from kubecell.scheduler.elastic_model import ModelKeeper
from kubecell.scheduler.elastic_sized import Sized
from kubecell.scheduler.elastic_status import SizerStatus
from kubecell.scheduler.elastic_tell import job_involved
from kubecell.scheduler.elastic_types import NOTHING_KNOWN, GpuTypes
from kubecell.scheduler.jobs import Tracked
from kubecell.scheduler.observe.recorder import Recorder
from kubecell.scheduler.tracking import Tracking

log = logging.getLogger("kubecell.scheduler.elastic")

CPU_ONLY = "cpu"
"""The goodput model's "GPU type" for members without GPUs (CPU training, the testbed's torchrun jobs)."""


class ElasticSizer(SizerStatus):
    """Moves ElasticJobs' targets after each engine cycle (see the module)."""

    def __init__(self, kube: Kube, component: str, *, restart_seconds: float = 30.0,
                 pending_grace_seconds: float = 120.0, report_max_age_seconds: float = 600.0,
                 headroom_refresh_seconds: float = 30.0, forget_seconds: float = 600.0,
                 holds_namespace: str = "kubecell-system") -> None:
        self.kube = kube
        self.hold_store = HoldStore(kube, holds_namespace)
        """Where the holds are kept for a restarted scheduler: a ConfigMap in the scheduler's own namespace."""
        self.component = component
        self.policies: dict[str, KubecellElasticPolicy] = {}
        """The simulator's allocator, one per VC (each keeps restart counts and prices between passes)."""
        self.restart_seconds = restart_seconds
        """What a resize costs a job whose ElasticJob states no ``restartSeconds``: every worker restarts and
        reloads its checkpoint (torchrun's rendezvous plus a checkpoint load; Sia measures 25-250 s per restart
        on its models)."""
        self.pending_grace_seconds = pending_grace_seconds
        self.report_max_age_seconds = report_max_age_seconds
        self.headroom_refresh_seconds = headroom_refresh_seconds
        """How long a job's headroom is reused while no allocation in the cluster and nothing of the job has
        changed: the sizer runs after every cycle and on idle passes, and ``Engine.queries.headroom`` walks every node
        in the job's scope; what can still change it without a change of the book (a resize interval that
        ends, a VC reconfigured) is picked up at the next refresh."""
        self.forget_seconds = forget_seconds
        """How long what the sizer knows of an ElasticJob (its goodput model, its pin) outlives the last job
        formed of its pods: a moved job's workers end before their replacements form its next gang, and a
        job whose pods are all replaced at once (a counted restart) keeps what it learned."""
        self.jobs: dict[ElasticRef, Sized] = {}
        """What the sizer keeps per ElasticJob, by the whole reference its pods give (namespace, name, uid): a pod
        naming another namespace's job's uid under its own namespace is another key, never that job's state."""
        self.recorder: Recorder | None = None
        """Where resizes, moves and step reports are counted (the scheduler's metrics; None: not counted)."""
        self.holds = Holds(keep=lambda ref, hold: self._keep_hold(ref, hold))
        """What raises, starts and moves were given and do not run yet: no other job is offered it."""
        self.holds_checked = {}
        self.moves_unformed = {}
        self.types = GpuTypes(self._sized, lambda ref, reason, message: self._event(
            job_involved(ref), "Normal", reason, message), self._write, self.holds, pending_grace_seconds)
        """Which GPU model each ElasticJob's gang runs on: pins, starts and moves (``elastic_types``)."""
        self.types.on_move, self.types.on_start = self._count_move, self._count_start
        self.types.read_pin, self.types.write_pin = self._read_pin, self._write_pin
        self.models = ModelKeeper(self._read_model, self._write_model, lambda ref, problem: self._event(
            job_involved(ref), "Warning", "GoodputModelDropped",
            f"the goodput model kept in status.goodputModel is not used ({problem[:300]}): kubecell learns it "
            "again from the workers' step reports"))
        """Each job's goodput model, kept in its status across restarts of the scheduler (``elastic_model``)."""
        self._planned: tuple[tuple[str, int, int, int, tuple[tuple[str, int], ...]], ...] = ()
        self._planned_at = float("-inf")
        self.holds_restored = False
        """Whether the holds a previous scheduler kept (``kube.kept_holds``) were taken on (``grow``)."""

    def shrunk(self, state: Tracking, shrunk: Sequence[Job]) -> None:
        """Lower the targets of the elastic jobs the engine just shrank, before their pods are evicted (so
        their controller does not replace the pods the shrink takes)."""
        for job in shrunk:
            tracked = state.tracked.get(job.name)
            if tracked is not None and tracked.elastic is not None and job.phase == JobPhase.RUNNING:
                sized = self._sized(tracked.elastic, state, job)
                sized.raised_to, sized.waiting_since = None, None
                self.holds.release(tracked.elastic)
                self._write(sized, job.size, f"shrunk by kubecell to the {job.size} members it keeps"
                            + (f" ({job.resizes[-1]})" if job.resizes else ""))

    def grow(self, state: Tracking, mirror: Mirror, now: float) -> None:
        """Feed every running elastic job's model its new reports and raise the targets worth raising."""
        engine = state.engine
        live: set[ElasticRef] = set()
        candidates: dict[str, tuple[Sized, Job, GrowthCandidate]] = {}
        fed: dict[str, tuple[str | None, int]] = {}
        if not self.holds_restored and self._restore_holds(now):  # before any job is sized: none is offered them
            self.holds_restored = True
            self._runs_now(state)
        self.holds.expire(now)
        self._let_go_of_deleted(now)
        for name, tracked in list(state.tracked.items()):
            if tracked.elastic is None:
                continue
            live.add(tracked.elastic)
            job = engine.jobs.get(name)
            if job is not None and job.phase == JobPhase.PENDING and tracked.pinned is not None:
                waiting = self._waiting(state, job, tracked, tracked.elastic, now)
                if waiting is not None:
                    candidates[name] = waiting
                continue
            if job is None or job.phase != JobPhase.RUNNING or tracked.moving:
                log.debug("%s: %s", name, job.phase if job is not None else "gone")
                continue
            try:
                candidate = self._consider(state, mirror, job, tracked.elastic, now, fed)
            except (InvalidInputError, ValueError, KeyError, ArithmeticError) as error:  # one job's bad input costs
                log.warning("cannot size %s: %s", name, error)  # that job
                continue
            if candidate is not None:
                candidates[name] = candidate
        self._end_unformed_moves(live, now)
        for ref, sized in list(self.jobs.items()):
            if ref in live:
                sized.seen_at = now
            elif now - sized.seen_at > self.forget_seconds:
                del self.jobs[ref]  # (kept a while: a moved job's pods form its next gang after the old ones end)
        if candidates and self.holds.made_since(now):
            candidates = self._again(state, candidates, fed, now)
        if candidates:
            self._plan(state, candidates, now)

    def _runs_now(self, state: Tracking) -> None:
        """Count what each held job runs now against its hold: a hold kept before a restart was kept with
        nothing run, and the job may have run it since."""
        for name, tracked in state.tracked.items():
            job = state.engine.jobs.get(name)
            if tracked.elastic in self.holds.held and job is not None and job.phase == JobPhase.RUNNING:
                types, _ = _placement(state, name)
                if len(types) == 1:
                    self.holds.runs(tracked.elastic, next(iter(types)), job.size)

    def _again(self, state: Tracking, candidates: Mapping[str, tuple[Sized, Job, GrowthCandidate]],
               fed: Mapping[str, tuple[str | None, int]], now: float) -> dict[str, tuple[Sized, Job, GrowthCandidate]]:
        """The candidates with their room asked again: a job of this pass was raised after some of them were
        asked, and what it was given is not theirs to be sized into."""
        again: dict[str, tuple[Sized, Job, GrowthCandidate]] = {}
        for name, (sized, job, _) in candidates.items():
            tracked = state.tracked[name]
            if job.phase == JobPhase.PENDING:
                found = self._waiting(state, job, tracked, sized.ref, now)
                if found is not None:
                    again[name] = found
                continue
            gpu_type, nodes = fed[name]
            decided = self.decide(state, job, sized, gpu_type, nodes, now)
            if isinstance(decided, GrowthCandidate):
                again[name] = sized, job, decided
        return again

    def _plan(self, state: Tracking, candidates: Mapping[str, tuple[Sized, Job, GrowthCandidate]],
              now: float) -> None:
        """Size the jobs that have a goodput model (and the waiting gangs that may start on several models)
        together: raise the targets the allocator grows, lower those whose members it gives to other jobs of
        their VC (their controllers delete the newest workers; the engine then grows the others into the
        capacity freed), move jobs to the model the allocator puts them on and start waiting gangs where it
        chooses (``elastic_types``). The allocator runs again only when a candidate's size, room or what it may
        give changed, or ``headroom_refresh_seconds`` passed (attained service and the allocator's locks move
        with time alone)."""
        key = tuple(sorted((name, len(c.nodes), c.room, c.shrinkable, tuple(sorted(c.rooms.items())))
                           for name, (_, _, c) in candidates.items()))
        if key == self._planned and now - self._planned_at < self.headroom_refresh_seconds:
            return
        self._planned, self._planned_at = key, now
        try:
            choices = plan_targets(self.policies, now, [candidate for _, _, candidate in candidates.values()])
        except (InvalidInputError, ValueError, ArithmeticError) as error:  # a model that answers
            log.warning("cannot size elastic jobs: %s", error)  # nonsense: nobody grows this pass
            return
        # Those that give first: the ones that grow wait for their workers to end (their grace period).
        ending: dict[tuple[str, str], float] = {}
        lowered = [name for name, (_, job, _) in candidates.items() if name in choices
                   and choices[name].target < job.size and choices[name].gpu_type is None]
        for name in lowered + [name for name in candidates if name in choices and name not in lowered]:
            sized, job, candidate = candidates[name]
            choice = choices[name]
            sized.last_reason = choice.reason
            if choice.gpu_type is not None:
                self.types.carry_out(state, sized, job, choice, now)
                continue
            if choice.target == job.size or not self._write(sized, choice.target, choice.reason):
                continue
            group = (candidate.vc, candidate.gpu_type)
            if choice.target < job.size:
                self.holds.release(sized.ref)
                grace = elasticjobs.DEFAULT_GRACE_SECONDS if sized.grace_seconds is None else sized.grace_seconds
                ending[group] = max(ending.get(group, 0.0), float(grace))
                sized.lowered_to, sized.lowered_until = choice.target, now + grace + self.pending_grace_seconds
            else:
                sized.raised_to, sized.raised_at = choice.target, now
                if group in ending:
                    sized.patient_until = now + ending[group] + self.pending_grace_seconds
                self.holds.hold(sized.ref, "raise", candidate.gpu_type, target=choice.target, runs=job.size,
                                member_gpus=job.spec.member.gpu_count,
                                until=max(now + self.pending_grace_seconds, sized.patient_until), now=now)

    def explain(self, ref: ElasticRef) -> str:
        sized = self.jobs.get(ref)
        return sized.last_reason if sized is not None else ""

    # -- one job ----------------------------------------------------------------------------------------

    def _waiting(self, state: Tracking, job: Job, tracked: Tracked, ref: ElasticRef,
                 now: float) -> tuple[Sized, Job, GrowthCandidate] | None:
        """A waiting gang that may run on several models, as the allocator sees it (None: no model has room
        for its minimum, even counting what others may give: the engine's queue decides)."""
        sized = self._sized(ref, state, job)
        rooms = self.types.rooms(state, job, tracked, now)
        if not rooms:
            return None
        restart = self.restart_seconds if sized.restart_seconds is None else float(sized.restart_seconds)
        candidate = engine_candidate(state.engine, job, "", 0, sized.estimate() or NOTHING_KNOWN, restart, now,
                                     rooms=rooms, attained=sized.served)
        return sized, job, candidate

    def _sized(self, ref: ElasticRef, state: Tracking | None = None, job: Job | None = None) -> Sized:
        sized = self.jobs.get(ref)
        if sized is None:
            sized = self.jobs[ref] = Sized(ref)
        if not sized.checked and state is not None and job is not None:
            sized.checked = True
            sized.reach = reach(job.spec.members, state.engine.queries.could_ever_run_all(job.name))
            if not sized.reach.true:
                self._event(job_involved(ref), "Warning", sized.reach.reason, sized.reach.message)
        return sized

    def _consider(self, state: Tracking, mirror: Mirror, job: Job, ref: ElasticRef, now: float,
                  fed: dict[str, tuple[str | None, int]]) -> tuple[Sized, Job, GrowthCandidate] | None:
        """Write what one job's own state decides (give pods back, take the room before any report); a job
        with a goodput model is returned to be sized with the others (``fed``: its GPU type and nodes)."""
        sized = self._sized(ref, state, job)
        gpu_type, nodes = fed[job.name] = self._feed(state, mirror, job, sized, now)
        self._say_conditions(sized, job.started_at, now)
        self.holds.runs(ref, gpu_type, job.size)
        decided = self.decide(state, job, sized, gpu_type, nodes, now)
        if isinstance(decided, GrowthCandidate):
            return sized, job, decided
        if decided is not None and self._write(sized, *decided) and decided[0] > job.size:
            sized.raised_to, sized.raised_at = decided[0], now
            if gpu_type is not None:
                self.holds.hold(ref, "raise", gpu_type, target=decided[0], runs=job.size,
                                member_gpus=job.spec.member.gpu_count, until=now + self.pending_grace_seconds,
                                now=now)
        return None

    def decide(self, state: Tracking, job: Job, sized: Sized, gpu_type: str | None, nodes: int,
               now: float) -> tuple[int, str] | GrowthCandidate | None:
        """The target to write for running elastic job ``job`` now and why, None to leave it, or the job as a
        candidate for the allocator (it has a goodput model; or none, no room, and members it may give)."""
        size = job.size
        if state.tracked[job.name].live_pods() > size:  # pods wait to be bound: the engine grows into them first
            if sized.waiting_since is None:
                sized.waiting_since = now
            if now - sized.waiting_since <= self.pending_grace_seconds or now <= sized.patient_until:
                return None
            sized.waiting_since, sized.raised_to = None, None
            self.holds.release(sized.ref)
            return size, (f"its pods waited {self.pending_grace_seconds:g} s for capacity that was taken: back to "
                          f"the {size} members it runs")
        sized.waiting_since = None
        if sized.raised_to is not None and sized.raised_to > size and \
                now - sized.raised_at <= self.pending_grace_seconds:
            return None  # raised: its controller has not made the pods yet
        if sized.lowered_to is not None:
            if size > sized.lowered_to and now <= sized.lowered_until:
                return None  # lowered to give members: its workers are ending, and it is not sized again meanwhile
            sized.lowered_to = None
        room = self._headroom(state, job, sized, now)
        if gpu_type is not None:  # what other jobs were given there and do not run yet is not its room
            room = max(room - self.holds.members(gpu_type, job.spec.member.gpu_count, sized.ref, now), 0)
        most = min(job.spec.members, size + room)
        model = sized.estimate()  # in workers, as the engine counts them
        if gpu_type is None or model is None or not _positive(model.goodput(gpu_type, max(nodes, 1), size)):
            if most > size:
                choice = take_the_room(size, most)
                sized.last_reason = choice.reason
                return choice.target, choice.reason
            if gpu_type is None:
                return None
            model = None  # no room: it may only give what it grew, first, to teammates (core.elastic.targets)
        # with or without room: it may grow with what other jobs of its VC give up, be the one that gives, or
        # move to another model its pods accept
        restart = self.restart_seconds if sized.restart_seconds is None else float(sized.restart_seconds)
        started, tracked = (job.started_at if job.started_at is not None else now), state.tracked[job.name]
        candidate = engine_candidate(state.engine, job, gpu_type, room, model or NOTHING_KNOWN, restart, now,
                                     rooms=None if model is None else self.types.rooms(state, job, tracked, now),
                                     attained=sized.served + size * max(now - started, 0.0), priced=model is not None)
        if sized.moved_at is not None and (candidate.last_resize is None or candidate.last_resize < sized.moved_at):
            candidate = replace(candidate, last_resize=sized.moved_at)  # a move is its last change
        return candidate

    def _headroom(self, state: Tracking, job: Job, sized: Sized, now: float) -> int:
        """``Engine.queries.headroom``, computed again only when the cluster's allocations or the job changed, or
        ``headroom_refresh_seconds`` passed."""
        key = (state.engine.book.clock, job.size, job.resized_at)
        if key != sized.room_key or now - sized.room_at >= self.headroom_refresh_seconds:
            sized.room, sized.room_key, sized.room_at = state.engine.queries.headroom(job.name, now), key, now
        return sized.room

    def _feed(self, state: Tracking, mirror: Mirror, job: Job, sized: Sized, now: float) -> tuple[str | None, int]:
        """Give the job's model the reports its members' pods wrote since the last cycle; the GPU type and
        the number of nodes the job runs on now."""
        tracked = state.tracked[job.name]
        types, nodes = _placement(state, job.name)
        if len(types) > 1:  # a job across GPU types: priced by none, and told once
            self._mixed(sized, sorted(types))
            return None, len(nodes)
        gpu_type = types.pop() if types else None
        if gpu_type is None:
            return None, len(nodes)
        members = set(tracked.members.values())
        for kept in (sized.read, sized.consumed):  # what was read from pods that are gone goes with them
            for uid in [uid for uid in kept if uid not in members]:
                del kept[uid]
        sized.told = {told for told in sized.told if not told[0] or told[0] in members}  # "": the job's own
        # Whether the API failed, in this pass, to give what the job's model is made from: the reports of its
        # other pods then wait for the next pass too, unread (one attempt per job and pass, not one per worker: a
        # job of thousands of workers would otherwise send thousands of GETs to an API server that is failing).
        unanswered = False
        for uid in tracked.members.values():
            pod = mirror.pods.get(uid)
            if pod is None or elasticjobs.elastic_owner(pod) != sized.ref:
                continue  # a pod of the gang that another job (or none) controls: its reports are not this job's
            text = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_STEP_REPORT)
            if text is None or sized.read.get(uid) is text:
                continue  # no report, or the one already read (the mirror replaces a pod's dict when it changes)
            if unanswered and sized.model is None:
                continue
            sized.read[uid] = text
            read = read_step_report(pod, gpu_type=gpu_type, now=now, max_age_seconds=self.report_max_age_seconds)
            if read is None:
                continue
            if isinstance(read, ReportProblem):
                self._count_report(read.reason)
                self._tell(sized, pod, read.reason, read.message, now)
                continue
            if read.time <= sized.consumed.get(uid, float("-inf")):
                continue
            model = sized.model
            if model is None:
                try:
                    low, high, stated = self._batch_range(sized, read.report.local_bsz * read.report.num_replicas)
                    problem = _unformable(job, sized, read.report, sets_batch=not stated)  # (its nproc read now)
                    if problem is not None:  # before the report sets the batch of a job that states none
                        raise InvalidInputError(problem)
                    model = sized.model = self.models.make(sized, low, high, stated=stated,
                                                           world=_world(job, sized))
                except ApiError as error:  # its spec or kept model unreadable now: the report waits for a pass
                    sized.read.pop(uid, None)  # that can read both, so a transient error loses neither
                    self._unreadable(sized, error)
                    unanswered = True
                    continue
                except InvalidInputError as error:
                    sized.consumed[uid] = read.time
                    self._count_report(REASON_UNTRUSTED)
                    self._tell(sized, pod, REASON_UNTRUSTED, str(error), now)
                    continue
            sized.consumed[uid] = read.time
            problem = _unformable(job, sized, read.report)
            if problem is not None:
                self._count_report(REASON_UNTRUSTED)
                self._tell(sized, pod, REASON_UNTRUSTED, problem, now)
            elif not model.observe(read.report, accumulation_steps=read.accumulation_steps):
                self._count_report(REASON_UNTRUSTED)
                self._tell(sized, pod, REASON_UNTRUSTED, f"step report refused: {model.last_refusal}", now)
            else:
                if read.max_local_batch is not None:
                    model.limit_local_batch(gpu_type, read.max_local_batch)
                sized.model_learned = sized.reports.taken = True
                self._count_report("accepted")
        self.models.keep(sized, now)
        return gpu_type, len(nodes)

    def _batch_range(self, sized: Sized, observed: int) -> tuple[int, int, bool]:
        """The global batch range the job's goodput model may choose in, and whether the job states it: the
        ElasticJob's ``batchSize`` where it states one (then a larger batch is worth what its gradient noise
        says, Pollux's adaptive batch), else the batch the job reported, kept (a script that keeps its global
        batch gains from more workers only by splitting it). The restart cost the ElasticJob states is read on
        the way."""
        observed = max(observed, 1)
        try:
            spec = elasticjobs.read_elastic_job(self._get(sized.ref))
        except (ApiError, InvalidInputError) as error:
            if isinstance(error, ApiError) and not error.not_found:
                raise  # the API answered nothing about the job: ask again at the next report (``_feed``)
            log.info("ElasticJob %s/%s unreadable (%s): its batch is taken as reported", sized.ref.namespace,
                     sized.ref.name, error)
            return observed, observed, False
        if spec.uid != sized.ref.uid:
            return observed, observed, False
        sized.restart_seconds, sized.grace_seconds = spec.restart_seconds, spec.termination_grace_period_seconds
        sized.nproc = spec.nproc_per_node
        if spec.batch_size is None:
            return observed, observed, False
        return spec.batch_size.min, max(spec.batch_size.max, spec.batch_size.min), True


def _placement(state: Tracking, name: str) -> tuple[set[str], set[str]]:
    """The GPU types (``CPU_ONLY`` for members without GPUs) and the nodes job ``name`` runs on."""
    book = state.engine.book
    types, nodes = set(), set()
    for allocation in state.engine.queries.allocations_of(name):
        nodes.add(allocation.node)
        types.add(book.model_names[book.model_id[book.index[allocation.node]]] if allocation.gpu_indices
                  else CPU_ONLY)
    return types, nodes


def _unformable(job: Job, sized: Sized, report: StepReport, *, sets_batch: bool = False) -> str | None:
    """Why ``report`` is of a world ``job`` can never form, or None. Believed, it would lift the model's
    exploration limit (``OnlineGoodput.replica_limit``: a forged report of a huge world, and the job is grown on
    a claim). ``sets_batch``: the report sets the batch of a job that states no batch range (``_batch_range``,
    its first): one larger than any ElasticJob may state is no batch the job runs at."""
    most_nodes, most = _world(job, sized)
    if report.num_nodes > most_nodes or report.num_replicas > most:
        return (f"step report of {report.num_replicas} replicas on {report.num_nodes} nodes: this job runs at "
                f"most {job.spec.members} workers of {sized.nproc or elasticjobs.MAX_NPROC_PER_NODE} processes "
                "each")
    if sets_batch and report.num_replicas * report.local_bsz > elasticjobs.MAX_BATCH_SIZE:
        return (f"step report of a global batch of {report.num_replicas} x {report.local_bsz}: above "
                f"{elasticjobs.MAX_BATCH_SIZE}, the largest an ElasticJob may state")
    return None


def _world(job: Job, sized: Sized) -> tuple[int, int]:
    """The most nodes and replicas (processes) a world of ``job`` can have: its most workers, each of
    ``spec.nprocPerNode`` processes (the most any job may state while it was not read)."""
    return job.spec.members, job.spec.members * (sized.nproc or elasticjobs.MAX_NPROC_PER_NODE)


def _positive(value: float) -> bool:
    return math.isfinite(value) and value > 0.0

