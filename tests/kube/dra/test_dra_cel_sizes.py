"""Selectors whose evaluation builds values far larger than their input.

Calls that build far more than they read are priced by what they build.

``replace("", s)`` puts ``s`` between every two characters, ``join`` repeats its separator, ``split("")``
makes one string per character. Priced by their input alone, a 9 KB selector that replaced twice was
estimated at 900,905 and admitted, and built a 27-billion-character string in one step of the evaluator
(before the run-time budget is looked at): the process was killed for its memory.
"""

from __future__ import annotations

import time
import tracemalloc

import pytest
from celpy.evaluation import CELEvalError

from kubecell.kube.dra.cel import DEVICE_SECONDS, CelDevice, SelectorError, SelectorTimeoutError, compile_selector
from kubecell.kube.dra.cel_library import FUNCTIONS, MAX_BUILT, compile_regex

A = "a" * 3000
B = "b" * 3000
DEVICE = CelDevice.of("gpu.kubecell.io", {"uuid": "GPU-1", "model": "A100-SXM4-40GB"})

BUILDERS = [
    f'"{A}".replace("", "{B}").replace("", "{B}").size() > 0',
    f'"{A}".split("").join("{B}").split("").size() > 0',
    f'"{A}".split("").map(x, "{"b" * 2000}").join("").replace("", "{"c" * 1000}").size() > 0',
]


@pytest.mark.parametrize("expression", BUILDERS, ids=["replace-twice", "split-join-split", "map-join-replace"])
def test_what_a_call_builds_is_priced(expression: str) -> None:
    with pytest.raises(SelectorError) as raised:
        compile_selector(expression)
    assert raised.value.kind == "cost"


def test_usual_string_work_is_still_admitted() -> None:
    device = CelDevice.of("gpu.kubecell.io", {"model": "A100-SXM4-40GB"})
    selector = compile_selector('device.attributes["gpu.kubecell.io"].model.replace("-", "_").split("_")'
                                '.join("/") == "A100/SXM4/40GB"')
    assert selector.matches(device) is True


def test_a_replacement_longer_than_the_budget_is_not_built() -> None:
    """The run-time budget is looked at after each step: a string that spends all of it is refused before it
    is built, whatever the estimate said."""
    found = FUNCTIONS["replace"]("a" * 10_000, "", "b" * 10_000)
    assert isinstance(found, CELEvalError)
    assert "actual cost limit exceeded" in str(found.args[0])
    assert MAX_BUILT < (10_000 + 1) * 10_000
    assert FUNCTIONS["replace"]("a-b", "-", "_") == "a_b"


# Errors joined by || and && (and by all() and exists(), which join their items so): cel-python's own operators
# raise a TypeError holding the repr of both operands, and an error's repr holds its cause's, escaped again at
# every level, so the text doubled with each error joined. A 45-byte exists() over 30 items of an error, or
# a chain of 100 errored comparisons, took gigabytes (the process was killed for its memory).
ITEMS = ",".join(str(i) for i in range(20))
JOINED = [
    f"[{ITEMS}].exists(x, 1 / (x - x) == 1)",
    f"[{ITEMS}].all(x, 1 / (x - x) == 1)",
    " || ".join(["1 / 0 == 1"] * 48),
    " && ".join(["1 / 0 == 1"] * 48),
    "!(" * 19 + "1 / 0 == 1" + " || 1 / 0 == 1)" * 19,
]


@pytest.mark.parametrize("expression", JOINED, ids=["exists", "all", "or-chain", "and-chain", "not-nesting"])
def test_joined_errors_take_no_more_memory_than_one(expression: str) -> None:
    selector = compile_selector(expression)
    tracemalloc.start()
    try:
        with pytest.raises(SelectorError) as raised:
            selector.matches(DEVICE)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20
    assert raised.value.kind == "runtime"
    assert "divide by zero" in raised.value.reason  # the cause, not "no matching overload for _||_"


DECIDED = [
    ("true || 1 / 0 == 1", True),
    ("1 / 0 == 1 || true", True),
    ("false && 1 / 0 == 1", False),
    ("1 / 0 == 1 && false", False),
    ("false || false", False),
    ("true && true", True),
    ("[0, 1].exists(x, 1 / x == 1)", True),
    ("[0, 1].all(x, 1 / x == 5)", False),
    ("[1, 2].all(x, x > 0)", True),
    ("[1, 2].exists(x, x > 5)", False),
    ("[].all(x, x > 5) && ![].exists(x, x > 5)", True),
    ('{"a": 1}.exists(k, k == "a")', True),
]


@pytest.mark.parametrize(("expression", "expected"), DECIDED, ids=[c[0] for c in DECIDED])
def test_an_error_is_absorbed_where_the_other_side_decides(expression: str, expected: bool) -> None:
    assert compile_selector(expression).matches(DEVICE) is expected


def test_an_undecided_error_is_the_selectors_error() -> None:
    for expression in ("1 / 0 == 1 || false", "true && 1 / 0 == 1", "[0].all(x, 1 / x == 1)",
                       "[0, 1].exists(x, 1 / x == 5)"):
        with pytest.raises(SelectorError, match="divide by zero"):
            compile_selector(expression).matches(DEVICE)


def test_patterns_built_at_run_time_are_timed_one_by_one() -> None:
    """RE2 takes long over some short patterns: ``\\pL{300}`` (9 characters) compiles in some 0.2 s here. The clock
    was read every 256 steps only, about five such compiles in this selector, so it ran some five compiles past the
    50 ms a device is given; a compile now brings the next clock reading forward: one compile past at most."""
    compile_regex.cache_clear()
    began = time.monotonic()
    compile_regex("\\pL{299}")
    one = time.monotonic() - began
    selector = compile_selector('[0,1,2,3,4,5,6,7,8,9].exists(i, [0,1,2,3,4,5,6,7,8,9].exists(j, '
                                '"a".matches("\\\\pL{" + string(200 + i * 10 + j) + "}")))')
    began = time.monotonic()
    with pytest.raises(SelectorTimeoutError):
        selector.matches(DEVICE, deadline=began + 60)
    took = time.monotonic() - began
    assert took < DEVICE_SECONDS + 2.5 * one, f"{took:.2f} s, one compile {one:.2f} s"
