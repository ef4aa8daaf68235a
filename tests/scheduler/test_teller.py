"""Why-pending without a write storm: the Teller's rule for when a waiting pod is told again.

The writes themselves are the API server's business (tested on the testbed in test_scheduler.py); this
checks the rule on a recording stand-in for ``Actions`` (no API server involved, so no testbed).
"""

from __future__ import annotations

from typing import Any

from kubecell.scheduler.teller import Teller

POD = {"metadata": {"name": "p", "namespace": "ns", "uid": "u-1"}}


class Recorder:
    """Records what the Teller would write."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bool]] = []

    def unschedulable(self, pod: Any, message: str, *, reason: str = "Unschedulable", event: bool = True) -> None:
        self.calls.append((message, event))


def teller(refresh_seconds: float) -> tuple[Teller, Recorder]:
    recorder = Recorder()
    return Teller(recorder, refresh_seconds=refresh_seconds), recorder  # type: ignore[arg-type]


def test_the_same_message_is_told_once() -> None:
    tell, recorded = teller(0.0)
    tell.tell(POD, "0/5 nodes fit one member: 5 insufficient GPUs")
    tell.tell(POD, "0/5 nodes fit one member: 5 insufficient GPUs")
    assert recorded.calls == [("0/5 nodes fit one member: 5 insufficient GPUs", True)]


def test_new_numbers_refresh_the_condition_only_after_the_interval_and_without_an_event() -> None:
    tell, recorded = teller(3600.0)
    tell.tell(POD, "0/5 nodes fit one member: 5 insufficient GPUs")
    tell.tell(POD, "0/6 nodes fit one member: 6 insufficient GPUs")
    assert len(recorded.calls) == 1, "new numbers within the interval are not written"
    tell.refresh_seconds = 0.0
    tell.tell(POD, "0/7 nodes fit one member: 7 insufficient GPUs")
    assert recorded.calls[-1] == ("0/7 nodes fit one member: 7 insufficient GPUs", False)


def test_a_new_kind_of_reason_is_told_at_once_with_an_event() -> None:
    tell, recorded = teller(3600.0)
    tell.tell(POD, "0/5 nodes fit one member: 5 insufficient GPUs")
    tell.tell(POD, "0/5 nodes fit one member: 5 not allowed by the job's node constraints")
    assert recorded.calls[-1] == ("0/5 nodes fit one member: 5 not allowed by the job's node constraints", True)


def test_a_forgotten_pod_is_told_afresh() -> None:
    tell, recorded = teller(3600.0)
    tell.tell(POD, "waiting")
    tell.forget("u-1")
    tell.tell(POD, "waiting")
    assert len(recorded.calls) == 2
