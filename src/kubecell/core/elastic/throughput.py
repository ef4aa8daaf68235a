"""Pollux's throughput model: seconds per training step as a function of the placement and the batch size,
and its fit to the step and synchronisation times a job reports.

Why a model and not a table: a sizing policy must price placements the job has never run at (16 GPUs on two
nodes when it has only run on one GPU). Pollux (OSDI '21, Sec. 3.3) separates the two things that move a
step's time, and each has few enough parameters to be learned from a handful of reports:

* compute, linear in the per-replica micro-batch ``b``: ``T_c(b) = alpha_c + beta_c * b``;
* gradient synchronisation, which depends on the slowest link the replicas use: inside one node
  (``alpha_r + beta_r * max(replicas - 2, 0)``) or across nodes (``alpha_n + beta_n * max(replicas - 2, 0)``),
  and is zero for one replica; ``beta`` is the retrogression of a ring all-reduce with more members;
* overlap of the two in the step that synchronises: ``T_sync_step = (T_c^gamma + T_n^gamma)^(1/gamma)``, a
  p-norm (``gamma = 1``: no overlap, ``gamma -> inf``: perfect overlap).

With gradient accumulation over ``k`` micro-batches, the first ``k - 1`` only compute:
``T_step = (k - 1) * T_c(b) + T_sync_step``. A step processes ``replicas * b * k`` examples.

The fit (``fit_throughput``) uses only numpy and is cheap enough to run after every new placement shape: a
relative least-squares line for compute, then, for each ``gamma`` of a small grid, the network time each
report implies (inverting the p-norm) fitted by two non-negative lines (intra- and inter-node), keeping the
``gamma`` whose predicted step times have the smallest log error. What the reports cannot identify comes from
conservative priors (``FitPriors``) so that a job seen only on one GPU is not promised free scaling.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]

GAMMA_GRID: tuple[float, ...] = (1.0, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0)
"""Overlap exponents tried by the fit (Pollux bounds gamma to [1, 10])."""

_GAMMA_REGULARISATION = 1e-3
"""Pull towards gamma = 1 (no overlap, the pessimistic reading) when the data cannot tell (Pollux's 1e-3)."""

_TINY = 1e-9


@dataclass(frozen=True, slots=True)
class ThroughputParams:
    """Pollux's seven throughput parameters for one job on one GPU type (seconds, seconds per example)."""

    alpha_c: float
    """Compute seconds per micro-batch independent of its size."""
    beta_c: float
    """Compute seconds per example of the micro-batch."""
    alpha_r: float
    """Synchronisation seconds inside one node."""
    beta_r: float
    """Extra intra-node synchronisation seconds per replica beyond two."""
    alpha_n: float
    """Synchronisation seconds across nodes."""
    beta_n: float
    """Extra inter-node synchronisation seconds per replica beyond two."""
    gamma: float
    """Overlap of compute and synchronisation: 1 none, 10 nearly perfect."""
    scale_replicas: tuple[float, ...] = ()
    """Replica counts (above one, ascending) at which the compute of a micro-batch was measured."""
    scale: tuple[float, ...] = ()
    """Compute at each of ``scale_replicas`` over the one-replica compute line (``compute_scale``); empty: 1."""


@dataclass(frozen=True, slots=True)
class FitPriors:
    """What the fit assumes for what the reports do not show, as fractions of the job's compute time per
    micro-batch at its typical local batch size.

    Calibrated on Sia's measured profiles (``placements-*.csv``, synchronisation over one-GPU compute at the
    smallest batch): inside a node, 2-4 replicas add 0.01-0.5 (T4), 0.05-1.3 (RTX 2080Ti, PCIe) and
    0.02-0.3 (A100, NVLink); across nodes 0.4-5 on T4 nodes (Ethernet) but below 0.2 on DGX-A100 (InfiniBand).
    No constant fits every GPU type, so the priors are middling, and what keeps them from over-promising is
    ``OnlineGoodput.explore_factor``: a job is priced at most ``explore_factor`` times beyond the sizes it has reported
    from, and its report there replaces the prior.
    """

    intra_sync: float = 0.1
    """Intra-node synchronisation of 2 replicas, when no multi-replica single-node report exists."""
    inter_sync: float = 0.3
    """Inter-node synchronisation of 2 replicas, when no multi-node report exists."""
    retrogression: float = 0.05
    """beta / alpha when the reports do not show two replica counts on the link."""
    inter_over_intra: float = 1.5
    """Inter-node synchronisation is this multiple of the measured intra-node one (a slower link; Sia's
    profiles range from about 1 (DGX-A100) to 10 (T4 nodes on Ethernet)), or at least this multiple of the
    intra-node prior."""
    replica_compute: bool = False
    """Learn how the compute of a micro-batch changes when several replicas run (``compute_scale``). Off by
    default (Pollux's single compute line through every report): on the prediction bench
    (``bench/elastic_estimates.py``) it lowers the p90 goodput error from 63 % to 57 % (YOLOv3 on A100: median
    42 % -> 32 %), and the elastic simulator's avg JCT with it (Philly 0.621 -> 0.601 h, Helios 0.697 -> 0.691),
    but the ImageNet tail got longer (pooled p99 Helios 10.6 -> 11.5 h), beyond the run-to-run noise."""


SCALE_BOUNDS = (1.0, 4.0)
"""What a multi-replica compute may be relative to one replica's. Not below 1: a replica among others cannot
compute one micro-batch faster than alone; a faster measurement says the one-replica line (often from a
separate profiling run) is off, not that more replicas are faster. Above 4 a report is more likely broken."""


def compute_time(params: ThroughputParams, local_bsz: ArrayLike) -> FloatArray:
    """Seconds of forward and backward pass for one micro-batch of ``local_bsz`` examples on one replica."""
    return params.alpha_c + params.beta_c * np.asarray(local_bsz, dtype=np.float64)


def compute_scale(params: ThroughputParams, num_replicas: ArrayLike) -> FloatArray:
    """How much slower (above 1) or faster a micro-batch computes when ``num_replicas`` replicas run than on one.

    Why: the compute part of a step (``step - sync``) is not the one-GPU compute once replicas share a host or
    an input pipeline. In Sia's profiles it is 0.65-2.6x the one-GPU time at 8 replicas depending on the job
    and GPU type (YOLOv3 on DGX-A100: 1.6x at 2 replicas, 2.6x at 8; on RTX 2080Ti: 0.66x), so no prior fits and
    Pollux's single line, fitted through all reports, is wrong at one replica and at many. The measured ratios
    (within ``SCALE_BOUNDS``) are interpolated in ``log(replicas)`` between the replica counts reported, held
    flat beyond them, and 1 before any multi-replica report; one replica is always 1 (the line itself).
    """
    replicas = np.asarray(num_replicas, dtype=np.float64)
    if not params.scale:
        return np.ones_like(replicas)
    x = np.log(np.maximum(replicas, 1.0))
    inside = np.interp(x, np.log(np.asarray(params.scale_replicas)), np.asarray(params.scale))
    result: FloatArray = np.where(replicas > 1, inside, 1.0)
    return result


def network_time(params: ThroughputParams, num_nodes: ArrayLike, num_replicas: ArrayLike) -> FloatArray:
    """Seconds of gradient synchronisation at a placement, before overlap: the slowest link decides."""
    nodes = np.asarray(num_nodes, dtype=np.float64)
    replicas = np.asarray(num_replicas, dtype=np.float64)
    extra = np.maximum(replicas - 2.0, 0.0)
    inter = params.alpha_n + params.beta_n * extra
    intra = params.alpha_r + params.beta_r * extra
    result: FloatArray = np.where(nodes > 1, inter, np.where(replicas > 1, intra, 0.0))
    return result


def overlap(compute: ArrayLike, network: ArrayLike, gamma: float) -> FloatArray:
    """The p-norm ``(c^gamma + n^gamma)^(1/gamma)``, computed scaled so that large gammas do not overflow."""
    c = np.asarray(compute, dtype=np.float64)
    n = np.asarray(network, dtype=np.float64)
    top = np.maximum(np.maximum(c, n), _TINY)
    result: FloatArray = top * ((c / top) ** gamma + (n / top) ** gamma) ** (1.0 / gamma)
    return result


def step_time(params: ThroughputParams, num_nodes: ArrayLike, num_replicas: ArrayLike, local_bsz: ArrayLike,
              accum_steps: ArrayLike = 1) -> FloatArray:
    """Seconds per optimizer step: ``accum_steps - 1`` compute-only micro-batches, then one that synchronises."""
    c = compute_time(params, local_bsz) * compute_scale(params, num_replicas)
    n = network_time(params, num_nodes, num_replicas)
    k = np.asarray(accum_steps, dtype=np.float64)
    result: FloatArray = (k - 1.0) * c + overlap(c, n, params.gamma)
    return result


def examples_per_second(params: ThroughputParams, num_nodes: ArrayLike, num_replicas: ArrayLike,
                        local_bsz: ArrayLike, accum_steps: ArrayLike = 1) -> FloatArray:
    """Training examples processed per second (the raw throughput, before statistical efficiency)."""
    replicas = np.asarray(num_replicas, dtype=np.float64)
    b = np.asarray(local_bsz, dtype=np.float64)
    k = np.asarray(accum_steps, dtype=np.float64)
    result: FloatArray = replicas * b * k / step_time(params, num_nodes, num_replicas, local_bsz, accum_steps)
    return result


def _nonnegative_line(x: FloatArray, y: FloatArray, *, ratio: float | None = None) -> tuple[float, float]:
    """``y ~ a + b * x`` with ``a, b >= 0`` minimising the squared relative error ``sum(((a + b x) / y - 1)^2)``.

    Relative error because step times of one job span orders of magnitude across batch sizes and placements,
    and Pollux fits log errors for the same reason. With ``ratio`` the slope is tied to ``b = ratio * a`` (one
    parameter: used when the data cannot separate the two). Degenerate inputs fall back to the mean.
    """
    w = 1.0 / np.maximum(y, _TINY)
    if ratio is not None:
        u = (1.0 + ratio * x) * w
        a = float(np.sum(u) / max(float(np.sum(u * u)), _TINY))
        return max(a, 0.0), max(ratio * a, 0.0)
    design = np.stack([w, x * w], axis=1)
    if np.ptp(x) > 0:
        solution, *_ = np.linalg.lstsq(design, np.ones_like(y), rcond=None)
        a, b = float(solution[0]), float(solution[1])
        if a >= 0 and b >= 0:
            return a, b
    # The unconstrained optimum left the feasible set: the best is on an edge (a = 0 or b = 0).
    candidates = []
    ua = w
    a_only = float(np.sum(ua) / max(float(np.sum(ua * ua)), _TINY))
    candidates.append((a_only, 0.0))
    ub = x * w
    if float(np.sum(ub * ub)) > 0:
        b_only = float(np.sum(ub) / float(np.sum(ub * ub)))
        candidates.append((0.0, max(b_only, 0.0)))

    def error(ab: tuple[float, float]) -> float:
        return float(np.sum(((ab[0] + ab[1] * x) * w - 1.0) ** 2))

    return min(candidates, key=error)


def _scales(replicas: FloatArray, ratio: FloatArray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The geometric mean of measured over one-replica compute per replica count above one (bounded)."""
    counts = np.unique(replicas[replicas > 1])
    means = [float(np.exp(np.mean(np.log(np.clip(ratio[replicas == r], *SCALE_BOUNDS))))) for r in counts]
    return tuple(float(r) for r in counts), tuple(means)


def fit_throughput(num_nodes: ArrayLike, num_replicas: ArrayLike, local_bsz: ArrayLike, step: ArrayLike,
                   sync: ArrayLike, priors: FitPriors | None = None) -> ThroughputParams:
    """Fit Pollux's parameters to measured ``step`` and ``sync`` seconds (one entry per placement shape).

    The inputs must already be trusted (positive, finite, ``sync < step``); ``OnlineGoodput.observe`` checks
    them. What the data identify and what comes from the priors:

    * compute: a line through ``step - sync`` against ``local_bsz``; with a single batch size, half the
      time is taken as the constant term (Pollux's choice: optimistic about larger batches, so the policy
      tries them and the next reports correct it). With ``FitPriors.replica_compute`` and reports of both
      one and several replicas, the line goes through the one-replica reports only, and the multi-replica
      ones give ``compute_scale`` (their compute over the line, per replica count);
    * intra-node and inter-node synchronisation: a non-negative line each when reports of that link exist
      (the slope only with two replica counts above two, else ``FitPriors.retrogression``); otherwise the
      prior fraction of the compute time at the median observed batch size; inter-node without reports is
      ``inter_over_intra`` times the measured intra-node line, or the prior when that is not measured either;
    * ``gamma``: the grid value with the smallest log error of predicted step times, ties to the smaller
      (with one batch size per placement the data cannot tell overlap from slower links, and no overlap is
      the pessimistic reading).
    """
    priors = priors or FitPriors()
    nodes = np.asarray(num_nodes, dtype=np.float64)
    replicas = np.asarray(num_replicas, dtype=np.float64)
    bsz = np.asarray(local_bsz, dtype=np.float64)
    t = np.asarray(step, dtype=np.float64)
    c = np.maximum(t - np.asarray(sync, dtype=np.float64), _TINY)
    if t.size == 0:
        raise ValueError("fit_throughput needs at least one measurement")

    single = replicas <= 1
    own = priors.replica_compute and bool(np.any(single)) and not bool(np.all(single))
    line = single if own else np.ones_like(single)
    if np.ptp(bsz[line]) == 0:
        half = float(np.mean(c[line])) / 2.0
        alpha_c, beta_c = half, half / float(bsz[line][0])
    else:
        alpha_c, beta_c = _nonnegative_line(bsz[line], c[line])
    alpha_c = max(alpha_c, _TINY)
    c_ref = alpha_c + beta_c * float(np.median(bsz))
    scale_replicas, scale = _scales(replicas, c / (alpha_c + beta_c * bsz)) if own else ((), ())
    base = ThroughputParams(alpha_c, beta_c, 0.0, 0.0, 0.0, 0.0, 1.0, scale_replicas, scale)
    c_hat = compute_time(base, bsz) * compute_scale(base, replicas)
    extra = np.maximum(replicas - 2.0, 0.0)
    intra = (nodes == 1) & (replicas > 1)
    inter = nodes > 1

    def link(mask: NDArray[np.bool_], implied: FloatArray) -> tuple[float, float] | None:
        if not np.any(mask):
            return None
        x, y = extra[mask], np.maximum(implied[mask], _TINY)
        if np.unique(x).size >= 2:
            return _nonnegative_line(x, y)
        return _nonnegative_line(x, y, ratio=priors.retrogression)

    best: tuple[float, ThroughputParams] | None = None
    for gamma in GAMMA_GRID:
        implied = np.where(t > c, (np.maximum(t**gamma - c**gamma, 0.0)) ** (1.0 / gamma), 0.0)
        intra_fit = link(intra, implied)
        inter_fit = link(inter, implied)
        if intra_fit is None:
            alpha_r = priors.intra_sync * c_ref
            if inter_fit is not None:
                alpha_r = min(alpha_r, inter_fit[0] / priors.inter_over_intra)
            intra_fit = (alpha_r, priors.retrogression * alpha_r)
        if inter_fit is None:
            # Measured intra-node synchronisation says how heavy the gradients are and how fast this machine
            # is: scale it; without it, the prior fraction of compute.
            alpha_n = (priors.inter_over_intra * intra_fit[0] if np.any(intra)
                       else max(priors.inter_sync * c_ref, priors.inter_over_intra * intra_fit[0]))
            inter_fit = (alpha_n, max(priors.retrogression * alpha_n, priors.inter_over_intra * intra_fit[1]))
        params = ThroughputParams(alpha_c, beta_c, intra_fit[0], intra_fit[1], inter_fit[0], inter_fit[1], gamma,
                                  scale_replicas, scale)
        predicted = overlap(c_hat, network_time(params, nodes, replicas), gamma)
        error = float(np.mean((np.log(np.maximum(predicted, _TINY)) - np.log(t)) ** 2))
        error += _GAMMA_REGULARISATION * (gamma - 1.0) ** 2
        if best is None or error < best[0] - 1e-12:
            best = (error, params)
    assert best is not None
    return best[1]
