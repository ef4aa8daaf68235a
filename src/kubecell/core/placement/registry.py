"""Placement policies by name, so drivers and the CLI can select them from configuration."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kubecell.core.errors import UnknownPolicyError
from kubecell.core.placement.frag import TypicalPod
from kubecell.core.placement.policies.baselines import (
    BestFit,
    DotProduct,
    GpuClustering,
    GpuPacking,
    RandomFit,
)
from kubecell.core.placement.policies.expected_waste import ExpectedWastePolicy
from kubecell.core.placement.policies.fgd import FragmentationGradientDescent
from kubecell.core.placement.policies.interference import InterferenceScore
from kubecell.core.placement.policies.utilization import Binpack, Spread
from kubecell.core.placement.policy import Policy
from kubecell.core.placement.weighted import WeightedPolicy


@dataclass(frozen=True, slots=True)
class PolicyContext:
    """What a policy may know when it is built: the typical pods, for FGD (which, as published, is
    given the workload's distribution in advance; the ``kubecell`` policy learns it online instead)."""

    typical_pods: Sequence[TypicalPod] = ()


PolicyFactory = Callable[[PolicyContext], Policy]

_FACTORIES: dict[str, tuple[PolicyFactory, str]] = {
    "random": (lambda ctx: RandomFit(), RandomFit.summary),
    "dotprod": (lambda ctx: DotProduct(), DotProduct.summary),
    "gpuclustering": (lambda ctx: GpuClustering(), GpuClustering.summary),
    "gpupacking": (lambda ctx: GpuPacking(), GpuPacking.summary),
    "bestfit": (lambda ctx: BestFit(), BestFit.summary),
    "fgd": (lambda ctx: FragmentationGradientDescent(ctx.typical_pods), FragmentationGradientDescent.summary),
    "binpack": (lambda ctx: Binpack(), Binpack.summary),
    "spread": (lambda ctx: Spread(), Spread.summary),
    # Online by design: it ignores ctx.typical_pods and learns the demand from the arrivals.
    "kubecell": (lambda ctx: ExpectedWastePolicy(), ExpectedWastePolicy.summary),
    # A second opinion to mix with a packing score (``kubecell:1+interference:1``), not a policy on its own.
    "interference": (lambda ctx: InterferenceScore(), InterferenceScore.summary),
}

FGD_BASELINES = ("random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd")
"""The six policies of the FGD paper, in its order."""

DEFAULT_POLICY = "kubecell"
"""What drivers use when no policy is configured: it leaves fewer GPUs idle than FGD on every openb
trace and every held-out variant (docs/placement.md), and needs nothing known in advance."""


def _key(name: str) -> str:
    return name.strip().lower().replace("-", "").replace("_", "")


def register_policy(name: str, factory: PolicyFactory, summary: str) -> None:
    """Add a policy under the same normalised name that lookups use (case, '-' and '_' ignored)."""
    _FACTORIES[_key(name)] = (factory, summary)


def policy_names() -> list[str]:
    return list(_FACTORIES)


def policy_summaries() -> dict[str, str]:
    return {name: summary for name, (_, summary) in _FACTORIES.items()}


def canonical_policy_name(name: str, *, field: str = "policy") -> str:
    """Lower-case a policy name and check it exists; error lists the accepted names. ``field`` names the
    setting the name came from (the CLI's ``--placement``), so the error points at what to fix.

    ``NAME:WEIGHT+NAME:WEIGHT...`` (a weight may be left out: 1) names a weighted mix of policies
    (:mod:`kubecell.core.placement.weighted`); its canonical form spells every weight."""
    if "+" in name or ":" in name:
        return "+".join(f"{part}:{weight:g}" for part, weight in _weighted_parts(name, field))
    key = _key(name)
    if key not in _FACTORIES:
        raise UnknownPolicyError(
            f"unknown placement policy {name!r}", field=field,
            accepted=", ".join(policy_names()) + ", or NAME:WEIGHT+NAME:WEIGHT...",
        )
    return key


def _weighted_parts(name: str, field: str) -> list[tuple[str, float]]:
    parts: list[tuple[str, float]] = []
    for text in name.split("+"):
        part, _, weight_text = text.partition(":")
        if ":" in weight_text or "+" in part:
            raise UnknownPolicyError(f"{text!r} in {name!r}", field=field, accepted="NAME or NAME:WEIGHT")
        canonical = canonical_policy_name(part, field=field)
        if canonical == "random":
            raise UnknownPolicyError(f"{part.strip()!r} picks a node at random and has no score to weigh",
                                     field=field, accepted="scoring policies")
        try:
            weight = float(weight_text) if weight_text.strip() else 1.0
        except ValueError:
            raise UnknownPolicyError(f"weight {weight_text!r} of {part.strip()!r} is not a number", field=field,
                                     accepted="a finite number above 0") from None
        if not (math.isfinite(weight) and weight > 0):
            raise UnknownPolicyError(f"weight {weight_text.strip()!r} of {part.strip()!r}", field=field,
                                     accepted="a finite number above 0")
        if any(canonical == seen for seen, _ in parts):
            raise UnknownPolicyError(f"{canonical!r} appears twice in {name!r}", field=field,
                                     accepted="each policy once, with its weight")
        parts.append((canonical, weight))
    return parts


def make_policy(name: str, context: PolicyContext | None = None) -> Policy:
    canonical = canonical_policy_name(name)
    if ":" in canonical:
        parts = [(make_policy(part, context), weight) for part, weight in _weighted_parts(canonical, "policy")]
        return WeightedPolicy(parts, name=canonical)
    factory, _ = _FACTORIES[canonical]
    return factory(context or PolicyContext())


def parse_policy_list(text: str, *, field: str = "policy") -> list[str]:
    """'FGD,bestfit' -> ['fgd', 'bestfit'], rejecting unknown and empty names (``field`` as above)."""
    names = [part for part in (p.strip() for p in text.split(",")) if part]
    if not names:
        raise UnknownPolicyError("no policy given", field=field, accepted=", ".join(policy_names()))
    result: list[str] = []
    for name in names:
        canonical = canonical_policy_name(name, field=field)
        if canonical not in result:
            result.append(canonical)
    return result
