"""The step report's one format and its reader (``kubecell.kube.step_reports``), without a cluster.

A report built by ``build_step_report`` (what the worker's ``StepReporter`` writes) reads back exactly, the
accumulated step converted to its synchronising micro-step; then a table of hostile annotations and Pod
objects, each answered by a specific ``ReportProblem`` (reason, and a message naming the field and value);
then property-based: random JSON, and valid reports mutated field by field, never raise and never take long.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubecell.core.elastic.goodput import OnlineGoodput
from kubecell.core.elastic.types import StepReport
from kubecell.kube.names import ANNOTATION_STEP_REPORT
from kubecell.kube.step_reports import (
    FORMAT_VERSION,
    MAX_REPORT_CHARS,
    REASONS,
    ParsedReport,
    ReportProblem,
    build_step_report,
    read_step_report,
)

NOW = 1_750_000_000.0
VALID: dict[str, Any] = {"time": NOW - 5.0, "replicas": 8, "nodes": 2, "local_batch": 32, "accumulation_steps": 1,
                         "step_seconds": 0.5, "sync_seconds": 0.1, "grad_sqr": 0.25, "grad_var": 4.0, "steps": 12}
FAST = settings(max_examples=300, deadline=timedelta(seconds=1), derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def pod(annotation: object) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "bert-worker-0", "namespace": "ml",
                         "annotations": {ANNOTATION_STEP_REPORT: annotation}}}


def wire(**changes: Any) -> dict[str, Any]:
    """A valid report as a JSON object, with ``changes`` (wire key -> value; ``...`` deletes the key)."""
    body: dict[str, Any] = json.loads(build_step_report(**VALID))
    for key, value in changes.items():
        if value is ...:
            del body[key]
        else:
            body[key] = value
    return body


def read(annotation: object, **options: Any) -> ParsedReport | ReportProblem | None:
    return read_step_report(pod(annotation), gpu_type="V100", now=NOW, **options)


def test_a_report_round_trips_exactly() -> None:
    text = build_step_report(**VALID)
    assert len(text) <= MAX_REPORT_CHARS
    assert json.loads(text) == {"v": FORMAT_VERSION, "time": NOW - 5.0, "replicas": 8, "nodes": 2, "localBatch": 32,
                                "accumulationSteps": 1, "stepSeconds": 0.5, "syncSeconds": 0.1, "gradSqr": 0.25,
                                "gradVar": 4.0, "steps": 12}
    parsed = read(text)
    assert parsed == ParsedReport(report=StepReport(gpu_type="V100", num_nodes=2, num_replicas=8, local_bsz=32,
                                                    step_time=0.5, sync_time=0.1, grad_sqr=0.25, grad_var=4.0),
                                  time=NOW - 5.0, steps=12, accumulation_steps=1)
    assert OnlineGoodput(initial_bsz=32, max_bsz=4096).observe(parsed.report)


def test_an_accumulated_step_becomes_its_synchronising_micro_step() -> None:
    """4 micro-batches of 32 in 2.1 s, 0.1 s of it synchronising: 0.5 s of compute per micro-batch, so the
    model's one synchronising micro-step of 32 examples takes 0.6 s (not 2.1 s, nor a batch of 128)."""
    text = build_step_report(**{**VALID, "accumulation_steps": 4, "step_seconds": 2.1, "grad_sqr": None,
                                "grad_var": None})
    parsed = read(text)
    assert isinstance(parsed, ParsedReport)
    assert parsed.accumulation_steps == 4
    assert parsed.report.local_bsz == 32
    assert parsed.report.step_time == pytest.approx(0.6)
    assert parsed.report.sync_time == 0.1
    assert (parsed.report.grad_sqr, parsed.report.grad_var) == (None, None)


def test_the_largest_micro_batch_the_worker_fits_is_read_where_it_is_stated() -> None:
    text = build_step_report(**VALID, max_local_batch=48)
    assert json.loads(text)["maxLocalBatch"] == 48
    parsed = read(text)
    assert isinstance(parsed, ParsedReport)
    assert parsed.max_local_batch == 48
    for unstated in (build_step_report(**VALID), json.dumps(wire(maxLocalBatch=None))):
        parsed = read(unstated)
        assert isinstance(parsed, ParsedReport)
        assert parsed.max_local_batch is None


