"""kubecell's elastic sizing policy: how many GPUs of which type each elastic job gets, decided for all jobs
at once each round, with a reason per job.

Why not Sia's ILP: Sia (SOSP '23) re-solves a mixed-integer program over (job, GPU type, count) each round. It
is heterogeneity-aware and goodput-driven, but its objective is blind to how long a job has run, so a new small
job and a day-old large one compete alike; and a fresh optimum each round moves jobs whenever the optimum
moves. With unknown durations, least-attained-service priority cuts mean completion time (Tiresias, NSDI '19),
and every move costs a checkpoint-restore. This policy keeps Sia's ingredients (normalised goodput
per configuration, restart penalties, heterogeneity; ``valuation``) and replaces the solver by an explainable
greedy, re-run from scratch each round over the jobs that may change:

1. **Lock** running jobs resized less than ``min_resize_seconds`` ago: they keep their GPUs (no thrash).
2. **Admit** every other job in priority order (LAS levels, FIFO inside the last level; a running job's
   attained service counts ``keep_bias`` times less, so it is not displaced by a job that merely caught up)
   at its minimum size, on the GPU type where its per-GPU goodput is highest *relative to other jobs on that
   type* (comparative advantage: Sia's heterogeneity insight; another type than the one it holds is
   discounted by its restart). Admission comes before any growth, so big jobs shrink rather than new jobs
   queue, and a job not admitted waits (or is preempted, if it ran).
3. **Grow** by marginal gain: repeatedly give the job with the largest weighted utility gain per added GPU its
   next size. Every value charges a change its restart (``valuation.price_values``: the job's lost progress
   and the GPUs it idles at the type's price), so a job keeps its size unless the change pays; growth stops
   where an added GPU brings less than ``min_marginal_efficiency`` of a GPU's worth.
4. **Fill idle types**: GPUs of a type nobody wants are offered to jobs elsewhere when the move pays.
5. **Place** compactly (``placement``): unchanged jobs keep their nodes.

Cost: O(jobs x sizes) goodput lookups (cached in the job models) plus O(GPUs x sizes x log jobs) heap steps.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from kubecell.core.elastic.goodput import goodput_table
from kubecell.core.elastic.placement import place
from kubecell.core.elastic.types import ClusterNode, ElasticJobView
from kubecell.core.elastic.valuation import (
    TINY,
    GpuPool,
    JobValue,
    candidate_sizes,
    las_level,
    price_values,
)
from kubecell.core.errors import InvalidInputError

_MIN_DISCOUNT = 0.01


@dataclass(frozen=True, slots=True)
class ElasticOptions:
    """The knobs of ``KubecellElasticPolicy``. Defaults were tuned on the nine development workloads of Sia's
    Philly and Helios families together (never one file); most knobs move the Table 3 figures by less than their
    spread over workloads (see docs/elastic.md)."""

    round_seconds: float = 60.0
    """Seconds between decisions (informational: ``restart_horizon`` is what prices restarts)."""
    min_resize_seconds: float = 60.0
    """A running job keeps its allocation for at least this long after a change."""
    min_resize_restarts: float = 0.0
    """... and for at least this many times its own ``restart_seconds``."""
    restart_horizon: float = 900.0
    """Seconds over which a change must pay back the job's ``restart_seconds``."""
    restart_age_rule: bool = True
    """Also discount a change by Pollux's ``(age - restarts * restart_seconds) / (age + restart_seconds)``: a
    job that has already spent much of its life restarting is moved only for a large gain."""
    las_halving_gpu_seconds: float = 3600.0
    """Attained GPU-seconds of the first LAS threshold (``valuation.las_level``)."""
    las_levels: int = 4
    """Number of LAS levels (Tiresias' queues); jobs past the last threshold share the last level."""
    las_exponent: float = 0.75
    """Weight ``2 ** -(level * exponent)``; 0 disables LAS weighting."""
    fifo_decay: float = 0.7
    """In the last level the earliest submitted job keeps its weight and each later one is worth this factor
    less than the one before (FIFO among long jobs: they finish one after another, not all late together)."""
    fifo_decay_early: float = 1.0
    """The same inside the other levels (1: none, pure LAS there)."""
    fairness: float = 1.0
    """Alpha of the utility (0: total speedup, 1: proportional fairness, 1.5: Sia's ``p = -0.5``)."""
    min_marginal_efficiency: float = 0.1
    """Grow only while an added GPU adds at least this fraction of the job's per-GPU goodput at its minimum."""
    keep_bias: float = 4.0
    """In admission order, a running job's attained service counts this many times less."""
    explore_value: float = 0.5
    """Per-GPU worth assumed on a GPU type the job has never reported from (only its minimum is offered)."""
    price_smoothing: float = 0.5
    """Weight of the previous price of a GPU type in the next (exponential smoothing over rounds)."""
    max_idle_moves: int = 16
    """Bound on the moves of the fill-idle step per round."""

    def __post_init__(self) -> None:
        checks = {
            "round_seconds": self.round_seconds > 0, "min_resize_seconds": self.min_resize_seconds >= 0,
            "min_resize_restarts": self.min_resize_restarts >= 0, "restart_horizon": self.restart_horizon > 0,
            "las_halving_gpu_seconds": self.las_halving_gpu_seconds > 0, "las_levels": self.las_levels >= 1,
            "las_exponent": self.las_exponent >= 0, "fifo_decay": 0 < self.fifo_decay <= 1,
            "fifo_decay_early": 0 < self.fifo_decay_early <= 1,
            "fairness": self.fairness >= 0, "min_marginal_efficiency": self.min_marginal_efficiency >= 0,
            "keep_bias": self.keep_bias >= 1, "explore_value": self.explore_value > 0,
            "price_smoothing": 0 <= self.price_smoothing < 1, "max_idle_moves": self.max_idle_moves >= 0,
        }
        for name, ok in checks.items():
            if not ok or not math.isfinite(float(getattr(self, name))):
                raise InvalidInputError(f"{name} = {getattr(self, name)!r} out of range", field=name,
                                        accepted="finite; see ElasticOptions for each knob's range")


