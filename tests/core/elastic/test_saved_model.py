"""A goodput model saved as JSON (what the sizer keeps in ``status.goodputModel``) and taken up by a new model
answers as the old one did; a value anyone could have written is taken whole or not at all."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubecell.core.elastic.goodput import OnlineGoodput
from kubecell.core.elastic.saved_model import MAX_SHAPES, restore_model, saved_model
from tests.core.elastic.support import TRUE, report, reports, scaled

SHAPES = ((1, 1), (1, 2), (1, 4), (2, 8))


def learned() -> OnlineGoodput:
    """A job seen on two GPU types at several shapes, with noisy gradients measured at two batches."""
    model = OnlineGoodput(initial_bsz=128, max_bsz=4096)
    for item in reports(TRUE, "a100", SHAPES) + reports(scaled(TRUE, 0.4), "t4", SHAPES[:2]):
        model.observe(item)
    model.observe(report(TRUE, "a100", 1, 2, 64, grad=(1.0, 40.0)))
    model.observe(report(TRUE, "a100", 2, 8, 64, grad=(1.0, 90.0)), accumulation_steps=2)
    model.observe(report(TRUE, "a100", 1, 4, 64))  # a known shape again: smoothed
    model.limit_local_batch("t4", 48)  # what its reports on T4s say fits
    return model


def answers(model: OnlineGoodput) -> list[tuple[float, tuple[int, int] | None]]:
    placements = [(t, n, r) for t in ("a100", "t4", "v100") for n, r in ((1, 1), (1, 3), (1, 8), (2, 16), (4, 32))]
    return [(model.goodput(*p), model.best_batch(*p)) for p in placements]


def through_json(value: dict[str, Any]) -> Any:
    return json.loads(json.dumps(value))


def test_a_restored_model_answers_exactly_as_the_saved_one() -> None:
    old = learned()
    value = through_json(saved_model(old))
    new = OnlineGoodput(initial_bsz=128, max_bsz=4096)
    assert restore_model(new, value) is None
    assert answers(new) == answers(old)
    assert new.measurements() == old.measurements()
    assert new.noise.sums == old.noise.sums
    assert new.max_local_bsz == old.max_local_bsz == {"t4": 48}
    assert any(g > 0 for g, _ in answers(new)), "it knows something"
    assert len(json.dumps(value)) < 2000, "small enough for an object's status"


def test_a_model_without_gradient_statistics_is_saved_without_noise() -> None:
    old = OnlineGoodput(initial_bsz=64, max_bsz=64)
    old.observe(report(TRUE, "cpu", 1, 2, 32))
    value = through_json(saved_model(old))
    assert value["noise"] is None
    new = OnlineGoodput(initial_bsz=64, max_bsz=64)
    assert restore_model(new, value) is None
    assert answers(new) == answers(old)
    assert not new.noise.known


def test_only_the_newest_shapes_are_kept() -> None:
    model = OnlineGoodput(initial_bsz=1, max_bsz=1 << 20)
    for local in range(1, 3 * MAX_SHAPES):
        model.observe(report(TRUE, "a100", 1, 1, local))
    value = saved_model(model)
    ((entry),) = value["types"]
    assert [row[2] for row in entry["shapes"]] == list(range(2 * MAX_SHAPES, 3 * MAX_SHAPES))
    assert model.extent == (3 * MAX_SHAPES - 1, ()), "the model itself keeps them all"


def forged(change: str) -> Any:
    value = through_json(saved_model(learned()))
    rows = value["types"][0]["shapes"]
    if change == "not a mapping":
        return [value]
    if change == "other version":
        value["version"] = 2
    elif change == "other batch range":
        value["batchSize"]["max"] = 8192
    elif change == "NaN step":
        rows[0][3] = math.nan
    elif change == "sync above step":
        rows[0][4] = rows[0][3] * 2
    elif change == "negative step":
        rows[0][3] = -1.0
    elif change == "absurd step":
        rows[0][3] = 1e30
    elif change == "string step":
        rows[0][3] = "0.5"
    elif change == "boolean step":
        rows[0][3] = True
    elif change == "more nodes than replicas":
        rows[0][0] = rows[0][1] + 1
    elif change == "float replicas":
        rows[0][1] = 2.0
    elif change == "short row":
        rows[0] = rows[0][:4]
    elif change == "too many shapes":
        value["types"][0]["shapes"] = rows * (MAX_SHAPES // len(rows) + 1)
    elif change == "too many types":
        value["types"] = [dict(value["types"][0], gpuType=f"g{i}") for i in range(9)]
    elif change == "the same type twice":
        value["types"].append(copy.deepcopy(value["types"][0]))
    elif change == "empty type name":
        value["types"][0]["gpuType"] = ""
    elif change == "noise weight above 1":
        value["noise"][0] = 2.0
    elif change == "noise of four sums":
        value["noise"] = value["noise"][:4]
    elif change == "absurd noise ratio":
        value["noise"][3] = 1e6
    elif change == "infinite noise sum":
        value["noise"][2] = math.inf
    elif change == "micro-batch limit zero":
        value["types"][1]["maxLocal"] = 0
    elif change == "micro-batch limit text":
        value["types"][1]["maxLocal"] = "48"
    elif change == "types not a list":
        value["types"] = {"a100": rows}
    return value


FORGERIES = ["not a mapping", "other version", "other batch range", "NaN step", "sync above step", "negative step",
             "absurd step", "string step", "boolean step", "more nodes than replicas", "float replicas", "short row",
             "too many shapes", "too many types", "the same type twice", "empty type name", "noise weight above 1",
             "noise of four sums", "absurd noise ratio", "infinite noise sum", "types not a list",
             "micro-batch limit zero", "micro-batch limit text"]


@pytest.mark.parametrize("change", FORGERIES)
def test_a_value_that_fails_any_check_is_dropped_whole(change: str) -> None:
    model = OnlineGoodput(initial_bsz=128, max_bsz=4096)
    problem = restore_model(model, forged(change))
    assert problem, f"{change}: a reason is given"
    assert model.measurements() == {}, "nothing of it was taken"
    assert not model.noise.known


def test_a_model_that_has_learned_is_not_overwritten() -> None:
    model = OnlineGoodput(initial_bsz=128, max_bsz=4096)
    model.observe(report(TRUE, "a100", 1, 1, 64))
    before = model.measurements()
    assert restore_model(model, through_json(saved_model(learned()))) == "the model has already learned from reports"
    assert model.measurements() == before


def nested(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=10), inner, max_size=6)


@settings(max_examples=60, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8), nested,
                    max_leaves=40))
def test_whatever_is_written_there_never_raises(value: Any) -> None:
    model = OnlineGoodput(initial_bsz=128, max_bsz=4096)
    problem = restore_model(model, value)
    assert problem is not None
    assert model.measurements() == {}
