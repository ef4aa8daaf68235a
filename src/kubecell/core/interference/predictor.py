"""How much jobs that share one GPU by time-slicing slow each other, predicted from their solo profiles.

The model is mean value analysis (MVA) of a closed queueing network: every job loops forever through a
"think" phase off the GPU (data loading, Python, the host) and a phase on the GPU, which serves whoever is
there. Measured in units of the job's solo iteration time, its GPU phase is its solo GPU utilization ``u``
and the rest is ``1 - u``. A job that arrives at the GPU waits, on average, behind the other jobs' GPU
occupancy at that moment; MVA's arrival theorem says that occupancy is the one the *other* jobs would have
if this one did not exist. So, with ``S`` the set of sharers and ``Q(T)`` the mean number of jobs of ``T``
on the GPU::

    slowdown_i(S) = 1 + queueing * u_i * Qc(S - i) + bandwidth * m_i * Qm(S - i)
    speed_i(S)    = 1 / slowdown_i(S)

``Qc`` is built up over subsets by MVA's recursion (each job's GPU residence ``u_k (1 + queueing Qc(T - k))``
over its iteration time). ``Qm`` is simply the others' solo memory-controller busy fractions ``m`` summed:
the memory term is a correction inside the GPU phase, not a station of its own (nvidia-smi counts
memory-controller time inside kernel time), and treating it as one makes a job stuck on memory leave the
compute queue, which would let a third sharer speed a job up. For two jobs it reduces to
``1 / (1 + queueing u_i u_j + bandwidth m_i m_j)``: a lone job runs at 1.0, a partner that never touches the
GPU costs nothing, and two jobs that each keep the GPU always busy get half speed each at ``queueing = 1``.
Every term is monotone: a busier partner (higher ``u`` or ``m``) never predicts a faster speed.

Why these two parameters, and the defaults (not fitted on any measurement):

* ``queueing = 1.0``: the value for which the formula is exact when the GPU serves the jobs present as a
  processor-sharing server and each job's bursts arrive independently of the others' (a product-form
  network, whatever the burst-length distributions). Real training loops are periodic and tend to settle
  into alternation, one job's kernels falling into the other's gaps, so measured interference is lower
  and calibrated values fall well below 1. 1.0 is therefore a conservative default that
  over- rather than under-predicts the slowdown, and it keeps the one fact every GPU obeys: two (three)
  jobs that need the GPU all the time get a half (a third) of it each.
* ``bandwidth = 0.0``: nvidia-smi counts memory-controller time inside kernel time, so under time-slicing
  (kernels of two contexts never overlap) memory contention is already part of the compute term. What is
  left, caches and DRAM pages another context evicted, is real but its size depends on the GPU and the
  models; without measurements there is no defensible positive value, so it is off until calibrated.

``fit`` calibrates both from measured pairs on the target GPU type (non-negative least squares on
``1 / speed - 1``, which is linear in the two parameters for pairs).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from kubecell.core.errors import InvalidInputError
from kubecell.core.interference.profile import JobKey, SharedRun, SoloProfile

MAX_SHARERS = 16
"""The subset recursion costs ``2^n``; no GPU time-slices usefully among more jobs than this."""


@dataclass(frozen=True)
class InterferenceParams:
    """The calibration of the interference model for one GPU type (see the module docstring)."""

    queueing: float = 1.0
    bandwidth: float = 0.0

    def __post_init__(self) -> None:
        for name in ("queueing", "bandwidth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                    or value < 0:
                raise InvalidInputError(f"must be a finite number >= 0, got {value!r}", location="interference "
                                        "parameters", field=name, accepted="a finite number >= 0")

    def to_dict(self) -> dict[str, float]:
        return {"queueing": float(self.queueing), "bandwidth": float(self.bandwidth)}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> InterferenceParams:
        """Read parameters written by ``to_dict``; unknown keys are refused (a typo must not mean a default)."""
        unknown = sorted(set(data) - {"queueing", "bandwidth"})
        if unknown:
            raise InvalidInputError(f"unknown key(s) {', '.join(unknown)}", location="interference parameters",
                                    accepted="queueing, bandwidth")
        values: dict[str, float] = {}
        for name in ("queueing", "bandwidth"):
            if name in data:
                value = data[name]
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise InvalidInputError(f"must be a number, got {value!r}", location="interference parameters",
                                            field=name)
                values[name] = float(value)
        return cls(**values)


def predict_speeds(sharers: Sequence[SoloProfile], params: InterferenceParams) -> tuple[float, ...]:
    """Each sharer's predicted throughput on the shared GPU divided by its solo throughput, in order."""
    count = len(sharers)
    if count > MAX_SHARERS:
        raise InvalidInputError(f"{count} jobs on one GPU; the model takes at most {MAX_SHARERS}", field="sharers")
    compute = [profile.busy for profile in sharers]
    memory = [profile.memory_busy for profile in sharers]
    # Mean number of jobs on the GPU for every subset of sharers (a bit mask), smallest subsets first: a
    # subset's occupancy needs its members' throughputs, which need the occupancy without each member.
    occupancy = [0.0] * (1 << count)
    for mask in range(1, 1 << count):
        total = 0.0
        for i in range(count):
            if mask >> i & 1:
                residence = compute[i] * (1.0 + params.queueing * occupancy[mask & ~(1 << i)])
                total += residence / (1.0 - compute[i] + residence)
        occupancy[mask] = total
    everyone = (1 << count) - 1
    memory_total = sum(memory)
    speeds = []
    for i in range(count):
        wait = compute[i] * params.queueing * occupancy[everyone & ~(1 << i)] + \
            memory[i] * params.bandwidth * (memory_total - memory[i])
        speeds.append(1.0 / (1.0 + wait))
    return tuple(speeds)


