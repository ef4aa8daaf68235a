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
from collections.abc import Mapping
from typing import Any, Protocol

from kubecell.core.engine.job import JobSpec
from kubecell.core.interference.profile import SoloProfile


class Knowledge(Protocol):
    def expected_seconds(self, pod: Mapping[str, Any]) -> float | None:
        """How long a job of this pod's family is expected to run; None: no history."""

    def profile(self, pod: Mapping[str, Any]) -> SoloProfile | None:
        """What a job of this pod's family uses alone, per GPU; None: no history."""


def informed(spec: JobSpec, pod: Mapping[str, Any], knowledge: Knowledge | None) -> JobSpec:
    """``spec`` with what ``knowledge`` says of ``pod``'s family. A gang of member groups gets the run time only:
    a profile describes one shape, and only shares are judged by the co-location rule."""
    if knowledge is None:
        return spec
    expected = knowledge.expected_seconds(pod)
    profile = knowledge.profile(pod) if not spec.groups and spec.member.is_share else None
    if expected is None and profile is None:
        return spec
    member = dataclasses.replace(spec.member, profile=profile) if profile is not None else spec.member
    return dataclasses.replace(spec, member=member, expected_seconds=expected)
