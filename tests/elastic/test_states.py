"""The ElasticJob state machine as a table: (phase, observation) -> (phase, reason, actions, restarts), then
properties that hold for every observation (Hypothesis)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubecell.elastic.states import (
    ACTIVE,
    TERMINAL,
    CreateWorker,
    DeleteWorker,
    Emit,
    EnsureRendezvous,
    Observation,
    Phase,
    RemoveRendezvous,
    Worker,
    step,
)

LETTERS = {"U": Worker.UNSCHEDULED, "S": Worker.SCHEDULED, "R": Worker.RUNNING, "Y": Worker.READY,
           "C": Worker.CRASH_LOOP, "D": Worker.SUCCEEDED, "F": Worker.FAILED, "X": Worker.DISRUPTED,
           "T": Worker.TERMINATING}


def w(text: str) -> dict[int, Worker]:
    """Workers by index, one letter each (see LETTERS; '.' = no pod at that index)."""
    return {index: LETTERS[letter] for index, letter in enumerate(text) if letter != "."}


def obs(workers: str = "", *, target: int = 2, min_replicas: int = 1, previous: int | None = None,
        **more: Any) -> Observation:
    return Observation(target=target, min_replicas=min_replicas, workers=w(workers),
                       previous_target=target if previous is None else previous, **more)


def kinds(actions: tuple[Any, ...]) -> list[str]:
    """Actions, written short: +2 create, -1 delete (graceful), -1! delete at once, rdzv+, rdzv-, and
    Event reasons as !Reason (Warning) or ~Reason (Normal)."""
    out = []
    for action in actions:
        if isinstance(action, CreateWorker):
            out.append(f"+{action.index}")
        elif isinstance(action, DeleteWorker):
            out.append(f"-{action.index}" + ("" if action.graceful else "!"))
        elif isinstance(action, EnsureRendezvous):
            out.append("rdzv+")
        elif isinstance(action, RemoveRendezvous):
            out.append("rdzv-")
        elif isinstance(action, Emit):
            out.append(("!" if action.warning else "~") + action.reason)
    return out


P = Phase
CASES = [
    # id, phase, observation, -> phase, reason, actions, restarts
    ("first start creates the target and the rendezvous", P.PENDING,
     obs("", previous=0, rendezvous_present=False), P.PENDING, "Created", ["rdzv+", "+0", "+1", "~Created"], 0),
    ("created, not placed: waiting for the scheduler", P.PENDING, obs("UU"), P.PENDING, "WaitingForScheduler", [], 0),
    ("min running: the rendezvous", P.PENDING, obs("RU"), P.STARTING, "Rendezvous", [], 0),
    ("all Ready: running", P.STARTING, obs("YY"), P.RUNNING, "Running", [], 0),
    ("a Ready worker drops: still running", P.RUNNING, obs("YR"), P.RUNNING, "WorkersNotReady", [], 0),
    ("grow: lowest free index", P.RUNNING, obs("YY", target=3, previous=2), P.RESIZING, "Resizing",
     ["+2", "~Resizing"], 0),
    ("grow into a hole: lowest free indices first", P.RUNNING, obs("Y.Y", target=4, previous=3), P.RESIZING,
     "Resizing", ["+1", "+3", "~Resizing"], 0),
    ("shrink: highest indices first, with the grace period", P.RUNNING, obs("YYY", target=1, previous=3),
     P.RESIZING, "Resizing", ["-2", "-1", "~Resizing"], 0),
    ("shrink: waiting for the leavers", P.RESIZING,
     obs("YTT", target=1, reason="Resizing", message="3 -> 1 workers"), P.RESIZING, "Resizing", [], 0),
    ("shrink done", P.RESIZING, obs("Y", target=1), P.RUNNING, "Running", [], 0),
    ("grown worker not Ready yet", P.RESIZING, obs("YYS", target=3, reason="Resizing"), P.RESIZING, "Resizing",
     [], 0),
    ("worker 0 lost: recreated with its index, not counted", P.RUNNING, obs(".Y"), P.RESTARTING, "WorkerLost",
     ["+0", "!WorkerLost"], 0),
    ("a worker the controller replaces: created silently", P.RESTARTING,
     obs(".Y", replacing=frozenset({0}), reason="WorkerFailed"), P.RESTARTING, "WorkerFailed", ["+0"], 0),
    ("a worker failed (torchrun closed the run): every worker restarts in a new run, counted", P.RUNNING,
     obs("YF"), P.RESTARTING, "WorkerFailed", ["-0", "-1!", "!WorkerFailed"], 1),
    ("a worker crash-loops: every worker restarts, with the grace period, counted", P.RUNNING,
     obs("YC", restarts=1), P.RESTARTING, "CrashLoop", ["-0", "-1", "!CrashLoop"], 2),
    ("two fail at once: one restart", P.RUNNING, obs("FF"), P.RESTARTING, "WorkerFailed",
     ["-0!", "-1!", "!WorkerFailed"], 1),
    ("restarts spent: failed, the rest stopped", P.RUNNING, obs("YF", restarts=3, max_restarts=3), P.FAILED,
     "MaxRestartsExceeded", ["-0", "rdzv-", "!MaxRestartsExceeded"], 3),
    ("maxRestarts 0: the first failure fails the job", P.RUNNING, obs("YC", max_restarts=0), P.FAILED,
     "MaxRestartsExceeded", ["-0", "-1", "rdzv-", "!MaxRestartsExceeded"], 0),
    ("evicted or preempted: replaced, not counted", P.RUNNING, obs("YX", restarts=3, max_restarts=3),
     P.RESTARTING, "WorkerLost", ["-1!", "!WorkerLost"], 3),
    ("a failure is handled before a resize", P.RUNNING, obs("YF", target=3, previous=2), P.RESTARTING,
     "WorkerFailed", ["-0", "-1!", "!WorkerFailed"], 1),
    ("workers of an earlier run are replaced, not counted again", P.RESTARTING,
     obs("YY", stale=frozenset({0, 1}), restarts=1, reason="WorkerFailed"), P.RESTARTING, "WorkerFailed",
     ["-0", "-1"], 1),
    ("an ended worker of an earlier run is deleted at once", P.RESTARTING,
     obs("FY", stale=frozenset({0}), restarts=1, reason="WorkerFailed"), P.RESTARTING, "WorkerFailed", ["-0!"], 1),
    ("a stale worker's success finishes nothing", P.RESTARTING,
     obs("DY", stale=frozenset({0}), restarts=1, reason="WorkerFailed"), P.RESTARTING, "WorkerFailed", ["-0!"], 1),
    ("a stale worker leaving: waiting for it", P.RESTARTING,
     obs("TY", stale=frozenset({0}), restarts=1, reason="WorkerFailed", message="m"), P.RESTARTING, "WorkerFailed",
     [], 1),
    ("workers of another template are replaced gracefully, in the same run, not counted", P.RUNNING,
     obs("YY", outdated=frozenset({0, 1}), restarts=1), P.RESTARTING, "TemplateChanged",
     ["-0", "-1", "~TemplateChanged"], 1),
    ("an unplaced worker of another template is replaced too", P.PENDING, obs("YU", outdated=frozenset({1})),
     P.RESTARTING, "TemplateChanged", ["-1", "~TemplateChanged"], 0),
    ("an outdated worker leaving: no second delete, the replacement waits for it", P.RESTARTING,
     obs("T.", outdated=frozenset({0}), replacing=frozenset({0, 1}), reason="TemplateChanged", message="m"),
     P.RESTARTING, "TemplateChanged", ["+1"], 0),
    ("a failure in an outdated world restarts it, counted, as any failure", P.RUNNING,
     obs("FY", outdated=frozenset({0, 1})), P.RESTARTING, "WorkerFailed", ["-0!", "-1", "!WorkerFailed"], 1),
    ("an outdated worker that finished finishes the job: nothing is replaced", P.RUNNING,
     obs("DD", outdated=frozenset({0, 1})), P.SUCCEEDED, "Succeeded", ["rdzv-", "~Succeeded"], 0),
    ("the template is replaced before a resize, which follows on the next step", P.RUNNING,
     obs("YY", target=3, previous=2, outdated=frozenset({1})), P.RESTARTING, "TemplateChanged",
     ["-1", "~TemplateChanged"], 0),
    ("a failed worker beyond the new target is deleted, not counted", P.RUNNING, obs("YF", target=1, previous=2),
     P.RESIZING, "Resizing", ["-1!", "~Resizing"], 0),
    ("a worker beyond the target made by hand", P.RUNNING, obs("YYY"), P.RESIZING, "Resizing",
     ["-2", "~Resizing"], 0),
    ("one worker finished: waiting for the others", P.RUNNING, obs("DY"), P.RUNNING, "Completing", [], 0),
    ("all finished: succeeded, workers kept, rendezvous removed", P.RUNNING, obs("DD"), P.SUCCEEDED, "Succeeded",
     ["rdzv-", "~Succeeded"], 0),
    ("finished while one was never placed: that one deleted", P.RUNNING, obs("DU"), P.SUCCEEDED, "Succeeded",
     ["-1!", "rdzv-", "~Succeeded"], 0),
    ("finished but one failed: failed", P.RUNNING, obs("DF"), P.FAILED, "WorkerFailed", ["rdzv-", "!WorkerFailed"],
     0),
    ("finished but one crash-loops: failed, never waited for", P.RUNNING, obs("DC"), P.FAILED, "WorkerFailed",
     ["-1!", "rdzv-", "!WorkerFailed"], 0),
    ("finished, one bound and starting: waited for", P.RUNNING, obs("DS", seconds_stalled=60), P.RUNNING,
     "Completing", [], 0),
    ("finished, one bound but never started within the rendezvous timeout: not waited for", P.RUNNING,
     obs("DS", seconds_stalled=901), P.SUCCEEDED, "Succeeded", ["-1!", "rdzv-", "~Succeeded"], 0),
    ("a finished worker is never replaced", P.RUNNING, obs("D."), P.SUCCEEDED, "Succeeded", ["rdzv-", "~Succeeded"],
     0),
    ("succeeded is final; leftovers removed", P.SUCCEEDED,
     obs("DD", reason="Succeeded", message="m", final=P.SUCCEEDED), P.SUCCEEDED, "Succeeded", ["rdzv-"], 0),
    ("succeeded, nothing left to remove", P.SUCCEEDED,
     obs("DD", rendezvous_gone=True, reason="Succeeded", final=P.SUCCEEDED), P.SUCCEEDED, "Succeeded", [], 0),
    ("failed is final: running workers stopped", P.FAILED,
     obs("YF", rendezvous_gone=True, reason="X", final=P.FAILED), P.FAILED, "X", ["-0"], 0),
    ("failed ignores a new target", P.FAILED,
     obs("F", target=3, previous=1, rendezvous_gone=True, reason="X", final=P.FAILED), P.FAILED, "X", [], 0),
    ("rendezvous stuck: every worker restarts in a new run, counted", P.STARTING,
     obs("RR", min_replicas=2, seconds_stalled=901.0, rendezvous_timeout=900.0), P.RESTARTING, "RendezvousTimeout",
     ["-0", "-1", "!RendezvousTimeout"], 1),
    ("rendezvous stuck, restarts spent: failed", P.STARTING,
     obs("RR", min_replicas=2, seconds_stalled=901.0, rendezvous_timeout=900.0, restarts=3, max_restarts=3),
     P.FAILED, "RendezvousTimeout", ["-0", "-1", "rdzv-", "!RendezvousTimeout"], 3),
    ("rendezvous still within its deadline", P.STARTING, obs("RR", min_replicas=2, seconds_stalled=899.0),
     P.STARTING, "Rendezvous", [], 0),
    ("no deadline while the scheduler has not placed min workers", P.PENDING,
     obs("UU", min_replicas=2, seconds_stalled=1e6), P.PENDING, "WaitingForScheduler", [], 0),
    ("no deadline while min workers are Ready", P.RUNNING, obs("YR", seconds_stalled=1e6), P.RUNNING,
     "WorkersNotReady", [], 0),
    ("rendezvous host or Service gone: recreated", P.RUNNING, obs("YY", rendezvous_present=False), P.RUNNING,
     "Running", ["rdzv+"], 0),
    ("invalid spec: condition and Event, nothing touched", P.RUNNING,
     obs("YF", target=0, min_replicas=0, problem="spec.minReplicas: is 5, above maxReplicas 2"), P.INVALID,
     "InvalidSpec", ["!InvalidSpec"], 0),
    ("still invalid: no second Event", P.INVALID, obs("", target=0, problem="bad"), P.INVALID, "InvalidSpec", [], 0),
    ("invalid, edited and still invalid: a new Event", P.INVALID,
     obs("", target=0, problem="bad", spec_changed=True), P.INVALID, "InvalidSpec", ["!InvalidSpec"], 0),
    ("invalid, then fixed: the workers as they are", P.INVALID, obs("YY"), P.RUNNING, "Running", [], 0),
    ("a finished job stays finished whatever its spec says", P.FAILED,
     obs("F", target=0, min_replicas=0, problem="bad", rendezvous_gone=True, reason="X", final=P.FAILED), P.FAILED,
     "X", [], 0),
    ("invalid from the start, then fixed: created", P.INVALID, obs("", previous=0), P.PENDING, "Created",
     ["+0", "+1", "~Created"], 0),
]


@pytest.mark.parametrize(("phase", "observation", "phase_after", "reason", "actions", "restarts"),
                         [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_the_state_machine(phase: Phase, observation: Observation, phase_after: Phase, reason: str,
                           actions: list[str], restarts: int) -> None:
    decision = step(phase, observation)
    assert (decision.phase, decision.reason, kinds(decision.actions), decision.restarts) == (
        phase_after, reason, actions, restarts)


def test_a_change_of_workers_starts_a_new_round_and_sets_the_target() -> None:
    grown = step(Phase.RUNNING, obs("YY", target=3, previous=2))
    assert (grown.changed, grown.established) == (True, 3)
    steady = step(Phase.RUNNING, obs("YY"))
    assert (steady.changed, steady.established) == (False, 2)
    failed = step(Phase.RUNNING, obs("YF", target=3, previous=2))
    assert (failed.changed, failed.established) == (True, 2)  # the resize waits for the next step


def test_a_resize_message_keeps_its_cause_with_the_counts() -> None:
    decision = step(Phase.RESIZING, obs("YYS", target=3, reason="Resizing", message="2 -> 3 workers | old counts"))
    assert decision.message == "2 -> 3 workers | 2 of 3 workers Ready, 2 running"


# ------------------------------------------------------------------ properties
STATES = st.sampled_from(list(Worker))


@st.composite
def observations(draw: st.DrawFn) -> Observation:
    target = draw(st.integers(0, 8))
    return Observation(
        target=target, min_replicas=draw(st.integers(0, max(target, 1))),
        workers=draw(st.dictionaries(st.integers(0, 10), STATES, max_size=10)),
        previous_target=draw(st.integers(0, 8)), restarts=draw(st.integers(0, 5)),
        max_restarts=draw(st.integers(0, 5)), seconds_stalled=draw(st.floats(0, 2000)),
        rendezvous_timeout=draw(st.floats(10, 1000)), rendezvous_present=draw(st.booleans()),
        rendezvous_gone=draw(st.booleans()), replacing=frozenset(draw(st.sets(st.integers(0, 10)))),
        stale=frozenset(draw(st.sets(st.integers(0, 10)))), outdated=frozenset(draw(st.sets(st.integers(0, 10)))),
        problem=draw(st.none() | st.just("bad spec")), spec_changed=draw(st.booleans()),
        final=draw(st.none() | st.sampled_from(sorted(TERMINAL))))


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(list(Phase)), observations())
def test_every_decision_keeps_the_rules(phase: Phase, observation: Observation) -> None:
    decision = step(phase, observation)
    creates = [a.index for a in decision.actions if isinstance(a, CreateWorker)]
    deletes = [a.index for a in decision.actions if isinstance(a, DeleteWorker)]
    assert decision.restarts in (observation.restarts, observation.restarts + 1)
    assert all(0 <= i < observation.target for i in creates), "a worker is created only below the target"
    assert all(i not in observation.workers for i in creates), "never a second pod for an index"
    assert all(i in observation.workers and observation.workers[i] is not Worker.TERMINATING for i in deletes)
    assert len(set(deletes)) == len(deletes)
    if observation.problem is not None and observation.final is None:
        assert decision.phase is Phase.INVALID
        assert all(isinstance(a, Emit) for a in decision.actions), "an invalid job disturbs nothing"
    if observation.final is not None:
        assert decision.phase is observation.final, "a job the controller saw end stays as it ended"
        assert not creates, "a finished job creates nothing"
    if any(state is Worker.SUCCEEDED for i, state in observation.workers.items() if i not in observation.stale):
        assert not creates, "a job whose training finished starts no worker"
    if decision.restarts > observation.restarts:
        left = {i for i, s in observation.workers.items() if s is not Worker.TERMINATING}
        assert set(deletes) == left, "a counted restart is a new rendezvous run: every worker goes"
    if decision.phase is Phase.FAILED and observation.problem is None:
        active = {i for i, state in observation.workers.items() if state in ACTIVE}
        assert set(deletes) >= active, "a failed job holds no GPU: every active worker is stopped"
    if decision.restarts > observation.restarts:
        assert decision.restarts <= observation.max_restarts
    if decision.reason == "TemplateChanged" and deletes:
        assert set(deletes) <= observation.outdated, "a template change replaces only the outdated workers"
        assert all(a.graceful for a in decision.actions if isinstance(a, DeleteWorker)), "they checkpoint first"
        assert decision.restarts == observation.restarts, "a template change is not a failure"
