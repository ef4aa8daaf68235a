"""One job's goodput model, learned online from what the job reports (Pollux, OSDI '21).

Why online: a scheduler never has a profile of a new job on every GPU type and placement. It has what the
job reported (a few seed measurements on one GPU, then one report per interval from wherever it ran), and it
must still price every placement a policy may consider. ``OnlineGoodput`` keeps, per GPU type, the smoothed
step and synchronisation times of every placement shape reported (``nodes, replicas, local batch``), fits
Pollux's throughput model to them (``throughput.fit_throughput``), smooths the gradient statistics into a
noise scale (``efficiency.GradientNoise``) and answers ``goodput = examples/s x statistical efficiency`` at
the batch size that maximises it within the job's limits. The global batch a report's gradient statistics were
measured at counts the micro-batches its step accumulated: as the caller says (``observe(...,
accumulation_steps=)``: the step report's ``accumulationSteps``), else from the advice ``best_batch`` last gave
for that placement when the micro-batch matches, else one micro-batch per step.

Cost: the simulator and the policy ask for thousands of goodputs per round while each job reports about
once per round. Answers are cached per ``(gpu type, nodes, replicas)``; a type is refitted lazily, at the
first question after a new placement shape was reported or after ``refit_every`` reports on known shapes;
the caches are dropped when a type is refitted or the noise ratio at the smallest or largest batch moves by
more than ``phi_tolerance``.
``goodput_many`` answers many placements of one type with one vectorised batch-size search.

What is refused (``observe`` returns False and nothing changes): non-finite, zero or negative times, a
step over ``MAX_STEP_SECONDS`` (a clock error, not a measurement), ``sync_time >= step_time``, a zero
``sync_time`` with more than one replica (replicas that did not synchronise did not train together), fewer
than one replica or node, more nodes than replicas, a local batch below 1 or above ``max_bsz``, negative or
non-finite gradient statistics, and a non-string or empty GPU type. A report with only one of the two
gradient statistics, or both zero, is kept for its times and its gradient part is ignored.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from kubecell.core.elastic.efficiency import GradientNoise, efficiency
from kubecell.core.elastic.throughput import FitPriors, ThroughputParams, examples_per_second, fit_throughput
from kubecell.core.elastic.types import GoodputEstimate, StepReport
from kubecell.core.errors import InvalidInputError

MAX_STEP_SECONDS = 1e5
"""A step longer than about a day is a broken clock or unit, not a measurement."""
MAX_REPLICAS = 1 << 22
"""The core's bound on gang members (``core/limits.py``); more replicas than that is not a report."""

_EPS = 1e-8

Shape = tuple[int, int]
"""``(num_nodes, num_replicas)`` of a placement."""


@runtime_checkable
class BulkGoodputEstimate(Protocol):
    """An estimate that can answer many placements of one GPU type at once (``OnlineGoodput`` does)."""

    def goodput_many(self, gpu_type: str, shapes: Sequence[Shape]) -> NDArray[np.float64]: ...


def synchronising_step_seconds(step_seconds: float, sync_seconds: float, accumulation_steps: int) -> float:
    """The step time the model fits for an optimizer step that accumulated ``accumulation_steps`` micro-batches:
    its synchronising micro-step, compute per micro-batch ``(step - sync) / k`` plus the synchronisation
    (``kube.step_reports`` says why). A step not longer than its synchronisation is returned as it came, for
    ``refusal`` to name."""
    if step_seconds > sync_seconds >= 0.0:
        return (step_seconds - sync_seconds) / accumulation_steps + sync_seconds
    return step_seconds


