"""What the scheduler may know of a pod's workload beyond its request: how long its family's jobs ran, and what
they used alone. Filled in by a composition root (``kubecell scheduler --history``: the profiler's job history),
never by the pod: a pod cannot say it is short or light.

The scheduler asks once per job it submits; answers go into the engine's plain-data fields
(``JobSpec.expected_seconds`` for ``queue_order: shortest-expected``, ``Request.profile`` for the co-location
rule). An implementation must answer quickly (it is asked on the scheduling thread) and never raise for a pod it
knows nothing about: None is the answer then.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from kubecell.core.engine.job import JobSpec
from kubecell.core.interference.profile import JobKey, SoloProfile
from kubecell.core.placement.colocation import as_asked
from kubecell.kube.pods import counted_by_kubernetes


class Knowledge(Protocol):
    def expected_seconds(self, pod: Mapping[str, Any]) -> float | None:
        """How long a job of this pod's family is expected to run; None: no history."""

    def profile(self, pod: Mapping[str, Any]) -> SoloProfile | None:
        """What a job of this pod's family uses alone, per GPU; None: no history."""

    def share_milli(self, pod: Mapping[str, Any]) -> int | None:
        """The compute share per GPU this pod's family needs (``core.rightsizing``); None: no advice."""

    def family(self, pod: Mapping[str, Any]) -> JobKey | None:
        """The key this pod's family's profile and pairs are kept under; None: none."""


def informed(spec: JobSpec, pod: Mapping[str, Any], knowledge: Knowledge | None, *,
             place_by_use: bool = False) -> JobSpec:
    """``spec`` with what ``knowledge`` says of ``pod``'s family. A gang of member groups gets the run time only:
    a profile describes one shape, and only shares are judged by the co-location rule. A share whose family has
    no solo profile yet is judged by its request as before, under its family's key, so that what the history
    observed of the family beside others (``core.interference.informed_by_pairs``) applies to it already.

    ``place_by_use``: a share is placed at the share its family needs when that is less than it asked (never
    more: the request is the pod's limit). The allocation record then grants the smaller share, and the node
    agent enforces what the record grants (MPS's thread limit; under accounting only the overuse report): an
    operator turns this on knowing that a pod which uses more than its family did is held to the family's
    share. GPU memory is never lowered: running out of it kills a job. A share Kubernetes counts itself
    (``kube.pods.counted_by_kubernetes``) is never lowered either: the grant would disagree with that count."""
    if knowledge is None:
        return spec
    expected = knowledge.expected_seconds(pod)
    simple_share = not spec.groups and spec.member.is_share
    profile = knowledge.profile(pod) if simple_share else None
    if profile is None and simple_share and (family := knowledge.family(pod)) is not None:
        profile = as_asked(spec.member, family)  # no solo profile yet: its request, under its family's key
    lowerable = simple_share and place_by_use and not counted_by_kubernetes(pod)
    milli = knowledge.share_milli(pod) if lowerable else None
    member = spec.member
    if profile is not None:
        member = dataclasses.replace(member, profile=profile)
    if milli is not None and 0 < milli < member.gpu_milli:
        member = dataclasses.replace(member, gpu_milli=milli)
    if expected is None and member is spec.member:
        return spec
    return dataclasses.replace(spec, member=member, expected_seconds=expected)


def as_granted(spec: JobSpec, granted_milli: Sequence[int], advice_milli: int | None) -> JobSpec:
    """``spec``, restored from its pods, with the compute share its records grant where that is less than the
    pods ask and no less than its family needs now (``advice_milli``, what ``place_by_use`` would grant it
    today): a share placed by its family's use holds what it was granted (what the node agent enforces),
    whether or not ``place_by_use`` is still on.

    Why the floor: a record is an annotation, and on a cluster without ``deploy/admission`` its pod's owner can
    edit it. The trust rule (``kube.trust``) believes a lower grant for a share kubecell alone counts, so without
    a floor an edit to 1 milli would make a restarted scheduler count the pod at almost nothing (its VC charged
    as much, its GPU packed past what it runs with). With it, an edit can lower the count at most to what
    kubecell would grant the pod itself. Without advice (no history, or too little) nothing lower is believed.
    Members granted unequal shares (none of kubecell's making) hold the largest, so a GPU is never counted
    emptier than it is."""
    member = spec.member
    if spec.groups or not member.is_share or not granted_milli:
        return spec
    milli = max(granted_milli)
    if not 0 < milli < member.gpu_milli:
        return spec
    if advice_milli is None or milli < advice_milli:
        return spec
    return dataclasses.replace(spec, member=dataclasses.replace(member, gpu_milli=milli))
