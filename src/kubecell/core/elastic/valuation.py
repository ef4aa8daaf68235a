"""What each size of each elastic job is worth to the sizing policy, in one currency.

Why a module of its own: the policy's steps (admission, growth, exchanges between jobs, moves between GPU
types) all compare the same numbers, and those numbers carry every judgement the policy makes:

* **speed**: a job's goodput at a candidate GPU count, divided by its best per-GPU goodput on any type, so that
  1.0 means "one GPU of its best type" and jobs of very different sizes compare (Sia's normalisation);
* **utility**: ``U(s) = s^(1-alpha) / (1-alpha)`` (``log s`` at alpha = 1), concave, so that the first GPUs of a
  job are worth more than its 17th (alpha is the fairness knob; Sia's ``p = -0.5`` is alpha = 1.5);
* **weight**: least-attained-service levels (``las_level``), so that new, probably short, jobs go first;
* **restarts**: a count other than the one held is discounted by ``rho`` (the job's progress lost) and charged
  the GPUs it holds idle while restarting at the GPU type's current price.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from kubecell.core.elastic.types import ClusterNode, ElasticJobView

TINY = 1e-12


@dataclass(slots=True)
class GpuPool:
    """The GPUs of one type: nodes, GPUs per node (the largest), total, free in the plan being built, and the
    price of one GPU (utility per GPU at the margin, smoothed over rounds)."""

    name: str
    nodes: list[ClusterNode]
    per_node: int
    capacity: int
    free: int = 0
    price: float = 0.0
    clearing: float = 0.0
    """Gain per GPU of the last step granted on this type in this round."""


@dataclass(slots=True)
class JobValue:
    """One job during a decision: its candidate counts and their worth per GPU type, and its plan."""

    view: ElasticJobView
    level: int
    weight: float
    rho: float
    cur_type: str | None
    cur_count: int
    locked: bool
    counts: dict[str, NDArray[np.int64]] = field(default_factory=dict)
    speed: dict[str, NDArray[np.float64]] = field(default_factory=dict)
    explored: set[str] = field(default_factory=set)
    """Types it has no report from: only its minimum is offered there, at a guessed speed."""
    value: dict[str, NDArray[np.float64]] = field(default_factory=dict)
    plan_type: str | None = None
    plan_count: int = 0
    note: str = ""
    """Why the plan changed (filled by the step that changed it)."""

    @property
    def name(self) -> str:
        return self.view.name

    @property
    def running(self) -> bool:
        return self.cur_type is not None

    def index(self, gpu_type: str, count: int) -> int | None:
        hit = np.flatnonzero(self.counts[gpu_type] == count)
        return int(hit[0]) if hit.size else None

    def speed_at(self, gpu_type: str | None, count: int) -> float:
        if gpu_type is None or gpu_type not in self.counts:
            return 0.0
        i = self.index(gpu_type, count)
        return float(self.speed[gpu_type][i]) if i is not None else 0.0

    def value_at(self, gpu_type: str, count: int) -> float:
        i = self.index(gpu_type, count)
        return float(self.value[gpu_type][i]) if i is not None else -math.inf


def las_level(attained_gpu_seconds: float, first_threshold: float, levels: int) -> int:
    """The job's least-attained-service level: 0 below ``first_threshold`` GPU-seconds, then one more each time
    its attained service doubles (thresholds 1, 3, 7 ... times the first, Tiresias' queues with exponentially
    spaced thresholds), at most ``levels - 1``. Levels rather than a continuous weight, so that two jobs do not
    swap GPUs (two restarts) each time one's attained service passes the other's."""
    ratio = 1.0 + max(attained_gpu_seconds, 0.0) / first_threshold
    return min(math.floor(math.log2(ratio) + 1e-12), levels - 1)


def candidate_sizes(pool: GpuPool, lo: int, hi: int, current: int) -> NDArray[np.int64]:
    """GPU counts a job may get on ``pool``: powers of two up to one node, then whole nodes (so that the counts
    pack onto nodes like buddies and a job is rarely split across nodes), within ``[lo, hi]`` and the pool's
    capacity, plus ``lo`` and the count it holds."""
    top = min(hi, pool.capacity)
    if lo > top:
        return np.empty(0, dtype=np.int64)
    sizes = {lo, top, *(1 << k for k in range(pool.per_node.bit_length()) if 1 << k <= pool.per_node),
             *range(pool.per_node, top + 1, pool.per_node)}
    if current:
        sizes.add(current)
    return np.array(sorted(s for s in sizes if lo <= s <= top), dtype=np.int64)


def utility(speed: NDArray[np.float64], alpha: float) -> NDArray[np.float64]:
    """Alpha-fair utility of normalised speeds (``log`` at alpha = 1)."""
    s = np.maximum(speed, TINY)
    if abs(alpha - 1.0) < 1e-9:
        return np.log(s)
    result: NDArray[np.float64] = s ** (1.0 - alpha) / (1.0 - alpha)
    return result


def price_values(job: JobValue, pools: dict[str, GpuPool], alpha: float, horizon: float) -> None:
    """Fill ``job.value``: weighted utility of every candidate count on every type; a count other than what
    the job holds is worth ``U(rho * s)`` and is charged ``price * count * restart_seconds / horizon`` (the
    GPUs it holds idle while restarting, at what a GPU of that type is worth at the margin)."""
    job.value = {}
    restart = max(job.view.restart_seconds, 0.0)
    for t, speed in job.speed.items():
        counts = job.counts[t]
        values = job.weight * utility(speed, alpha)
        if job.cur_type is not None:
            keep = (counts == job.cur_count) & (t == job.cur_type)
            idle = pools[t].price * counts * restart / horizon
            values = np.where(keep, values, job.weight * utility(speed * job.rho, alpha) - idle)
        job.value[t] = values