def test_no_annotation_is_no_problem() -> None:
    assert read_step_report({"metadata": {"name": "p"}}, gpu_type="V100", now=NOW) is None
    assert read_step_report({"metadata": {"annotations": {}}}, gpu_type="V100", now=NOW) is None
    assert read_step_report({"metadata": {"annotations": None}}, gpu_type="V100", now=NOW) is None
    assert read(None) is None


def test_a_report_of_one_replica_without_sync_is_trusted() -> None:
    parsed = read(build_step_report(**{**VALID, "replicas": 1, "nodes": 1, "sync_seconds": 0.0}))
    assert isinstance(parsed, ParsedReport)
    assert (parsed.report.num_replicas, parsed.report.sync_time) == (1, 0.0)


def test_unknown_keys_are_ignored() -> None:
    """A later writer may add keys without a new version; a reader of version 1 reads what it knows."""
    assert isinstance(read(json.dumps(wire(tokensPerSecond=1234.5))), ParsedReport)


class Weird(Mapping[str, Any]):
    """A Pod object whose every access raises: what a broken caller could hand over."""

    def __getitem__(self, key: str) -> Any:
        raise RuntimeError("boom")

    def __iter__(self) -> Any:
        raise RuntimeError("boom")

    def __len__(self) -> int:
        return 1


HOSTILE_PODS: list[tuple[str, object, str, str]] = [
    ("metadata not an object", {"metadata": "x"}, "MalformedPod", "metadata is 'x'"),
    ("metadata a list", {"metadata": [1, 2]}, "MalformedPod", "metadata is [1, 2]"),
    ("annotations a list", {"metadata": {"annotations": ["a"]}}, "MalformedPod", "metadata.annotations is ['a']"),
    ("the pod a list", [1], "MalformedPod", "the Pod is a list"),
    ("a mapping that raises", Weird(), "MalformedPod", "boom"),
]


@pytest.mark.parametrize(("case", "obj", "reason", "fragment"), HOSTILE_PODS, ids=[c[0] for c in HOSTILE_PODS])
def test_a_hostile_pod_object_is_a_problem(case: str, obj: Any, reason: str, fragment: str) -> None:
    problem = read_step_report(obj, gpu_type="V100", now=NOW)
    assert isinstance(problem, ReportProblem), case
    assert problem.reason == reason
    assert fragment in problem.message