def refusal(report: StepReport, *, max_bsz: int | None = None) -> str | None:
    """Why ``report`` cannot be trusted, or None when it can. Never raises, whatever the field types."""
    try:
        if not isinstance(report.gpu_type, str) or not report.gpu_type:
            return "gpu_type is not a non-empty string"
        for name in ("num_nodes", "num_replicas", "local_bsz"):
            value = getattr(report, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                return f"{name} {value!r} is not an integer"
        if report.num_replicas < 1 or report.num_replicas > MAX_REPLICAS:
            return f"num_replicas {report.num_replicas} outside 1..{MAX_REPLICAS}"
        if report.num_nodes < 1 or report.num_nodes > report.num_replicas:
            return f"num_nodes {report.num_nodes} outside 1..num_replicas ({report.num_replicas})"
        if report.local_bsz < 1 or (max_bsz is not None and report.local_bsz > max_bsz):
            return f"local_bsz {report.local_bsz} outside 1..{max_bsz}"
        step, sync = float(report.step_time), float(report.sync_time)
        if not (math.isfinite(step) and 0.0 < step <= MAX_STEP_SECONDS):
            return f"step_time {report.step_time!r} outside (0, {MAX_STEP_SECONDS:g}] s"
        if not (math.isfinite(sync) and sync >= 0.0):
            return f"sync_time {report.sync_time!r} is not a finite non-negative number"
        if sync >= step:
            return f"sync_time {sync:g} s is not below step_time {step:g} s"
        if sync == 0.0 and report.num_replicas > 1:
            return f"sync_time 0 with {report.num_replicas} replicas"
        for name in ("grad_sqr", "grad_var"):
            value = getattr(report, name)
            if value is not None and not (math.isfinite(float(value)) and float(value) >= 0.0):
                return f"{name} {value!r} is not a finite non-negative number"
    except (TypeError, ValueError, OverflowError) as error:
        return f"unreadable report: {error}"
    return None


@dataclass(slots=True)
class _TypeModel:
    """What is known of the job on one GPU type: measurements per shape, the fit, the answer cache."""

    samples: dict[tuple[int, int, int], list[float]] = field(default_factory=dict)
    """``(nodes, replicas, local_bsz) -> [step, sync]``, smoothed."""
    params: ThroughputParams | None = None
    dirty: bool = True
    pending: int = 0
    """Reports on known shapes since the last fit."""
    cache: dict[Shape, tuple[float, int, int]] = field(default_factory=dict)
    """``(nodes, replicas) -> (goodput, local_bsz, accum_steps)``; local 0 = infeasible."""


class OnlineGoodput:
    """Pollux's goodput model of one job, learned from its ``StepReport``s (implements ``GoodputEstimate``).

    Batch sizes: ``local_bsz`` is the micro-batch one replica processes per forward/backward pass and
    ``accum_steps >= 1`` the number of micro-batches accumulated per optimizer step, so a step trains on
    ``replicas * local_bsz * accum_steps`` examples (the global batch), always within ``[initial_bsz,
    max_bsz]`` (or ``replicas`` when that is larger than ``initial_bsz``), and ``local_bsz`` within the GPU
    type's ``max_local_bsz`` (memory).

    With few reports the model falls back as ``fit_throughput`` says: a job seen only on one GPU pays the
    synchronisation priors of ``FitPriors``; before any gradient statistics the efficiency assumes no gradient
    noise (``efficiency.efficiency``), so the best batch stays at the smallest allowed; a GPU type with no
    report at all has goodput 0 (the policy decides whether to try it); and, what keeps multi-GPU goodput from
    being over-promised, ``goodput`` is 0 beyond ``explore_factor`` times the largest replica count reported
    (on that type, or on any type with ``explore_across_types``): the priors, which may be wrong either way
    for a type's interconnect, are trusted one step at a time, each step checked by the reports it brings.
    The noise model learns how the reported noise ratio grows with the batch it was measured at
    (``noise_slope_prior`` until two batch sizes were seen; ``grad_smoothing`` per report).

    Two defaults were set on the cluster's path (docs/elastic.md, section 2): ``grad_smoothing`` 0.3 (a
    report's statistics are already means over its interval, while the noise scale drifts as training goes, so
    the old 0.7 only made the model lag) and ``explore_factor`` 8 (Pollux's rule is 2; with the noise followed
    closely, a job ramps up in fewer restarts: 1 -> 8 rather than 1 -> 4 -> 16). Both together: avg JCT
    -0.008 / -0.014 h on Sia's Philly / Helios workloads over nine jittered copies, the tails level.

    ``noise_prior`` (default None: phi = 0 until the first statistics) is the noise ratio assumed at
    ``initial_bsz`` before any statistics, Pollux's reading that the user's batch is about the gradient noise
    scale (1.0). Not the default because the first epochs disagree: Sia's validation curves measure phi at the
    initial batch from 0.08 (YOLOv3) to 73 (NCF) in epoch 0, and on the prediction bench
    (``bench/elastic_estimates.py``) a prior of 1 moved the error before any statistics from 21 % to 24 %
    (median; p90 98 % -> 94 %): no constant fits both.
    """

    def __init__(self, *, initial_bsz: int, max_bsz: int, max_local_bsz: Mapping[str, int] | None = None,
                 prior: Sequence[StepReport] = (), refit_every: int = 8, sample_smoothing: float = 0.5,
                 grad_smoothing: float = 0.3, noise_slope_prior: float = 0.3, phi_tolerance: float = 0.01,
                 batch_candidates: int = 32,
                 max_shapes: int = 256, explore_factor: float | None = 8.0, explore_across_types: bool = True,
                 priors: FitPriors | None = None, noise_prior: float | None = None) -> None:
        if isinstance(initial_bsz, bool) or not isinstance(initial_bsz, int) or initial_bsz < 1:
            raise InvalidInputError(f"initial_bsz {initial_bsz!r} is not a positive integer", field="initial_bsz",
                                    accepted="an integer >= 1")
        if isinstance(max_bsz, bool) or not isinstance(max_bsz, int) or max_bsz < initial_bsz:
            raise InvalidInputError(f"max_bsz {max_bsz!r} is below initial_bsz {initial_bsz}", field="max_bsz",
                                    accepted=f"an integer >= {initial_bsz}")
        limits = dict(max_local_bsz or {})
        for gpu_type, limit in limits.items():
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise InvalidInputError(f"max_local_bsz[{gpu_type!r}] = {limit!r} is not a positive integer",
                                        field="max_local_bsz", accepted="an integer >= 1 per GPU type")
        if (refit_every < 1 or batch_candidates < 2 or max_shapes < 1 or not 0.0 <= sample_smoothing < 1.0
                or (explore_factor is not None and not explore_factor >= 1.0)):
            raise InvalidInputError("refit_every, batch_candidates, max_shapes, sample_smoothing or explore_factor "
                                    "out of range", accepted="refit_every >= 1, batch_candidates >= 2, max_shapes >= 1,"
                                    " 0 <= sample_smoothing < 1, explore_factor >= 1 or None")
        self.initial_bsz = initial_bsz
        self.max_bsz = max_bsz
        self.max_local_bsz: dict[str, int] = limits
        self.refit_every = refit_every
        self.sample_smoothing = sample_smoothing
        self.phi_tolerance = phi_tolerance
        self.batch_candidates = batch_candidates
        self.max_shapes = max_shapes
        self.explore_factor = explore_factor
        self.explore_across_types = explore_across_types
        self.priors = priors or FitPriors()
        if noise_prior is not None and not (isinstance(noise_prior, int | float) and math.isfinite(noise_prior)
                                            and noise_prior > 0):
            raise InvalidInputError(f"noise_prior {noise_prior!r} is not a positive number", field="noise_prior",
                                    accepted="a number > 0, or None")
        self.noise = GradientNoise(smoothing=grad_smoothing, slope_prior=noise_slope_prior,
                                   prior_phi=noise_prior, prior_bsz=initial_bsz)
        self.last_refusal: str | None = None
        """Why the last refused report was refused (for logs and explanations)."""
        self.refused = 0
        self._types: dict[str, _TypeModel] = {}
        self._phi_cached: tuple[float, float] | None = None
        self._advised: dict[tuple[str, int, int], tuple[int, int]] = {}
        """The last ``best_batch`` answer per placement, to tell a report's accumulation steps."""
        for report in prior:
            self.observe(report)

    # -- learning -------------------------------------------------------------------------------------------

    def observe(self, report: StepReport, *, accumulation_steps: int | None = None) -> bool:
        """Learn from one report; False (and nothing learned) when it cannot be trusted (see the module).
        ``accumulation_steps``: the micro-batches per step the job says it ran, which places its gradient
        statistics at their global batch; None: inferred from the last advice for that placement."""
        reason = refusal(report, max_bsz=self.max_bsz)
        if reason is not None:
            self.last_refusal = reason
            self.refused += 1
            return False
        model = self._types.setdefault(report.gpu_type, _TypeModel())
        key = (int(report.num_nodes), int(report.num_replicas), int(report.local_bsz))
        step, sync = float(report.step_time), float(report.sync_time)
        known = model.samples.get(key)
        if known is None:
            if len(model.samples) >= self.max_shapes:
                del model.samples[next(iter(model.samples))]  # the oldest shape
            model.samples[key] = [step, sync]
            model.dirty = True
        else:
            s = self.sample_smoothing
            known[0] = s * known[0] + (1.0 - s) * step
            known[1] = s * known[1] + (1.0 - s) * sync
            model.pending += 1
            if model.pending >= self.refit_every:
                model.dirty = True
        sqr, var = report.grad_sqr, report.grad_var
        if sqr is not None and var is not None and (sqr > 0 or var > 0):
            advice = self._advised.get((report.gpu_type, key[0], key[1]))
            accum = advice[1] if advice is not None and advice[0] == key[2] else 1
            if isinstance(accumulation_steps, int) and not isinstance(accumulation_steps, bool) \
                    and 1 <= accumulation_steps <= self.max_bsz:
                accum = accumulation_steps
            self.noise.update(float(sqr), float(var), global_bsz=key[1] * key[2] * accum)
            self._check_noise()
        return True

    def limit_local_batch(self, gpu_type: str, limit: int) -> None:
        """The largest micro-batch the job fits on one GPU of ``gpu_type``, as it says (its step reports'
        ``maxLocalBatch``): larger batches there are priced as accumulated micro-batches of at most this."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidInputError(f"max_local_bsz[{gpu_type!r}] = {limit!r} is not a positive integer",
                                    field="max_local_bsz", accepted="an integer >= 1")
        if self.max_local_bsz.get(gpu_type) != limit:
            self.max_local_bsz[gpu_type] = limit
            model = self._types.get(gpu_type)
            if model is not None:
                model.cache.clear()

    def _check_noise(self) -> None:
        low, high = self.noise.phi_at(self.initial_bsz), self.noise.phi_at(self.max_bsz)
        if low is None or high is None:
            return
        old = self._phi_cached
        if old is None or any(abs(new - was) > self.phi_tolerance * max(abs(was), _EPS)
                              for new, was in zip((low, high), old, strict=True)):
            for model in self._types.values():
                model.cache.clear()
            self._phi_cached = (low, high)

    def _fitted(self, gpu_type: str) -> _TypeModel | None:
        model = self._types.get(gpu_type)
        if model is None or not model.samples:
            return None
        if model.dirty or model.params is None:
            keys = np.array(list(model.samples.keys()), dtype=np.float64)
            values = np.array(list(model.samples.values()), dtype=np.float64)
            model.params = fit_throughput(keys[:, 0], keys[:, 1], keys[:, 2], values[:, 0], values[:, 1],
                                          self.priors)
            model.dirty = False
            model.pending = 0
            model.cache.clear()
        return model

    # -- questions ------------------------------------------------------------------------------------------

    @property
    def gpu_types(self) -> frozenset[str]:
        """GPU types with at least one trusted report."""
        return frozenset(t for t, m in self._types.items() if m.samples)

    def params(self, gpu_type: str) -> ThroughputParams | None:
        """The fitted throughput parameters on ``gpu_type`` (None: nothing reported there)."""
        model = self._fitted(gpu_type)
        return model.params if model is not None else None

    def measurements(self) -> dict[str, list[tuple[int, int, int, float, float]]]:
        """Per GPU type, each placement shape reported, oldest first: ``(nodes, replicas, local_bsz, step,
        sync)`` with the smoothed times the fit uses (what a saved model keeps, ``saved_model``)."""
        return {gpu_type: [(*key, step, sync) for key, (step, sync) in model.samples.items()]
                for gpu_type, model in self._types.items() if model.samples}

    @property
    def extent(self) -> tuple[int, tuple[tuple[str, int], ...]]:
        """How much it knows beyond the numbers it smooths: the placement shapes measured (over every type) and
        the micro-batch limits; cheap, so a caller can tell at every pass whether it learned a new placement."""
        return sum(len(model.samples) for model in self._types.values()), tuple(sorted(self.max_local_bsz.items()))

    def max_observed_replicas(self, gpu_type: str) -> int:
        """The most replicas any trusted report on ``gpu_type`` ran with (0: none)."""
        model = self._types.get(gpu_type)
        return max((k[1] for k in model.samples), default=0) if model is not None else 0

    def efficiency(self, global_bsz: int) -> float:
        """Statistical efficiency of ``global_bsz`` relative to ``initial_bsz`` with the smoothed noise scale."""
        return float(efficiency(global_bsz, self.initial_bsz, self.noise.phi_at(global_bsz)))

    def throughput(self, gpu_type: str, num_nodes: int, num_replicas: int, local_bsz: int,
                   accum_steps: int = 1) -> float:
        """Predicted examples per second (before efficiency); 0.0 when unknown or not a valid placement."""
        model = self._fitted(gpu_type)
        if model is None or model.params is None or not _valid_shape(num_nodes, num_replicas):
            return 0.0
        if local_bsz < 1 or accum_steps < 1:
            return 0.0
        return float(examples_per_second(model.params, num_nodes, num_replicas, local_bsz, accum_steps))

    def replica_limit(self, gpu_type: str) -> int | None:
        """The most replicas ``goodput`` answers for on ``gpu_type``: ``explore_factor`` times the most any
        report there ran with (None: no limit, or nothing reported there)."""
        if self.explore_factor is None:
            return None
        seen = self.max_observed_replicas(gpu_type)
        if seen and self.explore_across_types:
            seen = max(self.max_observed_replicas(t) for t in self._types)
        return max(1, int(self.explore_factor * seen + 1e-9)) if seen else None

    def goodput(self, gpu_type: str, num_nodes: int, num_replicas: int) -> float:
        """Examples per second x efficiency at the best batch size; 0.0 when unknown, infeasible, or beyond
        ``replica_limit`` (Pollux's rule: a job grows at most ``explore_factor`` times past the largest size it
        has run at, so that an extrapolation is checked by a report before it is trusted further)."""
        limit = self.replica_limit(gpu_type)
        if limit is not None and num_replicas > limit:
            return 0.0
        answer = self._answer(gpu_type, num_nodes, num_replicas)
        return answer[0] if answer is not None else 0.0

    def best_batch(self, gpu_type: str, num_nodes: int, num_replicas: int) -> tuple[int, int] | None:
        """``(local_bsz, accum_steps)`` maximising goodput at that placement (None: infeasible or unknown)."""
        answer = self._answer(gpu_type, num_nodes, num_replicas)
        if answer is None or answer[1] < 1:
            return None
        self._advised[(gpu_type, int(num_nodes), int(num_replicas))] = (answer[1], answer[2])
        return answer[1], answer[2]

    def goodput_many(self, gpu_type: str, shapes: Sequence[Shape]) -> NDArray[np.float64]:
        """``goodput`` of every ``(num_nodes, num_replicas)`` in ``shapes``, in one vectorised search."""
        out = np.zeros(len(shapes), dtype=np.float64)
        model = self._fitted(gpu_type)
        if model is None:
            return out
        missing = [s for s in dict.fromkeys(shapes) if s not in model.cache and _valid_shape(*s)]
        if missing:
            self._solve(gpu_type, model, missing)
        limit = self.replica_limit(gpu_type)
        for i, shape in enumerate(shapes):
            hit = model.cache.get(shape)
            if hit is not None and (limit is None or shape[1] <= limit):
                out[i] = hit[0]
        return out

    def _answer(self, gpu_type: str, num_nodes: int, num_replicas: int) -> tuple[float, int, int] | None:
        if not _valid_shape(num_nodes, num_replicas):
            return None
        model = self._fitted(gpu_type)
        if model is None:
            return None
        shape = (int(num_nodes), int(num_replicas))
        hit = model.cache.get(shape)
        if hit is None:
            self._solve(gpu_type, model, [shape])
            hit = model.cache[shape]
        return hit

    def _solve(self, gpu_type: str, model: _TypeModel, shapes: Iterable[Shape]) -> None:
        """Best batch size for each shape (Pollux's search: geometric global batch sizes between the smallest
        allowed and ``max_bsz``, split into micro-batches that fit ``max_local_bsz``), into the cache."""
        assert model.params is not None
        shape_list = list(shapes)
        nodes = np.array([s[0] for s in shape_list], dtype=np.float64)[:, None]
        replicas = np.array([s[1] for s in shape_list], dtype=np.float64)[:, None]
        max_local = float(self.max_local_bsz.get(gpu_type, self.max_bsz))
        low = np.maximum(float(self.initial_bsz), replicas)
        high = np.maximum(float(self.max_bsz), low)
        steps = np.linspace(0.0, 1.0, self.batch_candidates)[None, :]
        target = low * (high / low) ** steps
        local = np.ceil(target / replicas - _EPS)
        accum = np.maximum(np.ceil(local / max_local - _EPS), 1.0)
        atomic = np.ceil(local / accum - _EPS)
        atomic = np.minimum(atomic, np.floor(self.max_bsz / (replicas * accum) + _EPS))
        feasible = (atomic >= 1) & (atomic <= max_local)
        atomic = np.maximum(atomic, 1.0)
        global_bsz = replicas * atomic * accum
        rate = examples_per_second(model.params, nodes, replicas, atomic, accum)
        phi = self.noise.phi_many(global_bsz)
        values = np.where(feasible, rate * efficiency(global_bsz, self.initial_bsz, phi), 0.0)
        best = np.argmax(values, axis=1)
        rows = np.arange(len(shape_list))
        for i, shape in enumerate(shape_list):
            value = float(values[rows[i], best[i]])
            if value > 0 and math.isfinite(value):
                model.cache[shape] = (value, int(atomic[i, best[i]]), int(accum[i, best[i]]))
            else:
                model.cache[shape] = (0.0, 0, 0)


def _valid_shape(num_nodes: int, num_replicas: int) -> bool:
    return (isinstance(num_nodes, int | np.integer) and isinstance(num_replicas, int | np.integer)
            and 1 <= num_nodes <= num_replicas <= MAX_REPLICAS)


def compact_shapes(counts: Sequence[int], gpus_per_node: int) -> list[Shape]:
    """The placement shape of each GPU count packed onto the fewest nodes of ``gpus_per_node`` GPUs."""
    per_node = max(int(gpus_per_node), 1)
    return [(max(1, -(-int(n) // per_node)), int(n)) for n in counts]


def goodput_table(estimate: GoodputEstimate, gpu_type: str, counts: Sequence[int],
                  gpus_per_node: int) -> NDArray[np.float64]:
    """Goodput of one job at each GPU count in ``counts`` on ``gpu_type``, each packed compactly; one
    vectorised call for estimates that support it (``BulkGoodputEstimate``), else one call per count. An
    answer that is not a finite non-negative number counts as nothing known there (0): a policy given an
    estimate it did not build must never rank on NaN."""
    shapes = compact_shapes(counts, gpus_per_node)
    if isinstance(estimate, BulkGoodputEstimate):
        table = np.array(estimate.goodput_many(gpu_type, shapes), dtype=np.float64)
    else:
        table = np.array([estimate.goodput(gpu_type, n, r) if r > 0 else 0.0 for n, r in shapes], dtype=np.float64)
    table[~np.isfinite(table) | (table < 0)] = 0.0
    return table


def speedup_table(estimate: GoodputEstimate, gpu_types: Mapping[str, int], counts: Sequence[int],
                  ) -> dict[str, NDArray[np.float64]]:
    """Goodput tables for every GPU type in ``gpu_types`` (type -> GPUs per node), divided by the job's best
    one-GPU goodput over those types, so that 1.0 means "as fast as one GPU of its best type". All zeros
    when nothing is known of the job anywhere."""
    tables = {t: goodput_table(estimate, t, counts, per_node) for t, per_node in gpu_types.items()}
    base = max((float(estimate.goodput(t, 1, 1)) for t in gpu_types), default=0.0)
    if base <= 0:
        return {t: np.zeros(len(counts)) for t in gpu_types}
    return {t: table / base for t, table in tables.items()}
