"""The ElasticJob state machine: one pure function, ``step(phase, observation) -> Decision``.

Like HiveD's explicit group states, a job's life is a small set of phases, and every transition is decided
here from what the controller observed (its workers' states, the target the scheduler set, the restarts so
far, how long it has waited) and nothing else: no clock, no API, no memory between calls. The controller
(``kubecell.elastic.controller``) computes the observation from the API server, calls ``step``, writes the
phase, reason and restarts into the job's status *first*, then carries out the actions. Because the phase
and the restart count live in the API server, a restarted controller resumes exactly where the last one
stopped.

Whether the job has *ended* is the one thing not taken from its status: whoever may patch
``elasticjobs/status`` (the scheduler writes its conditions there) could write ``phase: Succeeded`` on a
running job. A job is final when the controller decided so here, from its own observation (rule 3, 4 or 9),
and recorded it where only it writes (``Observation.final``, ``kubecell.elastic.finished``) before acting on
it; a record kept after the job's pods are gone (garbage-collected, their node deleted).

Rules, in order (the first that applies decides):

1. A job the controller recorded as ``Succeeded`` or ``Failed`` is final, whatever its spec or its status say
   later: the rendezvous is removed and, for ``Failed``, the workers still running are stopped (their GPUs
   freed); ended workers are kept for their logs. A status that says ``Succeeded`` or ``Failed`` without that
   record decides nothing: the job is decided by the rules below as a ``Pending`` one would be (its workers'
   states set the phase again), and where they do not confirm the claim, a Warning ``PhaseNotObserved`` says
   so (the status is corrected by the write that follows).
2. An unreadable spec is ``Invalid``: a Warning Event (on entering, or when the spec changed), and nothing
   else is touched.
3. A worker that exited 0 means the training finished: no worker is created or replaced any more; once no
   started worker is left the job is ``Succeeded`` (all ended workers exited 0) or ``Failed``.
4. A worker that failed or crash-loops means torchrun gave up: its agent spent its restarts and *closed* the
   rendezvous run, so no worker can join that run again (a replacement would get ``RendezvousClosedError``).
   The job restarts as a whole (``Restarting``, one restart counted): every worker is deleted and recreated
   in a new rendezvous run (``PET_RDZV_ID=<uid>-<restarts>``). Once ``maxRestarts`` restarts were spent the
   job is ``Failed``. A worker the cluster took away (evicted, preempted: ``Disrupted``) got SIGTERM, which
   leaves the run open: it alone is replaced, in the same run, without counting.
5. Workers of an earlier run (``stale``: left over from a restart, e.g. across a controller crash) are
   deleted; they are recreated in the current run.
6. Workers made from an earlier ``spec.template`` (``outdated``: their template digest is not the spec's)
   are deleted with the grace period, so they checkpoint on SIGTERM, and recreated from the template now, in
   the same run and without counting a restart (``TemplateChanged``): one torchrun world never mixes two
   templates (two images, two commands). It is the path of workers the cluster took away (rule 4), all at
   once: when every participant has left, torchrun's rendezvous opens its next round for the replacements.
7. The target changed: ``Resizing``: the missing lowest indices are created, the indices at or above the
   target deleted (highest first, with the grace period, so they checkpoint on SIGTERM).
8. A worker that vanished (deleted by hand, its node gone) is recreated with the same index in the same run
   (``WorkerLost``).
9. At least minReplicas workers run but fewer than minReplicas have been Ready for ``rendezvousTimeout``:
   the rendezvous does not complete. The job restarts as in rule 4 (counted), or fails.
10. Otherwise the phase follows the counts: ``Pending`` until minReplicas workers run, ``Starting`` until all
   are Ready the first time, ``Resizing``/``Restarting`` until the changed set is Ready, then ``Running``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from enum import StrEnum


class Phase(StrEnum):
    PENDING = "Pending"
    """Workers created; fewer than minReplicas run (the scheduler has not placed the gang)."""
    STARTING = "Starting"
    """At least minReplicas run; not all Ready yet (the first rendezvous)."""
    RUNNING = "Running"
    RESIZING = "Resizing"
    """The target changed; the new set of workers is not all Ready yet."""
    RESTARTING = "Restarting"
    """Workers were replaced (failure, crash loop, loss, rendezvous timeout); not all Ready yet."""
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    INVALID = "Invalid"
    """The spec cannot be run; nothing is touched until it is fixed."""


TERMINAL = frozenset({Phase.SUCCEEDED, Phase.FAILED})


class Worker(StrEnum):
    """What one worker Pod is doing, as read by ``kubecell.elastic.workers``."""

    UNSCHEDULED = "Unscheduled"
    SCHEDULED = "Scheduled"
    """Bound to a node, containers not started yet."""
    RUNNING = "Running"
    READY = "Ready"
    CRASH_LOOP = "CrashLoop"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    DISRUPTED = "Disrupted"
    """Failed because the cluster took it (evicted, preempted: its ``DisruptionTarget`` condition)."""
    TERMINATING = "Terminating"


STARTED = frozenset({Worker.RUNNING, Worker.READY})
ACTIVE = frozenset({Worker.UNSCHEDULED, Worker.SCHEDULED, Worker.RUNNING, Worker.READY, Worker.CRASH_LOOP})
"""Workers that hold (or wait for) a place and have not ended."""


def counted(workers: Mapping[int, Worker], target: int, states: AbstractSet[Worker]) -> int:
    """Workers inside the target (an index below it) in one of ``states``."""
    return sum(state in states for index, state in workers.items() if index < target)

REASON_INVALID_SPEC = "InvalidSpec"
REASON_CREATED = "Created"
REASON_WAITING = "WaitingForScheduler"
REASON_RENDEZVOUS = "Rendezvous"
REASON_RUNNING = "Running"
REASON_NOT_READY = "WorkersNotReady"
REASON_RESIZING = "Resizing"
REASON_WORKER_LOST = "WorkerLost"
REASON_WORKER_FAILED = "WorkerFailed"
REASON_CRASH_LOOP = "CrashLoop"
REASON_RENDEZVOUS_TIMEOUT = "RendezvousTimeout"
REASON_MAX_RESTARTS = "MaxRestartsExceeded"
REASON_COMPLETING = "Completing"
REASON_SUCCEEDED = "Succeeded"
REASON_TEMPLATE_CHANGED = "TemplateChanged"
REASON_PHASE_NOT_OBSERVED = "PhaseNotObserved"


@dataclass(frozen=True, slots=True)
class Observation:
    """Everything a decision depends on, computed by the controller from the API server."""

    target: int
    """spec.replicas (0 when the spec cannot be read)."""
    min_replicas: int
    workers: Mapping[int, Worker] = field(default_factory=dict)
    """Worker index -> its state, for every worker Pod of the job that exists."""
    previous_target: int = 0
    """The target the controller last acted on, as it recorded it (``kubecell.elastic.finished``; the status'
    ``targetReplicas`` shows it, and anyone with status rights may write that); 0 before the first start."""
    restarts: int = 0
    """The restarts counted, as the controller recorded them (never the status' ``restarts``)."""
    max_restarts: int = 3
    seconds_stalled: float = 0.0
    """Seconds since the job last had minReplicas workers Ready, or since its workers last changed (or it was
    created), whichever is later; 0 while minReplicas are Ready."""
    rendezvous_timeout: float = 900.0
    rendezvous_present: bool = True
    """The rendezvous Service and its host Pod both exist."""
    rendezvous_gone: bool = False
    """Neither the rendezvous Service nor its host Pod exists."""
    replacing: frozenset[int] = frozenset()
    """Indices the controller itself left missing (deleted to replace or to shrink, a create that failed):
    created again without a WorkerLost."""
    stale: frozenset[int] = frozenset()
    """Indices whose worker belongs to an earlier rendezvous run than ``restarts`` (to be replaced)."""
    outdated: frozenset[int] = frozenset()
    """Indices whose worker was made from another ``spec.template`` than the spec's now (to be replaced)."""
    problem: str | None = None
    """Why the spec cannot be read (the job is Invalid), else None."""
    spec_changed: bool = False
    """The spec's generation is not the one the status describes."""
    reason: str = ""
    message: str = ""
    """The reason and message in force (kept by decisions that do not change them)."""
    final: Phase | None = None
    """How the job ended, as the controller recorded it when it decided so (``kubecell.elastic.finished``);
    None while it has not. Never the status' phase, which anyone with status rights may write."""


@dataclass(frozen=True, slots=True)
class CreateWorker:
    index: int


@dataclass(frozen=True, slots=True)
class DeleteWorker:
    index: int
    graceful: bool = True
    """With the job's grace period (SIGTERM, time to checkpoint); False for a worker that has ended."""


@dataclass(frozen=True, slots=True)
class EnsureRendezvous:
    """Create the rendezvous Service and host Pod where missing."""


@dataclass(frozen=True, slots=True)
class RemoveRendezvous:
    """Delete the rendezvous Service and host Pod."""


@dataclass(frozen=True, slots=True)
class Emit:
    """An Event on the job."""

    warning: bool
    reason: str
    message: str


Action = CreateWorker | DeleteWorker | EnsureRendezvous | RemoveRendezvous | Emit


@dataclass(frozen=True, slots=True)
class Decision:
    phase: Phase
    reason: str
    message: str
    actions: tuple[Action, ...] = ()
    restarts: int = 0
    established: int = 0
    """The target the workers now follow (``status.targetReplicas``)."""
    changed: bool = False
    """The set of workers changed (``status.lastResizeTime`` = now): a new rendezvous round."""


def workers_named(indices: Iterable[int]) -> str:
    ordered = sorted(indices)
    return ("worker " if len(ordered) == 1 else "workers ") + ", ".join(str(i) for i in ordered)


def step(phase: Phase, obs: Observation) -> Decision:
    """The job's next phase and what to do about it (see the module's rules). ``phase`` is the status' phase:
    what the job was doing, not whether it ended (``obs.final`` says that)."""
    if obs.final is not None:  # whatever the spec or the status say now: a finished job is never started again
        return _final(obs.final, obs)
    if phase not in TERMINAL:
        return _live(phase, obs)
    decision = _live(Phase.PENDING, obs)  # an end nobody observed: the workers set the phase again
    if decision.phase is phase:  # they show it (a status written before this controller kept its records)
        return decision
    message = (f"status.phase said {phase}, but this controller never observed the job end (it keeps a record "
               f"of each end it decides, and the workers show none): {decision.phase} ({decision.reason})")
    return replace(decision, actions=(*decision.actions, Emit(True, REASON_PHASE_NOT_OBSERVED, message)))


def _live(phase: Phase, obs: Observation) -> Decision:
    """Rules 2 to 10: the decision for a job that has not ended."""
    if obs.problem is not None:
        events: tuple[Action, ...] = ()
        if phase is not Phase.INVALID or obs.spec_changed:
            events = (Emit(True, REASON_INVALID_SPEC, obs.problem),)
        return Decision(Phase.INVALID, REASON_INVALID_SPEC, obs.problem, events, obs.restarts, obs.previous_target)
    current = Phase.PENDING if phase is Phase.INVALID else phase
    decision = (_completion(obs) or _failures(obs) or _stale(obs) or _outdated(obs) or _membership(current, obs)
                or _deadline(obs) or _progress(current, obs))
    if decision.phase not in TERMINAL and not obs.rendezvous_present:
        decision = replace(decision, actions=(EnsureRendezvous(), *decision.actions))
    return decision


def _final(phase: Phase, obs: Observation) -> Decision:
    actions: list[Action] = []
    if phase is Phase.FAILED:
        actions += [DeleteWorker(i) for i, state in sorted(obs.workers.items()) if state in ACTIVE]
    if not obs.rendezvous_gone:
        actions.append(RemoveRendezvous())
    return Decision(phase, obs.reason, obs.message, tuple(actions), obs.restarts, obs.previous_target)


def _stop_all(obs: Observation) -> list[Action]:
    """What a job that failed does: stop its active workers (their GPUs go back), remove the rendezvous."""
    return [*(DeleteWorker(i) for i, state in sorted(obs.workers.items()) if state in ACTIVE), RemoveRendezvous()]


def _current(obs: Observation) -> dict[int, Worker]:
    """The workers of the current rendezvous run (a stale worker's end says nothing about this run)."""
    return {i: state for i, state in obs.workers.items() if i not in obs.stale}


def _restart_all(obs: Observation) -> list[Action]:
    """A new rendezvous run: every worker goes (those still running with the grace period, to checkpoint)."""
    return [DeleteWorker(i, graceful=state in ACTIVE) for i, state in sorted(obs.workers.items())
            if state is not Worker.TERMINATING]


def _completion(obs: Observation) -> Decision | None:
    current = _current(obs)
    done = {i for i, state in current.items() if state is Worker.SUCCEEDED}
    if not done:
        return None
    # waited for: a worker still training, or one bound and starting while the run is young; never one that
    # crash-loops (it failed) nor one that has not started within the rendezvous timeout (it never will join)
    patient = obs.seconds_stalled <= obs.rendezvous_timeout
    busy = {i for i, state in current.items()
            if state in STARTED or (state is Worker.SCHEDULED and patient)}
    if busy:
        return Decision(Phase.RUNNING, REASON_COMPLETING,
                        f"{workers_named(done)} finished; waiting for {workers_named(busy)} to finish",
                        (), obs.restarts, obs.previous_target)
    leftovers = [DeleteWorker(i, graceful=False) for i, state in sorted(obs.workers.items())
                 if state in ACTIVE]  # never started, or of an earlier run: nothing to wait for
    failed = {i for i, state in current.items() if state in (Worker.FAILED, Worker.CRASH_LOOP)}
    if failed:
        message = f"{workers_named(done)} exited 0 but {workers_named(failed)} failed"
        return Decision(Phase.FAILED, REASON_WORKER_FAILED, message,
                        (*leftovers, RemoveRendezvous(), Emit(True, REASON_WORKER_FAILED, message)),
                        obs.restarts, obs.previous_target)
    message = f"{workers_named(done)} exited 0: the training finished"
    return Decision(Phase.SUCCEEDED, REASON_SUCCEEDED, message,
                    (*leftovers, RemoveRendezvous(), Emit(False, REASON_SUCCEEDED, message)),
                    obs.restarts, obs.previous_target)


def _failures(obs: Observation) -> Decision | None:
    inside = {i: state for i, state in _current(obs).items() if i < obs.target}
    crashed = {i for i, state in inside.items() if state in (Worker.FAILED, Worker.CRASH_LOOP)}
    looping = {i for i, state in inside.items() if state is Worker.CRASH_LOOP}
    disrupted = {i for i, state in inside.items() if state is Worker.DISRUPTED}
    if crashed:
        reason = REASON_CRASH_LOOP if looping else REASON_WORKER_FAILED
        what = f"{workers_named(crashed)} " + ("crash-looping" if looping == crashed else "failed")
        if obs.restarts >= obs.max_restarts:
            message = f"{what} after {obs.restarts} restarts (maxRestarts {obs.max_restarts})"
            return Decision(Phase.FAILED, REASON_MAX_RESTARTS, message,
                            (*_stop_all(obs), Emit(True, REASON_MAX_RESTARTS, message)),
                            obs.restarts, obs.previous_target)
        restarts = obs.restarts + 1
        message = (f"{what}; restarting every worker in a new rendezvous run "
                   f"(restart {restarts} of at most {obs.max_restarts})")
        return Decision(Phase.RESTARTING, reason, message, (*_restart_all(obs), Emit(True, reason, message)),
                        restarts, obs.previous_target, changed=True)
    if disrupted:
        message = f"{workers_named(disrupted)} taken by the cluster (evicted or preempted); replacing, not counted"
        return Decision(Phase.RESTARTING, REASON_WORKER_LOST, message,
                        (*(DeleteWorker(i, graceful=False) for i in sorted(disrupted)),
                         Emit(True, REASON_WORKER_LOST, message)),
                        obs.restarts, obs.previous_target, changed=True)
    return None


def _stale(obs: Observation) -> Decision | None:
    old = [i for i in sorted(obs.stale) if i in obs.workers and obs.workers[i] is not Worker.TERMINATING]
    if not old:
        return None
    return Decision(Phase.RESTARTING, obs.reason or REASON_WORKER_FAILED, obs.message,
                    tuple(DeleteWorker(i, graceful=obs.workers[i] in ACTIVE) for i in old), obs.restarts,
                    obs.previous_target)


def _outdated(obs: Observation) -> Decision | None:
    old = [i for i in sorted(obs.outdated) if obs.workers.get(i) in ACTIVE]
    if not old:
        return None
    message = (f"spec.template changed: replacing {workers_named(old)} with workers made from it (the same "
               "rendezvous run; not counted as a restart)")
    return Decision(Phase.RESTARTING, REASON_TEMPLATE_CHANGED, message,
                    (*(DeleteWorker(i) for i in old), Emit(False, REASON_TEMPLATE_CHANGED, message)),
                    obs.restarts, obs.previous_target, changed=True)


def _membership(phase: Phase, obs: Observation) -> Decision | None:
    missing = [i for i in range(obs.target) if i not in obs.workers]
    excess = sorted((i for i, state in obs.workers.items() if i >= obs.target and state is not Worker.TERMINATING),
                    reverse=True)
    creates = [CreateWorker(i) for i in missing]
    deletes = [DeleteWorker(i, graceful=obs.workers[i] in ACTIVE) for i in excess]
    if obs.previous_target == 0 and missing:
        message = f"creating {obs.target} workers (at least {obs.min_replicas} to run)"
        return Decision(Phase.PENDING, REASON_CREATED, message,
                        (*deletes, *creates, Emit(False, REASON_CREATED, message)), obs.restarts, obs.target,
                        changed=True)
    if obs.previous_target not in (0, obs.target):
        message = f"{obs.previous_target} -> {obs.target} workers"
        return Decision(Phase.RESIZING, REASON_RESIZING, message,
                        (*deletes, *creates, Emit(False, REASON_RESIZING, message)),
                        obs.restarts, obs.target, changed=True)
    lost = [i for i in missing if i not in obs.replacing]
    if lost:
        message = f"{workers_named(lost)} lost; recreating with the same index"
        return Decision(Phase.RESTARTING, REASON_WORKER_LOST, message,
                        (*deletes, *creates, Emit(True, REASON_WORKER_LOST, message)),
                        obs.restarts, obs.target, changed=True)
    if creates:  # the replacements of workers this controller deleted itself: their restart was counted
        return Decision(phase, obs.reason or REASON_RESIZING, obs.message, (*deletes, *creates), obs.restarts,
                        obs.target)
    if deletes:  # workers beyond the target that nobody asked for (made by hand)
        message = f"{workers_named(excess)} beyond the target of {obs.target}; deleting"
        return Decision(Phase.RESIZING, REASON_RESIZING, message, (*deletes, Emit(False, REASON_RESIZING, message)),
                        obs.restarts, obs.target, changed=True)
    return None


def _deadline(obs: Observation) -> Decision | None:
    inside = {i: state for i, state in obs.workers.items() if i < obs.target}
    started = sum(state in STARTED for state in inside.values())
    ready = sum(state is Worker.READY for state in inside.values())
    if ready >= obs.min_replicas or started < obs.min_replicas or obs.seconds_stalled < obs.rendezvous_timeout:
        return None
    what = (f"{ready} of {obs.min_replicas} required workers Ready after {obs.seconds_stalled:.0f} s "
            f"(rendezvousTimeoutSeconds {obs.rendezvous_timeout:.0f})")
    if obs.restarts >= obs.max_restarts:
        message = f"{what}, and {obs.restarts} restarts spent (maxRestarts {obs.max_restarts})"
        return Decision(Phase.FAILED, REASON_RENDEZVOUS_TIMEOUT, message,
                        (*_stop_all(obs), Emit(True, REASON_RENDEZVOUS_TIMEOUT, message)),
                        obs.restarts, obs.previous_target)
    restarts = obs.restarts + 1
    message = (f"{what}; restarting every worker in a new rendezvous run "
               f"(restart {restarts} of at most {obs.max_restarts})")
    return Decision(Phase.RESTARTING, REASON_RENDEZVOUS_TIMEOUT, message,
                    (*_restart_all(obs), Emit(True, REASON_RENDEZVOUS_TIMEOUT, message)),
                    restarts, obs.previous_target, changed=True)


def _progress(phase: Phase, obs: Observation) -> Decision:
    inside = {i: state for i, state in obs.workers.items() if i < obs.target}
    ready = sum(state is Worker.READY for state in inside.values())
    started = sum(state in STARTED for state in inside.values())
    leaving = any(state is Worker.TERMINATING for state in obs.workers.values())
    counts = f"{ready} of {obs.target} workers Ready, {started} running"
    if ready == obs.target and not leaving:
        return Decision(Phase.RUNNING, REASON_RUNNING, f"all {obs.target} workers Ready", (), obs.restarts, obs.target)
    if phase is Phase.PENDING:
        if started >= obs.min_replicas:
            return Decision(Phase.STARTING, REASON_RENDEZVOUS, f"{counts}; waiting for the rendezvous", (),
                            obs.restarts, obs.target)
        return Decision(Phase.PENDING, REASON_WAITING,
                        f"{started} of at least {obs.min_replicas} workers running; waiting for the scheduler", (),
                        obs.restarts, obs.target)
    if phase is Phase.RUNNING:
        return Decision(Phase.RUNNING, REASON_NOT_READY, counts, (), obs.restarts, obs.target)
    if phase is Phase.STARTING:
        return Decision(Phase.STARTING, REASON_RENDEZVOUS, f"{counts}; waiting for the rendezvous", (),
                        obs.restarts, obs.target)
    suffix = "; waiting for the workers to leave" if leaving else ""
    return Decision(phase, obs.reason or REASON_RESIZING, _keep_cause(obs.message, counts + suffix), (),
                    obs.restarts, obs.target)


def _keep_cause(message: str, counts: str) -> str:
    """A Resizing/Restarting message: why (the first part, written when it began), then the counts now."""
    cause = message.split(" | ", 1)[0]
    return f"{cause} | {counts}" if cause else counts
