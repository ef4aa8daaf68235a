"""``metav1.Condition`` as every kubecell writer builds it (``kube.conditions``): the transition time moves only
when the status does, and only a time the CRDs' ``format: date-time`` accepts is carried over from the object."""

from __future__ import annotations

from typing import Any

import pytest

from kubecell.kube.conditions import MAX_MESSAGE, condition

BEFORE = "2026-12-01T08:00:00Z"
NOW = "2026-12-02T10:00:00Z"


def test_the_transition_time_moves_only_with_the_status() -> None:
    was = {"type": "Accepted", "status": "True", "lastTransitionTime": BEFORE, "reason": "Accepted", "message": ""}
    same = condition("Accepted", True, "Accepted", "still", NOW, previous=was, generation=3)
    assert same == {"type": "Accepted", "status": "True", "observedGeneration": 3, "lastTransitionTime": BEFORE,
                    "reason": "Accepted", "message": "still"}
    flipped = condition("Accepted", False, "Infeasible", "no room", NOW, previous=was)
    assert (flipped["status"], flipped["lastTransitionTime"]) == ("False", NOW)
    assert "observedGeneration" not in flipped, "written only where the object has a generation to observe"
    assert condition("Accepted", True, "Accepted", "", NOW)["lastTransitionTime"] == NOW


@pytest.mark.parametrize("stored", ["garbage", "2026-12-01", "2026-13-01T00:00:00Z", "2026-06-31T00:00:00Z",
                                    "\uff12026-12-01T00:00:00Z", "", 1764576000, None, ["2026-12-01T00:00:00Z"]])
def test_a_stored_time_the_schema_would_refuse_is_not_written_back(stored: Any) -> None:
    """Written by whoever may write the status, or stored under an older CRD without the schema: carried over, it
    made the API server refuse kubecell's write at every attempt."""
    was = {"type": "Accepted", "status": "True", "lastTransitionTime": stored}
    assert condition("Accepted", True, "Accepted", "", NOW, previous=was)["lastTransitionTime"] == NOW


def test_the_message_is_cut_to_the_apis_limit() -> None:
    assert len(condition("Available", False, "Waiting", "x" * (MAX_MESSAGE + 10), NOW)["message"]) == MAX_MESSAGE