DEEP = "[" * 5000 + "]" * 5000
HOSTILE: list[tuple[str, object, str, str]] = [
    # structure
    ("not text", 12, "MalformedReport", "is a int, not text"),
    ("10 MB", "x" * 10_000_000, "MalformedReport", "10000000 characters long"),
    ("just over 1 KiB", json.dumps(wire(pad="x" * 1000)), "MalformedReport", "at most 1024 characters"),
    ("not JSON", "{v: 1}", "MalformedReport", "not JSON"),
    ("empty", "", "MalformedReport", "not JSON"),
    ("a list", "[1, 2]", "MalformedReport", "[1, 2], not a JSON object"),
    ("a string", '"report"', "MalformedReport", "'report', not a JSON object"),
    ("repeated key", '{"v": 1, "v": 1}', "MalformedReport", "has the key 'v' twice (accepted: each key once)"),
    ("a 30-digit integer", json.dumps(wire()).replace('"replicas": 8', '"replicas": ' + "9" * 30),
     "MalformedReport", "has 30 digits"),
    # version
    ("no version", json.dumps(wire(v=...)), "MalformedReport", "v (the format's version) is missing"),
    ("version as text", json.dumps(wire(v="1")), "MalformedReport", "v '1' is not an integer"),
    ("version a bool", json.dumps(wire(v=True)), "MalformedReport", "v True is not an integer"),
    ("version 2", json.dumps(wire(v=2)), "UnsupportedVersion", "v 2"),
    # fields
    ("time missing", json.dumps(wire(time=...)), "MalformedReport", "time is missing"),
    ("time as text", json.dumps(wire(time="now")), "MalformedReport", "time 'now' is not a number"),
    ("time NaN", json.dumps(wire()).replace(f'"time": {NOW - 5.0}', '"time": NaN'), "MalformedReport",
     "time nan is not a finite number"),
    ("time Infinity", json.dumps(wire()).replace(f'"time": {NOW - 5.0}', '"time": Infinity'), "MalformedReport",
     "time inf"),
    ("step 1e400", json.dumps(wire()).replace('"stepSeconds": 0.5', '"stepSeconds": 1e400'), "MalformedReport",
     "stepSeconds inf"),
    ("step -Infinity", json.dumps(wire()).replace('"stepSeconds": 0.5', '"stepSeconds": -Infinity'),
     "MalformedReport", "stepSeconds -inf"),
    ("step NaN", json.dumps(wire()).replace('"stepSeconds": 0.5', '"stepSeconds": NaN'), "MalformedReport",
     "stepSeconds nan"),
    ("replicas a bool", json.dumps(wire(replicas=True)), "MalformedReport", "replicas True is not an integer"),
    ("replicas a float", json.dumps(wire(replicas=8.0)), "MalformedReport", "replicas 8.0 is not an integer"),
    ("replicas negative", json.dumps(wire(replicas=-8)), "MalformedReport", "replicas -8 is below 1"),
    ("nodes zero", json.dumps(wire(nodes=0)), "MalformedReport", "nodes 0 is below 1"),
    ("local batch text", json.dumps(wire(localBatch="32")), "MalformedReport", "localBatch '32' is not an integer"),
    ("local batch missing", json.dumps(wire(localBatch=...)), "MalformedReport", "localBatch is missing"),
    ("accumulation zero", json.dumps(wire(accumulationSteps=0)), "MalformedReport", "accumulationSteps 0 is below 1"),
    ("accumulation huge", json.dumps(wire(accumulationSteps=2**40)), "MalformedReport",
     "accumulationSteps 1099511627776 is above"),
    ("steps zero", json.dumps(wire(steps=0)), "MalformedReport", "steps 0 is below 1"),
    ("max local batch below the one it ran", json.dumps(wire(maxLocalBatch=16)), "MalformedReport",
     "maxLocalBatch 16 is below 32"),
    ("max local batch text", json.dumps(wire(maxLocalBatch="64")), "MalformedReport",
     "maxLocalBatch '64' is not an integer"),
    ("max local batch a bool", json.dumps(wire(maxLocalBatch=True)), "MalformedReport",
     "maxLocalBatch True is not an integer"),
    ("max local batch huge", json.dumps(wire(maxLocalBatch=2**40)), "MalformedReport",
     "maxLocalBatch 1099511627776 is above"),
    ("sync a bool", json.dumps(wire(syncSeconds=False)), "MalformedReport", "syncSeconds False is not a number"),
    ("sync nested", json.dumps(wire(syncSeconds={"a": [1]})), "MalformedReport",
     "syncSeconds {'a': [1]} is not a number"),
    ("grad text", json.dumps(wire(gradSqr="big")), "MalformedReport", "gradSqr 'big' is not a number"),
    ("grad missing", json.dumps(wire(gradVar=...)), "MalformedReport", "gradVar is missing"),
    ("a long text value", json.dumps(wire(stepSeconds="y" * 800)), "MalformedReport", "stepSeconds 'yyyy"),
    # time
    ("stale", json.dumps(wire(time=NOW - 601.0)), "StaleReport", "601 s old"),
    ("from the future", json.dumps(wire(time=NOW + 61.0)), "FutureReport", "61 s in the future"),
    ("from the far future", json.dumps(wire(time=1e30)), "FutureReport", "time 1e+30"),
    ("from the epoch", json.dumps(wire(time=0)), "StaleReport", "time 0.0"),
    # well formed, not trusted (goodput.refusal)
    ("negative step", json.dumps(wire(stepSeconds=-0.5)), "UntrustedReport", "step_time -0.5"),
    ("zero step", json.dumps(wire(stepSeconds=0, syncSeconds=0, replicas=1, nodes=1)), "UntrustedReport",
     "step_time 0.0"),
    ("step 1e30", json.dumps(wire(stepSeconds=1e30)), "UntrustedReport", "stepSeconds 1e+30"),
    ("negative sync", json.dumps(wire(syncSeconds=-0.1)), "UntrustedReport", "sync_time -0.1"),
    ("sync above step", json.dumps(wire(syncSeconds=0.9)), "UntrustedReport", "sync_time 0.9 s is not below"),
    ("no sync with 8 replicas", json.dumps(wire(syncSeconds=0)), "UntrustedReport", "sync_time 0 with 8 replicas"),
    ("more nodes than replicas", json.dumps(wire(nodes=9)), "UntrustedReport", "num_nodes 9 outside"),
    ("replicas beyond the core's bound", json.dumps(wire(replicas=2**40, nodes=1)), "UntrustedReport",
     "num_replicas 1099511627776"),
    ("negative gradient variance", json.dumps(wire(gradVar=-1.0)), "UntrustedReport", "grad_var -1.0"),
    ("gradient 1e308 squared is fine, negative is not", json.dumps(wire(gradSqr=-1e308)), "UntrustedReport",
     "grad_sqr -1e+308"),
]


