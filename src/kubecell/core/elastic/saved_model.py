"""A job's goodput model as a small JSON value, so that what a scheduler learned of a job survives its restart.

Why: ``OnlineGoodput`` is fitted from the step reports of every placement the job ran on, and the noise scale from
every report's gradient statistics. A job's pods carry only their latest report, so a restarted scheduler that
learned again from them would know one placement, price the others from priors, and pay restarts to explore
them again. Everything the model learned comes down to its smoothed times per placement shape and the noise
model's five weighted sums, a few hundred bytes: the sizer keeps them in the ElasticJob's
``status.goodputModel`` (docs/elastic.md).

Untrusted input: anyone with status rights may write that field. ``restore_model`` checks every measurement as a
step report is checked (``goodput.refusal``) and the sums against what reports can produce, and takes all or
nothing: a value that fails one check is dropped whole, with the reason, and the model learns afresh.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

from kubecell.core.elastic.efficiency import PHI_MAX, PHI_MIN
from kubecell.core.elastic.goodput import MAX_REPLICAS, OnlineGoodput, refusal
from kubecell.core.elastic.types import StepReport

VERSION = 1
MAX_TYPES = 8
"""GPU types kept (a job's pods name a few models; more than this is not a saved model)."""
MAX_SHAPES = 32
"""Placement shapes kept per type, the newest: enough for the fit (Pollux fits five parameters)."""
MAX_LOCAL = 1 << 31
"""The bound on a kept micro-batch limit (the step report's)."""
_SLACK = 1e-9


def saved_model(model: OnlineGoodput) -> dict[str, Any]:
    """The value to keep: the batch range it was learned for, per type the newest shapes' smoothed times (and
    the largest micro-batch the job said it fits there), and the noise sums (None before any gradient
    statistics)."""
    measured = model.measurements()
    types = [{"gpuType": gpu_type, "shapes": [list(row) for row in rows[-MAX_SHAPES:]],
              **({"maxLocal": model.max_local_bsz[gpu_type]} if gpu_type in model.max_local_bsz else {})}
             for gpu_type, rows in sorted(measured.items())[:MAX_TYPES]]
    return {"version": VERSION, "batchSize": {"min": model.initial_bsz, "max": model.max_bsz}, "types": types,
            "noise": list(model.noise.sums) if model.noise.known else None}


def restore_model(model: OnlineGoodput, value: Any, *, most_nodes: int | None = None,
                  most_replicas: int | None = None) -> str | None:
    """Teach ``model`` (new, nothing observed yet) what ``value`` holds; the reason it was dropped instead, or
    None once taken up. Never raises, whatever ``value`` is. ``most_nodes``, ``most_replicas``: the largest world
    the job can form (None: no bound beyond ``refusal``'s). The sizer refuses a step report of a larger world,
    which would lift the model's exploration limit (``OnlineGoodput.replica_limit``); a kept shape of one is
    refused alike, or the status would be the way around that check."""
    try:
        reports, sums, limits = _read(value, model.initial_bsz, model.max_bsz, most_nodes, most_replicas)
    except _DroppedError as problem:
        return str(problem)
    except (TypeError, ValueError, OverflowError, KeyError, IndexError) as error:
        return f"unreadable: {error}"
    if model.measurements() or model.noise.known:
        return "the model has already learned from reports"
    if sums is not None:
        model.noise.restore(sums)
    for gpu_type, limit in limits.items():
        model.limit_local_batch(gpu_type, limit)
    for report in reports:
        model.observe(report)  # checked in _read: each one is taken (a shape's first report sets its times)
    return None


class _DroppedError(Exception):
    """Why a kept value is dropped whole."""


def _read(value: Any, low: int, high: int, most_nodes: int | None = None, most_replicas: int | None = None,
          ) -> tuple[list[StepReport], list[float] | None, dict[str, int]]:
    """The measurements, noise sums and micro-batch limits ``value`` holds; raises ``_DroppedError``."""
    limits: dict[str, int] = {}
    if not isinstance(value, Mapping):
        raise _DroppedError(f"a {type(value).__name__}, not a mapping")
    if value.get("version") != VERSION:
        raise _DroppedError(f"version {value.get('version')!r}, this scheduler reads {VERSION}")
    batch = value.get("batchSize")
    bounds = (batch.get("min"), batch.get("max")) if isinstance(batch, Mapping) else None
    if bounds != (low, high):
        raise _DroppedError(f"learned for batches {bounds!r}, the job's range is now ({low}, {high})")
    types = value.get("types")
    if not _listed(types) or len(types) > MAX_TYPES:
        raise _DroppedError(f"types is not a list of at most {MAX_TYPES}")
    reports: list[StepReport] = []
    seen_types: set[str] = set()
    for entry in types:
        if not isinstance(entry, Mapping):
            raise _DroppedError("a type entry is not a mapping")
        gpu_type, shapes = entry.get("gpuType"), entry.get("shapes")
        if not isinstance(gpu_type, str) or not 0 < len(gpu_type) <= 63 or gpu_type in seen_types:
            raise _DroppedError(f"gpuType {gpu_type!r} is not a new name of 1-63 characters")
        seen_types.add(gpu_type)
        limit = entry.get("maxLocal")
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LOCAL:
                raise _DroppedError(f"{gpu_type}: maxLocal {limit!r} is not an integer in 1..{MAX_LOCAL}")
            limits[gpu_type] = limit
        if not _listed(shapes) or len(shapes) > MAX_SHAPES:
            raise _DroppedError(f"{gpu_type}: shapes is not a list of at most {MAX_SHAPES}")
        for row in shapes:
            if not _listed(row) or len(row) != 5:
                raise _DroppedError(f"{gpu_type}: a shape {row!r} is not [nodes, replicas, local batch, step, sync]")
            nodes, replicas, local, step, sync = row
            report = StepReport(gpu_type, nodes, replicas, local, step, sync)
            reason = refusal(report, max_bsz=high)
            if reason is None and any(isinstance(v, bool) or not isinstance(v, int | float) for v in (step, sync)):
                reason = "a time is not a number"
            if reason is None and ((most_nodes is not None and nodes > most_nodes)
                                   or (most_replicas is not None and replicas > most_replicas)):
                reason = (f"a world this job can never form (at most {most_replicas} replicas on {most_nodes} "
                          "nodes)")
            if reason is not None:
                raise _DroppedError(f"{gpu_type}: shape {row!r}: {reason}")
            reports.append(report)
    noise = value.get("noise")
    if noise is None:
        return reports, None, limits
    problem = _noise_problem(noise, high)
    if problem is not None:
        raise _DroppedError(problem)
    return reports, [float(v) for v in noise], limits


def _noise_problem(noise: Any, high: int) -> str | None:
    """Why five numbers cannot be the noise model's sums: each is a weighted sum, with total weight in (0, 1],
    of values reports produce (``x`` the log of a batch, ``y`` a clamped log noise ratio)."""
    if not _listed(noise) or len(noise) != 5 or any(isinstance(v, bool) or not isinstance(v, int | float)
                                                     for v in noise):
        return "noise is not five numbers"
    w, sx, sxx, sy, sxy = (float(v) for v in noise)
    if not all(math.isfinite(v) for v in (w, sx, sxx, sy, sxy)) or not 0.0 < w <= 1.0 + _SLACK:
        return "noise: the weight is not in (0, 1], or a sum is not finite"
    # A report's batch is replicas x micro-batch x accumulation steps, each bounded as ``refusal`` checks.
    x_max = math.log(MAX_REPLICAS) + 2.0 * math.log(high)
    y_max = max(abs(math.log(PHI_MIN)), abs(math.log(PHI_MAX)))
    means = {"x": (sx / w, 0.0, x_max), "x^2": (sxx / w, 0.0, x_max * x_max),
             "y": (sy / w, math.log(PHI_MIN), math.log(PHI_MAX)), "x*y": (sxy / w, -x_max * y_max, x_max * y_max)}
    for name, (mean, lowest, highest) in means.items():
        margin = _SLACK * max(1.0, abs(lowest), abs(highest))
        if not lowest - margin <= mean <= highest + margin:
            return f"noise: the mean of {name} ({mean:g}) is outside what reports give ([{lowest:g}, {highest:g}])"
    return None


def _listed(value: Any) -> TypeGuard[Sequence[Any]]:
    return isinstance(value, Sequence) and not isinstance(value, str | bytes)
