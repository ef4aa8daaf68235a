"""The ElasticJob status parser: anyone with status rights may write it, so whatever it holds reads as a bounded
default, never as an exception that stops the job's reconcile."""

from __future__ import annotations

from typing import Any

import pytest

from kubecell.elastic.states import Phase
from kubecell.elastic.status import MAX_CONDITIONS, StatusView, condition, read_status

GOOD_TIME = "2026-11-25T12:00:00Z"


@pytest.mark.parametrize("conditions", [5, "Available", {"type": "Available"}, True, None])
def test_conditions_that_are_not_a_list_read_as_none(conditions: Any) -> None:
    view = read_status({"status": {"phase": "Running", "conditions": conditions}})
    assert view.conditions == ()
    assert view.phase is Phase.RUNNING


def test_at_most_the_schemas_conditions_are_read() -> None:
    listed = [{"type": f"T{i}", "status": "True"} for i in range(10_000)]
    assert len(read_status({"status": {"conditions": listed}}).conditions) == MAX_CONDITIONS


@pytest.mark.parametrize(("written", "read"), [(True, 0), (-3, 0), (2**70, 0), ("7", 0), (None, -1), (7, 7)])
def test_observed_generation_is_a_bounded_count(written: Any, read: int) -> None:
    assert read_status({"status": {"observedGeneration": written}}).observed_generation == read


@pytest.mark.parametrize("status", [None, [], "Running", 3])
def test_a_status_that_is_not_an_object_is_the_default(status: Any) -> None:
    assert read_status({"status": status}) == StatusView()


@pytest.mark.parametrize("since", [12345, "yesterday", None, {"t": 1}])
def test_an_edited_transition_time_is_not_written_back(since: Any) -> None:
    previous = ({"type": "Available", "status": "True", "lastTransitionTime": since},)
    written = condition("Available", True, "Running", "ok", 3, previous, GOOD_TIME)
    assert written["lastTransitionTime"] == GOOD_TIME


def test_a_valid_transition_time_stays_while_the_status_does() -> None:
    previous = ({"type": "Available", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"},)
    assert condition("Available", True, "Running", "", 3, previous, GOOD_TIME)["lastTransitionTime"] == \
        "2026-01-01T00:00:00Z"
    assert condition("Available", False, "Restarting", "", 3, previous, GOOD_TIME)["lastTransitionTime"] == GOOD_TIME