@pytest.mark.parametrize(("case", "annotation", "reason", "fragment"), HOSTILE, ids=[c[0] for c in HOSTILE])
def test_a_hostile_report_is_a_specific_problem(case: str, annotation: object, reason: str, fragment: str) -> None:
    started = time.monotonic()
    problem = read(annotation)
    assert time.monotonic() - started < 1.0, "a hostile report is answered quickly"
    assert isinstance(problem, ReportProblem), f"{case}: {problem!r}"
    assert problem.reason == reason, problem
    assert problem.reason in REASONS
    assert fragment in problem.message, problem.message
    assert len(problem.message) <= 400


def test_deep_nesting_is_a_problem_not_a_crash() -> None:
    """Nesting is bounded by the length (1 KiB) before the parser sees it; within it, a nesting the parser
    refuses (its recursion limit) and one it reads are both a problem with the field they sit in."""
    for text in (DEEP, "[" * 1000, json.dumps(wire()).replace('"syncSeconds": 0.1', '"syncSeconds": ' + DEEP[:400]
                                                              + "]" * 400)):
        problem = read(text)
        assert isinstance(problem, ReportProblem)
        assert problem.reason == "MalformedReport"
        assert any(part in problem.message for part in ("characters long", "nests deeper", "not JSON",
                                                        "syncSeconds [[[")), problem.message


def test_the_gpu_type_and_the_job_batch_limit_are_checked_as_observe_does() -> None:
    text = build_step_report(**VALID)
    empty = read_step_report(pod(text), gpu_type="", now=NOW)
    assert isinstance(empty, ReportProblem)
    assert (empty.reason, empty.message) == ("UntrustedReport", "gpu_type is not a non-empty string")
    too_big = read(text, max_bsz=16)
    assert isinstance(too_big, ReportProblem)
    assert too_big.message == "local_bsz 32 outside 1..16"


def test_the_age_limit_is_the_callers() -> None:
    text = build_step_report(**{**VALID, "time": NOW - 100.0})
    assert isinstance(read(text), ParsedReport)
    stale = read(text, max_age_seconds=30.0)
    assert isinstance(stale, ReportProblem)
    assert stale.reason == "StaleReport"
    assert isinstance(read(build_step_report(**{**VALID, "time": NOW + 59.0})), ParsedReport), "clock skew"


def test_the_builder_refuses_what_json_cannot_hold() -> None:
    with pytest.raises(ValueError, match="JSON"):
        build_step_report(**{**VALID, "step_seconds": float("nan")})


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                        max_size=4),
                           max_leaves=20)


@FAST
@given(body=st.dictionaries(st.sampled_from([*wire().keys(), "x"]), JSON_VALUES, max_size=12))
def test_random_objects_never_raise(body: dict[str, Any]) -> None:
    answer = read(json.dumps(body))
    assert answer is None or isinstance(answer, ParsedReport | ReportProblem)


@FAST
@given(key=st.sampled_from(list(wire().keys())), value=JSON_VALUES)
def test_a_valid_report_with_one_field_replaced_never_raises(key: str, value: Any) -> None:
    answer = read(json.dumps(wire(**{key: value})))
    assert isinstance(answer, ParsedReport | ReportProblem)
    if isinstance(answer, ParsedReport):
        assert OnlineGoodput(initial_bsz=1, max_bsz=1 << 30).observe(answer.report), "what is read is observed"


@FAST
@given(text=st.text(max_size=300))
def test_random_text_never_raises(text: str) -> None:
    answer = read(text)
    assert isinstance(answer, ParsedReport | ReportProblem)