class KubecellElasticPolicy:
    """LAS-weighted, heterogeneity-aware, restart-priced greedy sizing (see the module docstring)."""

    name = "kubecell"

    def __init__(self, options: ElasticOptions | None = None) -> None:
        self.options = options or ElasticOptions()
        self.last_reasons: dict[str, str] = {}
        """Why each job got what it got in the last decision."""
        self.prices: dict[str, float] = {}
        """Per GPU type, what one GPU is worth at the margin (weighted utility per GPU of the last step granted
        there, smoothed over rounds; 0 while GPUs of the type are left idle)."""
        self._seen: dict[str, tuple[tuple[str, ...], int, bool]] = {}
        """Per job: the nodes it held at the last decision, its restarts counted so far, whether it ever ran
        (the view carries no restart count; Pollux's restart discount needs one)."""

    # -- the decision -----------------------------------------------------------------------------------

    def allocate(self, now: float, jobs: Sequence[ElasticJobView],
                 nodes: Sequence[ClusterNode]) -> dict[str, tuple[str, ...]]:
        self._count_restarts(jobs)
        pools = self._pools(nodes)
        node_type = {n.name: n.gpu_type for n in nodes}
        node_gpus = {n.name: n.gpus for n in nodes}
        models = [self._value(now, view, pools, node_type, node_gpus) for view in jobs]
        if len({j.name for j in models}) != len(models):
            raise InvalidInputError("two elastic jobs share a name", field="jobs", accepted="unique job names")
        o = self.options
        for level in range(o.las_levels):
            if level < o.las_levels - 1 and o.fifo_decay_early == 1.0:
                continue
            decay = o.fifo_decay if level == o.las_levels - 1 else o.fifo_decay_early
            same = sorted((j for j in models if j.level == level), key=lambda j: (j.view.submitted, j.name))
            for rank, job in enumerate(same):
                job.weight *= decay**rank
        for job in models:
            price_values(job, pools, self.options.fairness, self.options.restart_horizon)
        order = sorted(models, key=self._priority)
        self._lock(order, pools, node_gpus)
        queued = self._admit([j for j in order if not j.locked], pools)
        self._grow([j for j in models if not j.locked and j.plan_count > 0], pools)
        self._fill_idle(models, pools)
        for pool in pools.values():
            clearing = 0.0 if pool.free > 0 else pool.clearing
            s = self.options.price_smoothing
            self.prices[pool.name] = s * self.prices.get(pool.name, 0.0) + (1.0 - s) * clearing
        plans = {j.name: (j.plan_type or "", j.plan_count) for j in models}
        keep = {j.name: j.view.current for j in models
                if j.plan_count > 0 and j.plan_type == j.cur_type and j.plan_count == j.cur_count}
        result = place(plans, keep, nodes, {j.name: j.view.current for j in models})
        self.last_reasons = {j.name: self._reason(j, queued.get(j.name), now) for j in models}
        return result

    # -- inputs -----------------------------------------------------------------------------------------

    def _count_restarts(self, jobs: Sequence[ElasticJobView]) -> None:
        seen: dict[str, tuple[tuple[str, ...], int, bool]] = {}
        for view in jobs:
            held = tuple(sorted(view.current))
            before = self._seen.get(view.name)
            if before is None:
                seen[view.name] = (held, 0, bool(held))
                continue
            old, restarts, ran = before
            if held and held != old and ran:
                restarts += 1
            seen[view.name] = (held, restarts, ran or bool(held))
        self._seen = seen  # finished jobs are forgotten

    def restarts(self, name: str) -> int:
        """Restarts of a job the policy has counted (changes of a running job's nodes, resumptions)."""
        entry = self._seen.get(name)
        return entry[1] if entry is not None else 0

    def _pools(self, nodes: Sequence[ClusterNode]) -> dict[str, GpuPool]:
        seen: set[str] = set()
        pools: dict[str, GpuPool] = {}
        for node in nodes:
            if node.name in seen:
                raise InvalidInputError(f"node {node.name!r} listed twice", field="nodes", accepted="unique names")
            seen.add(node.name)
            if node.gpus <= 0:
                continue
            pool = pools.setdefault(node.gpu_type, GpuPool(node.gpu_type, [], 0, 0,
                                                           price=self.prices.get(node.gpu_type, 0.0)))
            pool.nodes.append(node)
            pool.per_node = max(pool.per_node, node.gpus)
            pool.capacity += node.gpus
        for pool in pools.values():
            pool.free = pool.capacity
        return pools

    def _restart_discount(self, now: float, view: ElasticJobView) -> float:
        """What a changed allocation is worth relative to the current one: the restart paid back over the
        horizon, and (``restart_age_rule``) Pollux's discount of jobs that have restarted much for their age."""
        o = self.options
        cost = max(view.restart_seconds, 0.0)
        rho = o.restart_horizon / (o.restart_horizon + cost)
        age = now - view.submitted
        if o.restart_age_rule and age >= cost:
            rho = min(rho, max(age - self.restarts(view.name) * cost, 0.0) / (age + cost))
        return max(rho, _MIN_DISCOUNT)

    def _value(self, now: float, view: ElasticJobView, pools: Mapping[str, GpuPool], node_type: Mapping[str, str],
               node_gpus: Mapping[str, int]) -> JobValue:
        o = self.options
        lo = max(1, view.min_replicas)
        hi = view.max_replicas  # below lo: no size fits, the job stays queued
        held = {node_type.get(name) for name in view.current}
        cur_type = next(iter(held)) if len(held) == 1 and None not in held else None
        per_node: dict[str, int] = {}
        for name in view.current:
            per_node[name] = per_node.get(name, 0) + 1
        if not (cur_type is not None and lo <= len(view.current) <= hi
                and all(k <= node_gpus.get(name, 0) for name, k in per_node.items())
                and (view.gpu_types is None or cur_type in view.gpu_types)):
            cur_type = None  # what it holds is gone or no longer allowed: it starts over
        cur_count = len(view.current) if cur_type is not None else 0
        interval = max(o.min_resize_seconds, o.min_resize_restarts * max(view.restart_seconds, 0.0))
        locked = cur_type is not None and view.last_resize is not None and now - view.last_resize < interval
        level = las_level(view.attained_gpu_seconds, o.las_halving_gpu_seconds, o.las_levels)
        rho = self._restart_discount(now, view) if cur_type else 1.0
        job = JobValue(view, level, float(2.0 ** -(level * o.las_exponent)), rho, cur_type, cur_count, locked)
        raw = {}
        for pool in pools.values():
            if view.gpu_types is not None and pool.name not in view.gpu_types:
                continue
            sizes = candidate_sizes(pool, lo, hi, cur_count if pool.name == cur_type else 0)
            if sizes.size:
                job.counts[pool.name] = sizes
                raw[pool.name] = goodput_table(view.estimate, pool.name, sizes.tolist(), pool.per_node)
        base = max((float(np.max(g / job.counts[t])) for t, g in raw.items()), default=0.0)
        for t, g in raw.items():
            if base > 0 and float(np.max(g)) > 0:
                job.speed[t] = np.maximum(g, 0.0) / base
            else:
                # Never reported from there: offer only the minimum (or what it holds), at a guessed worth, so
                # that it can be tried; its reports then price the rest.
                keep = job.counts[t][(job.counts[t] == job.counts[t][0]) | (job.counts[t] == cur_count)]
                job.counts[t] = keep if t == cur_type else keep[:1]
                job.speed[t] = job.counts[t].astype(np.float64) * o.explore_value
                job.explored.add(t)
        return job

    def _priority(self, job: JobValue) -> tuple[int, float, str]:
        """Admission order: LAS level (a running job's attained service counted ``keep_bias`` times less),
        then least attained service, or first submitted inside the last level."""
        o = self.options
        attained = job.view.attained_gpu_seconds / (o.keep_bias if job.running else 1.0)
        level = las_level(attained, o.las_halving_gpu_seconds, o.las_levels)
        return (level, job.view.submitted if level == o.las_levels - 1 else attained, job.name)

    # -- the steps ----------------------------------------------------------------------------------------

    @staticmethod
    def _lock(order: list[JobValue], pools: dict[str, GpuPool], node_gpus: Mapping[str, int]) -> None:
        """Locked jobs keep what they hold (in priority order, so that if the caller's state over-commits a
        node, the later job is the one that is re-decided)."""
        used: dict[str, int] = {}
        for job in order:
            if not job.locked or job.cur_type is None:
                continue
            held: dict[str, int] = {}
            for name in job.view.current:
                held[name] = held.get(name, 0) + 1
            if any(used.get(name, 0) + k > node_gpus[name] for name, k in held.items()):
                job.locked = False
                continue
            for name, k in held.items():
                used[name] = used.get(name, 0) + k
            job.plan_type, job.plan_count = job.cur_type, job.cur_count
            pools[job.cur_type].free -= job.cur_count

    def _admit(self, order: list[JobValue], pools: dict[str, GpuPool]) -> dict[str, str]:
        """Every unlocked job in priority order at its minimum, on its comparatively best type with room;
        returns why the others wait."""
        price = {t: self._type_price(order, t) for t in pools}
        queued: dict[str, str] = {}
        for rank, job in enumerate(order, start=1):
            best: tuple[float, float, str] | None = None
            for t, counts in job.counts.items():
                need = int(counts[0])
                if pools[t].free < need:
                    continue
                speed = float(job.speed[t][0]) / need
                advantage = speed / max(price[t], TINY)
                if job.cur_type is not None and t != job.cur_type:
                    advantage *= job.rho
                # equal advantages (a type only this job knows is priced by its own speed there): the faster
                if best is None or advantage > best[0] + 1e-12 or (advantage > best[0] - 1e-12 and speed > best[1]):
                    best = (advantage, speed, t)
            if best is None:
                types = "/".join(sorted(job.counts)) or "any allowed type"
                queued[job.name] = f"queued: no room for its minimum on {types} (rank {rank} by attained service)"
                continue
            self._set(job, best[2], int(job.counts[best[2]][0]), pools, "")
        return queued

    @staticmethod
    def _type_price(jobs: Sequence[JobValue], t: str) -> float:
        """Mean per-GPU speed the jobs that know type ``t`` get there: the yardstick of comparative advantage."""
        speeds = [float(j.speed[t][0] / j.counts[t][0]) for j in jobs if t in j.speed and t not in j.explored]
        return float(np.mean(speeds)) if speeds else 1.0

    @staticmethod
    def _set(job: JobValue, t: str | None, count: int, pools: dict[str, GpuPool], note: str) -> None:
        if job.plan_type is not None:
            pools[job.plan_type].free += job.plan_count
        job.plan_type, job.plan_count = (t, count) if count > 0 else (None, 0)
        if t is not None and count > 0:
            pools[t].free -= count
        if note:
            job.note = note

    def _best_step(self, job: JobValue, free: int) -> tuple[float, int] | None:
        """The most valuable growth of ``job`` within ``free`` GPUs of its type: (gain per GPU, new count)."""
        t = job.plan_type
        assert t is not None
        i = job.index(t, job.plan_count)
        counts, speed, values = job.counts[t], job.speed[t], job.value[t]
        if i is None or i + 1 >= counts.size:
            return None
        added = counts[i + 1:] - job.plan_count
        gain = (values[i + 1:] - values[i]) / added
        per_gpu = float(speed[0]) / float(counts[0])
        marginal = (speed[i + 1:] - speed[i]) / added
        ok = (added <= free) & (gain > 0) & (marginal >= self.options.min_marginal_efficiency * per_gpu)
        if not np.any(ok):
            return None
        k = int(np.argmax(np.where(ok, gain, -np.inf)))
        return float(gain[k]), int(counts[i + 1 + k])

    def _grow(self, jobs: list[JobValue], pools: dict[str, GpuPool]) -> None:
        """Greedy by weighted utility gain per added GPU, one job's jump at a time (a heap of each job's best
        next jump, refreshed lazily when its type's free GPUs no longer allow it)."""
        heap: list[tuple[float, int, int]] = []

        def push(index: int) -> None:
            job = jobs[index]
            assert job.plan_type is not None
            step = self._best_step(job, pools[job.plan_type].free)
            if step is not None:
                heapq.heappush(heap, (-step[0], index, step[1]))

        for index in range(len(jobs)):
            push(index)
        while heap:
            _, index, count = heapq.heappop(heap)
            job = jobs[index]
            assert job.plan_type is not None
            pool = pools[job.plan_type]
            step = self._best_step(job, pool.free)
            if step is None:
                continue
            if step[1] != count:
                heapq.heappush(heap, (-step[0], index, step[1]))
                continue
            self._set(job, job.plan_type, count, pools, "")
            pool.clearing = step[0]
            push(index)

    def _fill_idle(self, jobs: list[JobValue], pools: dict[str, GpuPool]) -> None:
        """Offer GPUs left idle on a type to jobs planned elsewhere (or queued) when the move is worth it."""
        for _ in range(self.options.max_idle_moves):
            best: tuple[float, JobValue, str, int] | None = None
            for job in jobs:
                if job.locked:
                    continue
                now_value = job.value_at(job.plan_type, job.plan_count) if job.plan_type else None
                for t, counts in job.counts.items():
                    if t == job.plan_type or t in job.explored or pools[t].free <= 0:
                        continue
                    fits = np.flatnonzero(counts <= pools[t].free)
                    if fits.size == 0:
                        continue
                    values = job.value[t][fits]
                    k = int(np.argmax(values))
                    gain = math.inf if now_value is None else float(values[k]) - now_value
                    if gain > 1e-9 and (best is None or gain > best[0]):
                        best = (gain, job, t, int(counts[fits[k]]))
            if best is None:
                return
            _, job, t, count = best
            self._set(job, t, count, pools, "idle GPUs")
            self._grow([j for j in jobs if not j.locked and j.plan_count > 0], pools)

    # -- explanations ------------------------------------------------------------------------------------

    def _reason(self, job: JobValue, queued: str | None, now: float) -> str:
        o = self.options
        old, new = job.cur_count, job.plan_count
        old_t, new_t = job.cur_type, job.plan_type
        why = f": {job.note}" if job.note else ""
        if job.locked:
            since = now - (job.view.last_resize or now)
            interval = max(o.min_resize_seconds, o.min_resize_restarts * max(job.view.restart_seconds, 0.0))
            return f"kept {old} {old_t}: resized {since:.0f} s ago, minimum interval {interval:.0f} s"
        if new == 0:
            return f"preempted from {old} {old_t}: jobs with less attained service took its GPUs" if old else (
                queued or "queued")
        before = job.speed_at(old_t, old) if old else 0.0
        gain = job.speed_at(new_t, new) / before - 1.0 if before > 0.0 else 0.0  # (an estimate of 0 at its size)
        if old == 0:
            worth = f"worth {job.speed_at(new_t, new):.2f} GPUs of its best type"
            return f"started {new} {new_t}{why} ({'exploring' if new_t in job.explored else worth})"
        if old_t != new_t:
            return (f"moved {old} {old_t} -> {new} {new_t}{why}: goodput {gain:+.0%} after a "
                    f"{job.view.restart_seconds:.0f} s restart")
        if new > old:
            return f"grown {old}->{new} {new_t}{why}: goodput {gain:+.0%} ({gain / (new - old):+.1%}/GPU)"
        if new < old:
            return (f"shrunk {old}->{new} {new_t}: its last {old - new} GPUs were worth more to other jobs "
                    f"(goodput {gain:+.0%})")
        bigger = job.counts[new_t][job.counts[new_t] > new] if new_t in job.counts else np.empty(0)
        if bigger.size:
            up = job.speed_at(new_t, int(bigger[0])) / max(job.speed_at(new_t, new), TINY) - 1.0
            if 0 < up < 1 / job.rho - 1:
                return (f"kept {new} {new_t}: restart would cost {job.view.restart_seconds:.0f} s for "
                        f"{up:+.0%} at {int(bigger[0])}")
        return f"kept {new} {new_t}"
