"""Who decides that an ElasticJob is finished: the controller, from what it observed (its workers' exits, its
restarts spent, a rendezvous that never completed), recorded where only it writes (``Observation.final``), never
the status' phase, which whoever may patch ``elasticjobs/status`` can write. Before, ``status.phase: Succeeded``
written by anyone made the job final: its rendezvous was removed (``Failed``: its running workers deleted)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from kubecell.elastic.states import REASON_PHASE_NOT_OBSERVED, TERMINAL, Emit, Observation, Phase, step
from tests.elastic.test_states import kinds, obs, observations

P = Phase
NOT_OBSERVED = "!" + REASON_PHASE_NOT_OBSERVED
CASES = [
    # id, phase (as the status says), observation, -> phase, reason, actions
    ("a forged Succeeded on a running job: corrected, told, nothing stopped", P.SUCCEEDED, obs("YY"), P.RUNNING,
     "Running", [NOT_OBSERVED]),
    ("a forged Failed on a running job: no worker deleted, the rendezvous kept", P.FAILED, obs("YY"), P.RUNNING,
     "Running", [NOT_OBSERVED]),
    ("a forged Failed on a job still starting", P.FAILED, obs("RU"), P.STARTING, "Rendezvous", [NOT_OBSERVED]),
    ("a forged Succeeded while one worker still trains", P.SUCCEEDED, obs("DY"), P.RUNNING, "Completing",
     [NOT_OBSERVED]),
    ("a forged Succeeded on a job that did finish: confirmed by its workers, not told", P.SUCCEEDED, obs("DD"),
     P.SUCCEEDED, "Succeeded", ["rdzv-", "~Succeeded"]),
    ("a forged Failed on a job that succeeded: its workers decide", P.FAILED, obs("DD"), P.SUCCEEDED, "Succeeded",
     ["rdzv-", "~Succeeded", NOT_OBSERVED]),
    ("a forged Succeeded with the rendezvous gone: made again", P.SUCCEEDED, obs("YY", rendezvous_present=False),
     P.RUNNING, "Running", ["rdzv+", NOT_OBSERVED]),
    ("a forged Succeeded on an unreadable spec: Invalid, not final", P.SUCCEEDED,
     obs("YY", target=0, min_replicas=0, problem="bad"), P.INVALID, "InvalidSpec", ["!InvalidSpec", NOT_OBSERVED]),
    ("recorded Succeeded, the status rewritten to Running: still Succeeded", P.RUNNING,
     obs("DD", final=P.SUCCEEDED, reason="Succeeded"), P.SUCCEEDED, "Succeeded", ["rdzv-"]),
    ("recorded Succeeded, its pods garbage-collected: nothing made again", P.SUCCEEDED,
     obs("", final=P.SUCCEEDED, reason="Succeeded", rendezvous_gone=True), P.SUCCEEDED, "Succeeded", []),
    ("recorded Failed, pods gone, the spec edited: nothing made again", P.FAILED,
     obs("", target=3, previous=2, final=P.FAILED, reason="X", rendezvous_gone=True), P.FAILED, "X", []),
    ("recorded Failed, a worker made by hand: stopped", P.RUNNING, obs("Y", final=P.FAILED, reason="X"), P.FAILED,
     "X", ["-0", "rdzv-"]),
]


@pytest.mark.parametrize(("phase", "observation", "phase_after", "reason", "actions"),
                         [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_finality_is_the_controllers_observation(phase: Phase, observation: Observation, phase_after: Phase,
                                                 reason: str, actions: list[str]) -> None:
    decision = step(phase, observation)
    assert (decision.phase, decision.reason, kinds(decision.actions)) == (phase_after, reason, actions)


def test_the_warning_names_what_was_claimed_and_what_holds() -> None:
    decision = step(Phase.SUCCEEDED, obs("YY"))
    told = [a for a in decision.actions if isinstance(a, Emit)]
    assert len(told) == 1
    assert told[0].warning
    assert "Succeeded" in told[0].message
    assert "Running" in told[0].message


@settings(max_examples=400, deadline=None)
@given(observations())
def test_a_claimed_end_changes_nothing_but_an_event(observation: Observation) -> None:
    """Without the controller's record, a status that says Succeeded or Failed decides what a Pending one
    would: the only difference is the Warning that says the claim was not observed."""
    if observation.final is not None:
        return
    plain = step(Phase.PENDING, observation)
    for claimed in sorted(TERMINAL):
        decision = step(claimed, observation)
        told = [a for a in decision.actions if isinstance(a, Emit) and a.reason == REASON_PHASE_NOT_OBSERVED]
        rest = tuple(a for a in decision.actions if a not in told)
        assert (decision.phase, decision.reason, rest, decision.restarts, decision.established) == (
            plain.phase, plain.reason, plain.actions, plain.restarts, plain.established)
        assert len(told) == (0 if decision.phase is claimed else 1)
