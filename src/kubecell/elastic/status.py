"""An ElasticJob's status as the controller reads and writes it: the phase, counts and conditions.

Why a module of its own: the status is the controller's memory across restarts, and anyone with status rights
may edit it, so reading it is a small parser of untrusted input (every field checked, bounded, defaulted),
kept apart from the reconcile loop that acts on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubecell.elastic import workers as readers
from kubecell.elastic.states import ACTIVE, TERMINAL, Decision, Phase, Worker
from kubecell.kube import conditions
from kubecell.kube.elasticjobs import worker_selector

CONDITION_ACCEPTED = "Accepted"
"""True when the spec can be run; False with reason InvalidSpec and the problem as its message."""
CONDITION_AVAILABLE = "Available"
"""True while at least minReplicas workers are Ready (training can proceed). Its reason and message are the
phase's; its lastTransitionTime starts the rendezvous deadline when it turns False."""
OUR_CONDITIONS = (CONDITION_ACCEPTED, CONDITION_AVAILABLE)
MAX_COUNT = 2**31 - 1
MAX_GENERATION = 2**63 - 1
MAX_CONDITIONS = 16
"""The CRD's ``maxItems`` for ``status.conditions``: more than that was not written through the schema."""


@dataclass(frozen=True, slots=True)
class StatusView:
    """The job's status as the controller wrote it (read defensively: anyone with status rights may edit it)."""

    phase: Phase = Phase.PENDING
    reason: str = ""
    message: str = ""
    restarts: int = 0
    target: int = 0
    observed_generation: int = -1
    last_resize: str | None = None
    """Shown, and written back unchanged while the workers do not change; never a clock (``elastic.stall``)."""
    conditions: tuple[Mapping[str, Any], ...] = ()


def count(value: Any, most: int = MAX_COUNT) -> int:
    """A count the API server stores (status fields, generation); 0 for anything else."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= most else 0


def read_status(obj: Mapping[str, Any]) -> StatusView:
    status = obj.get("status")
    if not isinstance(status, Mapping):
        return StatusView()
    try:
        phase = Phase(status.get("phase") or Phase.PENDING)
    except ValueError:
        phase = Phase.PENDING
    listed = status.get("conditions")
    kept = tuple(c for c in (listed if isinstance(listed, list | tuple) else ())[:MAX_CONDITIONS]
                 if isinstance(c, Mapping))
    available = next((c for c in kept if c.get("type") == CONDITION_AVAILABLE), None)
    reason = message = ""
    if available is not None:
        reason = str(available.get("reason") or "")[:1024]
        message = str(available.get("message") or "")[:32768]
    generation = status.get("observedGeneration")
    last = status.get("lastResizeTime")
    return StatusView(phase=phase, reason=reason, message=message, restarts=count(status.get("restarts")),
                      target=count(status.get("targetReplicas")),
                      observed_generation=count(generation, MAX_GENERATION) if generation is not None else -1,
                      last_resize=last if isinstance(last, str) and readers.parse_time(last) is not None else None,
                      conditions=kept)


def foreign_conditions(written: tuple[Mapping[str, Any], ...]) -> list[dict[str, Any]]:
    """The conditions of other writers, written back beside the controller's own: the first ``MAX_CONDITIONS``
    less ours, so that the status written stays within the CRD's ``maxItems``. Whoever may patch the status
    could fill it with 15 or 16 of their own: written back with ours, every status write of the job was
    refused (422), and since the status is written before any action, the job was never acted on again."""
    others = [dict(c) for c in written if c.get("type") not in OUR_CONDITIONS]
    return others[:MAX_CONDITIONS - len(OUR_CONDITIONS)]


def condition(kind: str, true: bool, reason: str, message: str, generation: int,
              previous: tuple[Mapping[str, Any], ...], now: str) -> dict[str, Any]:
    """The controller's condition ``kind`` (``kube.conditions``: its transition time moves only when its status
    does), in place of the one of its type among ``previous``."""
    before = next((c for c in previous if c.get("type") == kind), None)
    return conditions.condition(kind, true, reason, message, now, previous=before, generation=generation)


def status_body(name: str, previous: StatusView, decision: Decision, workers: Mapping[int, Worker],
                min_replicas: int | None, problem: str | None, generation: int, stamp: str) -> dict[str, Any]:
    """The status the controller writes for ``decision`` (``min_replicas`` None: a spec that cannot be read):
    its own two conditions after those of other writers (bounded, ``foreign_conditions``), ``lastResizeTime``
    moved only by a change."""
    ready = sum(state is Worker.READY for state in workers.values())
    available = (min_replicas is not None and decision.phase not in TERMINAL and decision.phase is not Phase.INVALID
                 and ready >= min_replicas)
    accepted = condition(CONDITION_ACCEPTED, problem is None, "Accepted" if problem is None else "InvalidSpec",
                         problem or "the spec can be run", generation, previous.conditions, stamp)
    available_condition = condition(CONDITION_AVAILABLE, available, decision.reason, decision.message,
                                    generation, previous.conditions, stamp)
    status: dict[str, Any] = {
        "phase": str(decision.phase),
        "replicas": sum(state in ACTIVE for state in workers.values()),
        "readyReplicas": ready,
        "targetReplicas": decision.established,
        "selector": worker_selector(name),
        "restarts": decision.restarts,
        "observedGeneration": generation,
        "conditions": [*foreign_conditions(previous.conditions), accepted, available_condition],
    }
    last = stamp if decision.changed else previous.last_resize
    if last is not None:
        status["lastResizeTime"] = last
    return status
