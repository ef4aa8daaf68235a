"""The step report of an elastic worker (``kubecell.io/step-report``): its one format definition, the
builder the worker side writes with (``kubecell.elastic.report.StepReporter``), and the scheduler side's
reader, which trusts nothing in it.

**Why an annotation on the worker's own Pod.** The scheduler already lists and watches Pods, so a report
there costs no new API, no new endpoint in the training container and no new credentials beyond ``patch`` on
``pods`` in the job's namespace (``deploy/elastic/worker-rbac.yaml``); the report dies with its Pod, so a
worker scaled away leaves nothing stale behind.

**The format** (version 1, compact JSON, at most ``MAX_REPORT_CHARS`` characters)::

    {"v": 1, "time": 1718000000.5, "replicas": 8, "nodes": 2, "localBatch": 32, "accumulationSteps": 1,
     "stepSeconds": 0.412, "syncSeconds": 0.051, "gradSqr": 0.8, "gradVar": 12.5, "steps": 73}

``time`` is the writer's wall clock (Unix seconds) when it wrote; ``replicas`` and ``nodes`` are the torchrun
world it measured in (``WORLD_SIZE`` and ``WORLD_SIZE // LOCAL_WORLD_SIZE``); ``localBatch`` is the
*micro-batch* one replica processes per forward/backward pass, ``accumulationSteps`` how many micro-batches
one optimizer step accumulates; ``stepSeconds`` is the mean wall time of one *optimizer* step (every
micro-batch and the synchronisation included) and ``syncSeconds`` the part of it spent waiting for gradient
synchronisation; ``gradSqr``/``gradVar`` are Pollux's gradient statistics (or ``null``), and ``steps`` how
many optimizer steps the means cover. Optional: ``maxLocalBatch``, the largest micro-batch the worker's script
fits in one GPU's memory (at least ``localBatch``; what it accumulates beyond), so that the scheduler prices a
larger batch on this GPU model as the job will run it (micro-batches of at most that, accumulated) and not as
one micro-batch that never fitted. A reader ignores keys it does not know (a later writer may add some without
a new version); a change of meaning of a key is a new ``v``.

**From the wire to a** ``StepReport``. ``OnlineGoodput`` keys its measurements by ``(nodes, replicas,
local_bsz)`` with ``local_bsz`` the micro-batch, and fits every measurement as one *synchronising* micro-step
(``throughput.step_time`` with ``accum_steps = 1``: compute, then the synchronisation it may overlap). An
optimizer step that accumulates ``k`` micro-batches spends ``k - 1`` of them in compute alone
(``T_step = (k - 1) T_c + T_sync_step``), so reporting its whole time would charge ``k`` micro-batches of
compute to one and make every other placement look slower. The reader therefore keeps ``local_bsz =
localBatch`` and converts the step to its synchronising micro-step: compute per micro-batch is ``(stepSeconds
- syncSeconds) / k`` (the time not spent waiting on synchronisation, shared by the ``k`` micro-batches) and
``step_time = (stepSeconds - syncSeconds) / k + syncSeconds``, ``sync_time = syncSeconds``: exact for
``k = 1`` and for no overlap, and never below ``sync_time`` (``refusal`` still holds). Folding ``k`` into the
batch instead (``local_bsz = localBatch * k``) would tell the model of a micro-batch that never fitted in
memory and of ``k`` times its per-micro-batch overhead. ``StepReport`` has no accumulation field; the reported
``accumulationSteps`` is kept on :class:`ParsedReport`, and the sizer hands it to ``OnlineGoodput.observe``,
which places the gradient statistics at the whole global batch they were measured at.

**Untrusted input.** Anyone who can patch a Pod in the namespace writes this annotation, and a worker's
script may be broken. :func:`read_step_report` never raises, whatever the Pod object holds: it answers
``None`` (no report, which is no problem), a :class:`ParsedReport`, or a :class:`ReportProblem` whose reason is
one of ``REASONS`` and whose message names the field and the value (shortened). After the structure it
applies ``kubecell.core.elastic.goodput.refusal`` to the ``StepReport`` built, so a report it returns is one
``OnlineGoodput.observe`` accepts (with the same ``max_bsz``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from kubecell.core.elastic.goodput import refusal, synchronising_step_seconds
from kubecell.core.elastic.types import StepReport
from kubecell.core.shown import shown
from kubecell.kube.annotation_json import AnnotationJsonError, load_annotation_json
from kubecell.kube.names import ANNOTATION_STEP_REPORT

FORMAT_VERSION: Final = 1
MAX_REPORT_CHARS: Final = 1024
"""The most characters a report may have: a version-1 report is under 300, and the scheduler reads one per
worker per round."""
MAX_CLOCK_SKEW_SECONDS: Final = 60.0
"""How far in the future (by the reader's clock) a report's ``time`` may be: node clocks drift by seconds,
not minutes; beyond that the time, and so its staleness, means nothing."""
MAX_ACCUMULATION_STEPS: Final = 1 << 20
MAX_STEPS: Final = 1 << 40
MAX_LOCAL_BATCH: Final = 1 << 31
"""Bounds no real job reaches: a larger value is a broken writer, not a measurement."""

# The keys of version 1, in the order the builder writes them.
KEY_VERSION: Final = "v"
KEY_TIME: Final = "time"
KEY_REPLICAS: Final = "replicas"
KEY_NODES: Final = "nodes"
KEY_LOCAL_BATCH: Final = "localBatch"
KEY_ACCUMULATION_STEPS: Final = "accumulationSteps"
KEY_STEP_SECONDS: Final = "stepSeconds"
KEY_SYNC_SECONDS: Final = "syncSeconds"
KEY_GRAD_SQR: Final = "gradSqr"
KEY_GRAD_VAR: Final = "gradVar"
KEY_STEPS: Final = "steps"
KEY_MAX_LOCAL_BATCH: Final = "maxLocalBatch"

REASON_MALFORMED_POD: Final = "MalformedPod"
REASON_MALFORMED: Final = "MalformedReport"
REASON_UNSUPPORTED_VERSION: Final = "UnsupportedVersion"
REASON_STALE: Final = "StaleReport"
REASON_FUTURE: Final = "FutureReport"
REASON_UNTRUSTED: Final = "UntrustedReport"
REASONS: Final = (REASON_MALFORMED_POD, REASON_MALFORMED, REASON_UNSUPPORTED_VERSION, REASON_STALE, REASON_FUTURE,
                  REASON_UNTRUSTED)
"""Every reason a :class:`ReportProblem` may give: the object is not a Pod's shape; the annotation is not a
version-1 report's structure; a version this reader does not know; older than ``max_age_seconds``; dated
beyond the clock skew allowed; a well-formed report ``refusal`` does not trust."""


@dataclass(frozen=True, slots=True)
class ReportProblem:
    """Why a Pod's step report was not used: ``reason`` is one of ``REASONS`` (for an Event or a metric label),
    ``message`` names the field and the value."""

    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class ParsedReport:
    """A step report read and trusted: the ``StepReport`` for ``OnlineGoodput.observe`` and what the wire said
    beyond it. ``time`` (the writer's Unix seconds) is how a caller tells a new report from the one it already
    consumed: it remembers the last ``time`` per Pod and skips a report that is not newer."""

    report: StepReport
    time: float
    steps: int
    """Optimizer steps the means cover: a report of 1 step is noisier than one of 100."""
    accumulation_steps: int
    """Micro-batches per optimizer step the worker said it ran (see the module on why ``report`` holds the
    synchronising micro-step and not the whole step)."""
    max_local_batch: int | None = None
    """The largest micro-batch its GPU's memory holds, as the worker's script says (None: not said)."""


def build_step_report(*, time: float, replicas: int, nodes: int, local_batch: int, accumulation_steps: int,
                      step_seconds: float, sync_seconds: float, grad_sqr: float | None, grad_var: float | None,
                      steps: int, max_local_batch: int | None = None) -> str:
    """The annotation's text for these values: the one writer of the format (the worker's reporter and the
    tests use it). Compact JSON with the keys in a fixed order; raises ``ValueError`` for a non-finite number
    (JSON has none) or a text longer than ``MAX_REPORT_CHARS``, which only non-finite or absurd inputs reach."""
    body = {KEY_VERSION: FORMAT_VERSION, KEY_TIME: float(time), KEY_REPLICAS: int(replicas), KEY_NODES: int(nodes),
            KEY_LOCAL_BATCH: int(local_batch), KEY_ACCUMULATION_STEPS: int(accumulation_steps),
            KEY_STEP_SECONDS: float(step_seconds), KEY_SYNC_SECONDS: float(sync_seconds),
            KEY_GRAD_SQR: None if grad_sqr is None else float(grad_sqr),
            KEY_GRAD_VAR: None if grad_var is None else float(grad_var), KEY_STEPS: int(steps)}
    if max_local_batch is not None:
        body[KEY_MAX_LOCAL_BATCH] = int(max_local_batch)
    text = json.dumps(body, separators=(",", ":"), allow_nan=False)
    if len(text) > MAX_REPORT_CHARS:
        raise ValueError(f"a step report of {len(text)} characters is over {MAX_REPORT_CHARS}")
    return text


def read_step_report(pod: Mapping[str, Any], *, gpu_type: str, now: float, max_age_seconds: float = 600.0,
                     max_bsz: int | None = None) -> ParsedReport | ReportProblem | None:
    """The step report on ``pod`` (a Pod object as the API returns it), measured on ``gpu_type`` GPUs:
    ``None`` when the Pod carries none, a :class:`ParsedReport` when it is well formed, current (``now``,
    Unix seconds of the reader's wall clock, minus its ``time`` is at most ``max_age_seconds``, and it is at
    most ``MAX_CLOCK_SKEW_SECONDS`` in the future) and trusted by ``goodput.refusal`` (with ``max_bsz``), else
    a :class:`ReportProblem`. Never raises."""
    try:
        return _read(pod, gpu_type=gpu_type, now=now, max_age_seconds=max_age_seconds, max_bsz=max_bsz)
    except Exception as error:  # a Mapping whose methods raise: still an answer, never an exception
        return ReportProblem(REASON_MALFORMED_POD, f"the Pod object could not be read: {shown(str(error))}")


class _MalformedError(Exception):
    def __init__(self, message: str, reason: str = REASON_MALFORMED) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason


def _annotation(pod: Mapping[str, Any]) -> object:
    if not isinstance(pod, Mapping):
        raise _MalformedError(f"the Pod is a {type(pod).__name__}, not an object", REASON_MALFORMED_POD)
    metadata = pod.get("metadata")
    if not isinstance(metadata, Mapping):
        raise _MalformedError(f"metadata is {shown(metadata)}, not an object", REASON_MALFORMED_POD)
    annotations = metadata.get("annotations")
    if annotations is None:
        return None
    if not isinstance(annotations, Mapping):
        raise _MalformedError(f"metadata.annotations is {shown(annotations)}, not an object", REASON_MALFORMED_POD)
    return annotations.get(ANNOTATION_STEP_REPORT)


def _parse(text: object) -> dict[str, Any]:
    try:
        raw = load_annotation_json(text, max_chars=MAX_REPORT_CHARS, unique_keys=True)
    except AnnotationJsonError as error:
        where = " at " + "".join(f"[{part!r}]" for part in error.path) + ":" if error.path else ""
        accepted = f" (accepted: {error.accepted})" if error.accepted else ""
        raise _MalformedError(f"the annotation{where} {error.message}{accepted}") from None
    except json.JSONDecodeError as error:
        raise _MalformedError(f"the annotation is not JSON: {error.msg} at character {error.pos}") from None
    if not isinstance(raw, dict):
        raise _MalformedError(f"the annotation is {shown(raw)}, not a JSON object")
    return raw


def _integer(raw: Mapping[str, Any], key: str, low: int, high: int | None = None) -> int:
    """A JSON integer of at least ``low`` (and at most ``high``): not a boolean, not ``2.0``."""
    if key not in raw:
        raise _MalformedError(f"{key} is missing")
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise _MalformedError(f"{key} {shown(value)} is not an integer")
    if value < low:
        raise _MalformedError(f"{key} {shown(value)} is below {low}")
    if high is not None and value > high:
        raise _MalformedError(f"{key} {shown(value)} is above {high}")
    return value


def _number(raw: Mapping[str, Any], key: str) -> float:
    """A finite JSON number: an integer or a float, not a boolean, not ``NaN`` or ``Infinity`` (which Python's
    parser accepts and JSON does not), and not a number too large for a float (``1e400``)."""
    if key not in raw:
        raise _MalformedError(f"{key} is missing")
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _MalformedError(f"{key} {shown(value)} is not a number")
    number = float(value)
    if not math.isfinite(number):
        raise _MalformedError(f"{key} {shown(value)} is not a finite number")
    return number


def _optional_number(raw: Mapping[str, Any], key: str) -> float | None:
    """``_number``, or ``None`` for ``null`` (a gradient statistic the worker did not measure)."""
    if key in raw and raw[key] is None:
        return None
    return _number(raw, key)


def _read(pod: Mapping[str, Any], *, gpu_type: str, now: float, max_age_seconds: float,
          max_bsz: int | None) -> ParsedReport | ReportProblem | None:
    try:
        text = _annotation(pod)
        if text is None:
            return None
        raw = _parse(text)
        if KEY_VERSION not in raw:
            raise _MalformedError(f"{KEY_VERSION} (the format's version) is missing")
        version = raw[KEY_VERSION]
        if isinstance(version, bool) or not isinstance(version, int):
            raise _MalformedError(f"{KEY_VERSION} {shown(version)} is not an integer version")
        if version != FORMAT_VERSION:
            raise _MalformedError(f"{KEY_VERSION} {shown(version)}: this reader knows version {FORMAT_VERSION} only",
                             REASON_UNSUPPORTED_VERSION)
        written = _number(raw, KEY_TIME)
        replicas = _integer(raw, KEY_REPLICAS, 1)
        nodes = _integer(raw, KEY_NODES, 1)
        local_batch = _integer(raw, KEY_LOCAL_BATCH, 1)
        accumulation = _integer(raw, KEY_ACCUMULATION_STEPS, 1, MAX_ACCUMULATION_STEPS)
        step = _number(raw, KEY_STEP_SECONDS)
        sync = _number(raw, KEY_SYNC_SECONDS)
        grad_sqr = _optional_number(raw, KEY_GRAD_SQR)
        grad_var = _optional_number(raw, KEY_GRAD_VAR)
        steps = _integer(raw, KEY_STEPS, 1, MAX_STEPS)
        most = None if raw.get(KEY_MAX_LOCAL_BATCH) is None else \
            _integer(raw, KEY_MAX_LOCAL_BATCH, local_batch, MAX_LOCAL_BATCH)
    except _MalformedError as problem:
        return ReportProblem(problem.reason, problem.message)

    age = now - written
    if age > max_age_seconds:
        return ReportProblem(REASON_STALE, f"{KEY_TIME} {shown(written)} is {age:.4g} s old "
                                           f"(at most {max_age_seconds:g} s)")
    if -age > MAX_CLOCK_SKEW_SECONDS:
        return ReportProblem(REASON_FUTURE, f"{KEY_TIME} {shown(written)} is {-age:.4g} s in the future "
                                            f"(at most {MAX_CLOCK_SKEW_SECONDS:g} s of clock skew)")
    # The synchronising micro-step (see the module): compute shared by the accumulated micro-batches. Only for
    # a step that is longer than its synchronisation; otherwise the times go as they came, for refusal to name.
    step_time = synchronising_step_seconds(step, sync, accumulation)
    report = StepReport(gpu_type=gpu_type, num_nodes=nodes, num_replicas=replicas, local_bsz=local_batch,
                        step_time=step_time, sync_time=sync, grad_sqr=grad_sqr, grad_var=grad_var)
    why = refusal(report, max_bsz=max_bsz)
    if why is not None:
        if "_time" in why:  # refusal names StepReport's fields: say what the report itself held
            why += (f" (from {KEY_STEP_SECONDS} {step:.6g}, {KEY_SYNC_SECONDS} {sync:.6g}, "
                    f"{KEY_ACCUMULATION_STEPS} {accumulation})")
        return ReportProblem(REASON_UNTRUSTED, _cut(why))
    return ParsedReport(report=report, time=written, steps=steps, accumulation_steps=accumulation,
                        max_local_batch=most)


def _cut(text: str, limit: int = 300) -> str:
    """``text`` cut to ``limit`` characters: a message quotes values, and a value may be long."""
    return text if len(text) <= limit else text[: limit - 3] + "..."