@dataclass(frozen=True)
class InterferencePredictor:
    """The model bound to one calibration; what admission rules hold."""

    params: InterferenceParams = InterferenceParams()

    def speeds(self, sharers: Sequence[SoloProfile]) -> tuple[float, ...]:
        return predict_speeds(sharers, self.params)

    def worst_speed(self, sharers: Sequence[SoloProfile]) -> float:
        """The predicted speed of the worst-off sharer (1.0 for one job or none)."""
        return min(self.speeds(sharers), default=1.0)


def _pair_features(runs: Sequence[SharedRun], solos: Mapping[JobKey, SoloProfile]) -> tuple[np.ndarray, np.ndarray]:
    rows: list[tuple[float, float]] = []
    targets: list[float] = []
    for run in runs:
        if len(run.jobs) != 2:
            raise InvalidInputError(f"fit takes runs of exactly two jobs, got {len(run.jobs)}",
                                    location="run " + " + ".join(str(job) for job in run.jobs), field="jobs")
        first, second = run.profiles(solos)
        for own, other, speed in ((first, second, run.speeds[0]), (second, first, run.speeds[1])):
            rows.append((own.busy * other.busy, own.memory_busy * other.memory_busy))
            targets.append(1.0 / speed - 1.0)
    return np.array(rows, dtype=float), np.array(targets, dtype=float)


def fit(pairs: Sequence[SharedRun], solos: Mapping[JobKey, SoloProfile]) -> InterferenceParams:
    """Calibrate the model on measured pairs: least squares on ``1 / speed - 1`` with both parameters >= 0.

    Why this loss: ``1 / speed - 1`` is exactly linear in the parameters for pairs, so the fit is a tiny
    exact non-negative least-squares problem with no starting point or learning rate to choose. The
    non-negativity keeps the model monotone whatever the data's noise (a negative ``queueing`` would
    predict that a busier partner speeds a job up).
    """
    if not pairs:
        raise InvalidInputError("no measured pairs to fit on", field="pairs")
    features, targets = _pair_features(pairs, solos)
    best: tuple[float, np.ndarray] = (float(np.sum(targets ** 2)), np.zeros(2))
    for size in (1, 2):
        for columns in itertools.combinations(range(2), size):
            chosen = list(columns)
            solution, *_ = np.linalg.lstsq(features[:, chosen], targets, rcond=None)
            if np.any(solution < 0):
                continue
            residual = float(np.sum((features[:, chosen] @ solution - targets) ** 2))
            if residual < best[0]:
                full = np.zeros(2)
                full[chosen] = solution
                best = (residual, full)
    return InterferenceParams(queueing=float(best[1][0]), bandwidth=float(best[1][1]))
