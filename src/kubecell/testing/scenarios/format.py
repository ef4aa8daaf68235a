"""The conformance-scenario file format: what a scenario is, step by step, and the checks of its values.

The format re-authors HiveD's language-neutral test cases (``SchedulePod`` / ``AssertPodBindResult`` /
``AssertPodPreemptResult`` / ``AssertPodWait`` / ``SetNodeToBad``) and extends them with the failure
reports of other schedulers (Volcano, Kueue, KAI). Assertions are about outcomes and invariants (which
job runs, in which class, on one node or one rack, who was evicted, why a job waits), never about
incidental GPU indices, so a scenario survives tie-breaking changes in the engine.

A scenario file::

    name: gang-deadlock
    description: why this case matters, citing its source (HiveD feature or issue number)
    policy: kubecell              # quota | hived | kubecell
    options: {starvation_seconds: 30}   # overrides of EngineOptions fields (optional)
    autoConfirm: true             # confirm RESERVED preemptors after every cycle (default true)
    known_failure: "..."          # optional: the engine is known to get this wrong (tests xfail strictly)
    cluster:                      # exactly the dynamic simulator's cluster description
      nodeGroups:                 # (kubecell.inputs.cluster): node groups and/or explicit nodes
        - {count: 4, namePrefix: n, nameDigits: 1, gpu: {model: V100M32, count: 8}, cpuMilli: 128000,
           memoryMiB: 1048576, rackSize: 2, rackPrefix: rack, nvlinkGroups: [[0, 1, 2, 3], [4, 5, 6, 7]]}
      nodes:                      # n0 ... n3 in racks rack0, rack1, and one explicit node
        - {name: big-0, gpu: {model: A100, count: 8}, cpuMilli: 128000, memoryMiB: 1048576, rack: r9}
    tenants: {virtualClusters: {a: {cells: {V100M32x8/rack: 1}}, b: {gpus: {count: 16, chain: V100M32x8}}}}
    steps:
      - at: 0
        submit: {name: j1, vc: a, gpus: 8, members: 2, topology: rack}
      - expect_bound: {job: j1, class: guaranteed, same_rack: true}

``cluster`` and ``tenants`` are read by the same code as the simulator's cluster and tenant files, so
their errors name the scenario file, the line and the key path (``s.yaml:9: cluster.nodeGroups[0].gpu``).

Steps (one action each, plus an optional monotonic ``at`` time, a free-text ``note`` and ``cycle: false`` to
check an ``expect_*`` before the implied cycle):

* ``submit``: a job or a list of jobs: ``name``, ``vc``, ``gpus`` (whole GPUs per member) or ``milli``
  (a share of one GPU) and/or ``gpuMemoryMiB``, ``members``, ``min``, ``priority`` (-1 opportunistic),
  ``topology`` (nvlink | numa | node | rack | zone), ``models``, ``cpuMilli``, ``memoryMiB``.
  A heterogeneous gang gives ``groups`` instead of the member's keys: a list of member groups, each with
  ``name``, ``members`` (default 1), ``min`` (default ``members``: the group runs whole) and the member's
  keys (``gpus`` / ``milli`` / ``gpuMemoryMiB``, ``cpuMilli``, ``memoryMiB``, ``models``, and ``topology``
  nvlink | numa for each member); next to ``groups`` only ``name``, ``vc``, ``min`` (the total minimum,
  default the sum of the group minimums), ``priority``, ``topology`` (node | rack | zone) and ``work``::

      submit: {name: mpi, vc: a, min: 3, groups: [{name: launcher, cpuMilli: 4000},
                                                 {name: worker, gpus: 8, members: 4, min: 2}]}
* ``schedule``: run a cycle (``cycles: n``; ``confirm: false`` leaves RESERVED preemptors unconfirmed).
  A cycle is also run before every ``expect_*`` step when an event happened since the last one.
* ``finish`` (a running job ends), ``cancel`` (a waiting job is withdrawn), ``confirm`` (the driver bound a
  RESERVED preemptor): ``{job: name}``; ``mark_node_bad`` / ``mark_node_good``: ``{node: name}``;
  ``reload_config``: a tenant configuration, as ``tenants``.
* ``expect_bound``: the job holds capacity; optional ``class``, ``phase``, ``members``, ``gpus`` (GPU
  units held), ``nodes`` (how many), ``same_node``, ``same_rack``, ``within_cell`` (a cell id or a cell
  type), ``node_in``, ``node_not_in``, ``same_gpu_as``, ``not_same_gpu_as``, ``same_node_as``,
  ``not_same_node_as``, ``within_vc_cells`` (every GPU inside cells bound to the job's VC, or none),
  ``reason_contains`` (what ``Engine.queries.explain`` says of it: its class, its resizes and why).
* ``expect_waiting`` / ``expect_rejected``: ``job``, ``reason_contains`` (a string or a list of strings
  that must all appear, case-insensitive); ``expect_waiting`` also takes ``reason_not_contains``.
* ``expect_preempted``: ``jobs`` evicted since the previous ``expect_preempted``, ``not`` evicted,
  ``count``, ``exactly``. ``expect_downgraded``: the same for lazy preemption and reload downgrades;
  ``expect_shrunk``: the same for elastic jobs that gave up members and run on (a job shrunk twice is
  one entry; ``expect_bound`` with ``members`` and ``reason_contains`` states what is left and why).
* ``expect_class``, ``expect_phase``, ``expect_status`` (``vc`` plus any keys of ``Engine.queries.status()``),
  ``expect_preemptions`` (``job``, ``count``), ``expect_invariants``.

After every step the runner checks the engine's invariants (``Engine.check_invariants``, the same check
the unit suite uses): a consistent allocation book, no gang below its minimum or above its headcount,
nothing held by a job that is not running, every guaranteed job inside cells bound to its VC, usage
accounting that matches the running jobs, guaranteed use within each guarantee, and a specific reason
for every waiting job a cycle has seen. ``expect_invariants`` states that check as a step.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubecell.core.engine.options import EngineOptions
from kubecell.core.errors import InvalidInputError, KubecellError
from kubecell.core.model import Node
from kubecell.core.tenancy.config import Tenants, resolve_tenants
from kubecell.core.topology import CellForest
from kubecell.core.validation import Locator

# action -> (required argument keys, optional argument keys); None means "any mapping" (checked later)
ACTIONS: dict[str, tuple[frozenset[str], frozenset[str]] | None] = {
    "submit": None,
    "schedule": (frozenset(), frozenset({"cycles", "confirm"})),
    "finish": (frozenset({"job"}), frozenset()),
    "cancel": (frozenset({"job"}), frozenset()),
    "confirm": (frozenset({"job"}), frozenset()),
    "mark_node_bad": (frozenset({"node"}), frozenset()),
    "mark_node_good": (frozenset({"node"}), frozenset()),
    "reload_config": None,
    "expect_bound": (frozenset({"job"}), frozenset({
        "class", "phase", "members", "gpus", "same_node", "same_rack", "within_cell", "node_in", "node_not_in",
        "same_gpu_as", "not_same_gpu_as", "same_node_as", "not_same_node_as", "within_vc_cells", "nodes",
        "reason_contains"})),
    "expect_waiting": (frozenset({"job"}), frozenset({"reason_contains", "reason_not_contains"})),
    "expect_rejected": (frozenset({"job"}), frozenset({"reason_contains"})),
    "expect_preempted": (frozenset(), frozenset({"jobs", "not", "count", "exactly"})),
    "expect_downgraded": (frozenset(), frozenset({"jobs", "not", "count", "exactly"})),
    "expect_shrunk": (frozenset(), frozenset({"jobs", "not", "count", "exactly"})),
    "expect_class": (frozenset({"job", "class"}), frozenset()),
    "expect_phase": (frozenset({"job", "phase"}), frozenset()),
    "expect_status": (frozenset({"vc"}), frozenset()),  # plus any status key (checked when run)
    "expect_preemptions": (frozenset({"job", "count"}), frozenset()),
    "expect_invariants": (frozenset(), frozenset()),
}
STEP_KEYS = frozenset({"at", "note", "cycle"})
SUBMIT_KEYS = frozenset({"name", "vc", "gpus", "milli", "gpuMemoryMiB", "members", "min", "priority", "topology",
                         "models", "cpuMilli", "memoryMiB", "work", "groups"})
GANG_KEYS = frozenset({"name", "vc", "groups", "min", "priority", "topology", "work"})
"""What a job with ``groups`` may say next to them (the member's keys go inside each group)."""
GROUP_KEYS = frozenset({"name", "members", "min", "gpus", "milli", "gpuMemoryMiB", "cpuMilli", "memoryMiB", "models",
                        "topology"})
TOP_KEYS = frozenset({"name", "description", "policy", "options", "cluster", "tenants", "steps", "known_failure",
                      "autoConfirm"})


class ScenarioInputError(InvalidInputError):
    """The scenario itself is malformed at a step (unknown job or node, bad value); raised while running."""


class ScenarioFailure(KubecellError, AssertionError):  # noqa: N818 - the name the suite's users know
    """A scenario's expectation did not hold, or the engine broke an invariant or crashed."""

    def __init__(self, message: str, *, location: str, source: str, step: int | None = None,
                 action: str | None = None) -> None:
        self.location = location
        self.source = source
        self.step = step
        self.action = action
        self.message = message
        super().__init__(f"{location}: {message}")


@dataclass(frozen=True, slots=True)
class TenantSection:
    """A tenant configuration written in the scenario (``tenants`` or a ``reload_config`` step), kept
    with its locator so that errors found when it is resolved name its line in the scenario file."""

    raw: Any
    source: str
    locate: Locator

    def resolve(self, forest: CellForest) -> Tenants:
        return resolve_tenants(self.raw, forest, source=self.source, locate=self.locate)


@dataclass(frozen=True, slots=True)
class Step:
    index: int
    action: str
    args: Any
    at: float | None
    note: str = ""
    cycle: bool = True
    """Run the implied scheduling cycle before an ``expect_*`` step (``cycle: false`` inspects the state
    an event left behind, before the engine reacts)."""
    location: str = ""
    """``file:line: steps[i] (action)``, the prefix of every message about this step."""


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    source: str
    policy: str
    options: EngineOptions
    nodes: tuple[Node, ...]
    tenants: TenantSection
    steps: tuple[Step, ...]
    known_failure: str | None = None
    auto_confirm: bool = True


# ---------------------------------------------------------------------- checks of values
def require_mapping(value: Any, location: str, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidInputError(f"{what} must be a mapping, got {type(value).__name__}", location=location)
    return value


def check_keys(value: Mapping[str, Any], allowed: Iterable[str], location: str, required: Iterable[str] = ()) -> None:
    allowed_set = set(allowed) | set(required)
    unknown = sorted(str(k) for k in value if k not in allowed_set)
    if unknown:
        raise InvalidInputError(f"unknown key(s) {', '.join(unknown)}", location=location,
                                accepted=", ".join(sorted(allowed_set)) or "no keys")
    missing = sorted(k for k in required if k not in value)
    if missing:
        raise InvalidInputError(f"missing key(s) {', '.join(missing)}", location=location)


def as_int(value: Any, location: str, name: str, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(f"{name} must be an integer, got {value!r}", location=location, field=name)
    if minimum is not None and value < minimum:
        raise InvalidInputError(f"{name} {value} < {minimum}", location=location, field=name)
    return value


def as_number(value: Any, location: str, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidInputError(f"{name} must be a finite number, got {value!r}", location=location, field=name)
    return float(value)


def as_str(value: Any, location: str, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"{name} must be a non-empty string, got {value!r}", location=location, field=name)
    return value


def as_str_list(value: Any, location: str, name: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidInputError(f"{name} must be a string or a list of strings", location=location, field=name)
    return list(value)
