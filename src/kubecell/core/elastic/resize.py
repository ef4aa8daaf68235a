"""How far one running elastic job should grow into capacity the engine says it could take now.

The engine decides *whether* capacity exists (``Engine.headroom``: guarantee room, borrow limit, cells,
topology, allowed nodes) and *who gives it back* when it is claimed (shrink before preemption, newest members
first). What it cannot know is whether another member is worth having: a job whose throughput stops scaling
at 4 replicas gains nothing from an 8th, and every resize costs a restart (torchrun restarts every worker when
the world changes). That is Pollux's question, answered from the job's goodput model (``OnlineGoodput``,
learned from the step reports the job writes):

* Each added member must be worth at least ``min_marginal`` of what an average member gives now (goodput
  per member at the current size). Pollux stops growing a job where its speedup curve flattens; Sia's
  per-GPU goodput matrix says the same thing. Growth stops at the first member below the bar (goodput is
  concave in the replica count, so later ones are worth less).
* The gain must pay for the restart: ``goodput(target) * (horizon - restart) > goodput(now) * horizon``, the
  restart penalty Pollux discounts with, over ``horizon_seconds`` (the least time between two resizes of one
  job, so a job is never resized faster than its restarts pay back).
* New members are priced pessimistically on new nodes (one more node each): they go wherever capacity is, and
  a model trusted for a placement it has not seen is the over-promise Pollux's exploration limit guards against.

Without a goodput model (a job that never reported, or reported only what the model refuses) the job takes
the capacity: idle GPUs help nobody, and members above the minimum are exactly what a claim takes back first,
so taking them costs other tenants nothing but the claim's shrink.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kubecell.core.elastic.types import GoodputEstimate


@dataclass(frozen=True, slots=True)
class GrowthRule:
    """When one more member is worth a restart (see the module)."""

    min_marginal: float = 0.5
    """An added member must give at least this fraction of an average member's goodput now."""
    restart_seconds: float = 30.0
    """What a resize costs the job: every worker restarts and reloads its checkpoint (torchrun's rendezvous
    plus a checkpoint load; Sia measures 25-250 s per restart on its models)."""
    horizon_seconds: float = 300.0
    """The time over which the gain must pay back the restart: the least time between two resizes."""


@dataclass(frozen=True, slots=True)
class GrowthChoice:
    target: int
    reason: str


def choose_growth(current: int, room: int, maximum: int, estimate: GoodputEstimate | None, gpu_type: str | None,
                  nodes_now: int, rule: GrowthRule | None = None) -> GrowthChoice:
    """The size ``current`` members should grow to, given ``room`` more members the cluster could take now and
    the job's ``maximum``; ``estimate`` and ``gpu_type`` price it (None: no model yet)."""
    rule = rule or GrowthRule()
    most = min(maximum, current + max(room, 0))
    if most <= current:
        why = f"at its maximum of {maximum} members" if current >= maximum else "no capacity it could take now"
        return GrowthChoice(current, why)
    if estimate is None or gpu_type is None:
        return GrowthChoice(most, f"no trusted step reports yet: takes the idle capacity ({current} -> {most} "
                                  "members; members above its minimum are the first a claim takes back)")
    base = _goodput(estimate, gpu_type, nodes_now, current)
    if base <= 0.0:
        return GrowthChoice(most, f"no goodput model for {gpu_type} at {current} members yet: takes the idle "
                                  f"capacity ({current} -> {most} members)")
    per_member = base / current
    target, previous, gain_at_target = current, base, base
    for size in range(current + 1, most + 1):
        value = _goodput(estimate, gpu_type, min(nodes_now + size - current, size), size)
        if value - previous < rule.min_marginal * per_member:
            break
        target, previous, gain_at_target = size, value, value
    if target == current:
        return GrowthChoice(current, f"one more member would add under {rule.min_marginal:.0%} of an average "
                                     f"member's goodput (its throughput stops scaling at {current})")
    usable = max(rule.horizon_seconds - rule.restart_seconds, 0.0)
    if gain_at_target * usable <= base * rule.horizon_seconds:
        return GrowthChoice(current, f"growing to {target} (goodput x{gain_at_target / base:.2f}) would not pay "
                                     f"for a {rule.restart_seconds:g} s restart within {rule.horizon_seconds:g} s")
    return GrowthChoice(target, f"goodput x{gain_at_target / base:.2f} at {target} members (from {current}), "
                                f"worth its restart")


def _goodput(estimate: GoodputEstimate, gpu_type: str, nodes: int, replicas: int) -> float:
    value = float(estimate.goodput(gpu_type, max(nodes, 1), replicas))
    return value if math.isfinite(value) and value > 0.0 else 0.0
