"""Conformance scenarios: small YAML stories that drive the engine step by step and check outcomes.

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
    cluster:                      # node groups and/or explicit nodes
      - {count: 4, gpus: 8, model: V100M32, racksOf: 2, nvlinkGroups: [[0, 1, 2, 3], [4, 5, 6, 7]]}
      - {name: big-0, gpus: 8, model: A100, rack: r9}
    tenants: {virtualClusters: {a: {gpus: 16}, b: {cells: {V100M32x8/node: 2}}}}
    steps:
      - at: 0
        submit: {name: j1, vc: a, gpus: 8, members: 2, topology: rack}
      - expect_bound: {job: j1, class: guaranteed, same_rack: true}

Steps (one action each, plus an optional monotonic ``at`` time, a free-text ``note`` and ``cycle: false`` to
check an ``expect_*`` before the implied cycle):

* ``submit``: a job or a list of jobs: ``name``, ``vc``, ``gpus`` (whole GPUs per member) or ``milli``
  (a share of one GPU) and/or ``gpuMemoryMiB``, ``members``, ``min``, ``priority`` (-1 opportunistic),
  ``topology`` (nvlink | numa | node | rack | zone), ``models``, ``cpuMilli``, ``memoryMiB``.
* ``schedule``: run a cycle (``cycles: n``; ``confirm: false`` leaves RESERVED preemptors unconfirmed).
  A cycle is also run before every ``expect_*`` step when an event happened since the last one.
* ``finish`` (a running job ends), ``cancel`` (a waiting job is withdrawn), ``confirm`` (the driver bound a
  RESERVED preemptor): ``{job: name}``; ``mark_node_bad`` / ``mark_node_good``: ``{node: name}``;
  ``reload_config``: a tenant configuration, as ``tenants``.
* ``expect_bound``: the job holds capacity; optional ``class``, ``phase``, ``members``, ``gpus`` (GPU
  units held), ``nodes`` (how many), ``same_node``, ``same_rack``, ``within_cell`` (a cell id or a cell
  type), ``node_in``, ``node_not_in``, ``same_gpu_as``, ``not_same_gpu_as``, ``same_node_as``,
  ``not_same_node_as``, ``within_vc_cells`` (every GPU inside cells bound to the job's VC, or none).
* ``expect_waiting`` / ``expect_rejected``: ``job``, ``reason_contains`` (a string or a list of strings
  that must all appear, case-insensitive); ``expect_waiting`` also takes ``reason_not_contains``.
* ``expect_preempted``: ``jobs`` evicted since the previous ``expect_preempted``, ``not`` evicted,
  ``count``, ``exactly``. ``expect_downgraded``: the same for lazy preemption and reload downgrades.
* ``expect_class``, ``expect_phase``, ``expect_status`` (``vc`` plus any keys of ``Engine.status()``),
  ``expect_preemptions`` (``job``, ``count``), ``expect_invariants``.

After every step the runner checks the engine's invariants (``Engine.check_invariants``, the same check
the unit suite uses): a consistent allocation book, no gang below its minimum or above its headcount,
nothing held by a job that is not running, every guaranteed job inside cells bound to its VC, usage
accounting that matches the running jobs, guaranteed use within each guarantee, and a specific reason
for every waiting job a cycle has seen. ``expect_invariants`` states that check as a step.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from kubecell.core.engine.engine import CycleResult, Engine
from kubecell.core.engine.invariants import EngineInvariantError
from kubecell.core.engine.job import Job, JobClass, JobPhase, JobSpec
from kubecell.core.engine.options import PRESETS, EngineOptions
from kubecell.core.errors import InvalidInputError, KubecellError
from kubecell.core.model import MILLI_PER_GPU, Node, Request, TopologyLevel, make_node
from kubecell.core.tenancy.config import Tenants, resolve_tenants
from kubecell.core.topology import Cell, CellForest

DEFAULT_CPU_MILLI = 128_000
DEFAULT_MEMORY_MIB = 1_048_576
DEFAULT_MODEL = "V100M32"

_GENERIC_REASONS = ("not yet considered", "submitted; waiting for the next scheduling cycle")

# action -> (required argument keys, optional argument keys); None means "any mapping" (checked later)
_ACTIONS: dict[str, tuple[frozenset[str], frozenset[str]] | None] = {
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
        "same_gpu_as", "not_same_gpu_as", "same_node_as", "not_same_node_as", "within_vc_cells", "nodes"})),
    "expect_waiting": (frozenset({"job"}), frozenset({"reason_contains", "reason_not_contains"})),
    "expect_rejected": (frozenset({"job"}), frozenset({"reason_contains"})),
    "expect_preempted": (frozenset(), frozenset({"jobs", "not", "count", "exactly"})),
    "expect_downgraded": (frozenset(), frozenset({"jobs", "not", "count", "exactly"})),
    "expect_class": (frozenset({"job", "class"}), frozenset()),
    "expect_phase": (frozenset({"job", "phase"}), frozenset()),
    "expect_status": (frozenset({"vc"}), frozenset()),  # plus any status key (checked when run)
    "expect_preemptions": (frozenset({"job", "count"}), frozenset()),
    "expect_invariants": (frozenset(), frozenset()),
}
_STEP_KEYS = frozenset({"at", "note", "cycle"})
_SUBMIT_KEYS = frozenset({"name", "vc", "gpus", "milli", "gpuMemoryMiB", "members", "min", "priority", "topology",
                          "models", "cpuMilli", "memoryMiB", "work"})
_TOP_KEYS = frozenset({"name", "description", "policy", "options", "cluster", "tenants", "steps", "known_failure",
                       "autoConfirm"})
_GROUP_KEYS = frozenset({"count", "gpus", "model", "cpuMilli", "memoryMiB", "racksOf", "nvlinkGroups", "numaGroups",
                         "prefix", "rackPrefix", "zone", "gpuMemoryMiB"})
_NODE_KEYS = frozenset({"name", "gpus", "model", "cpuMilli", "memoryMiB", "rack", "zone", "nvlinkGroups", "numaGroups",
                        "gpuMemoryMiB"})


class ScenarioInputError(InvalidInputError):
    """The scenario itself is malformed at a step (unknown job or node, bad value); raised while running."""


class ScenarioFailure(KubecellError, AssertionError):  # noqa: N818 - the name the suite's users know
    """A scenario's expectation did not hold, or the engine broke an invariant or crashed."""

    def __init__(self, message: str, *, source: str, step: int | None = None, action: str | None = None) -> None:
        self.source = source
        self.step = step
        self.action = action
        self.message = message
        super().__init__(f"{_fmt_location(source, step, action)}: {message}")


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


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    source: str
    policy: str
    options: EngineOptions
    nodes: tuple[Node, ...]
    tenants: Mapping[str, Any]
    steps: tuple[Step, ...]
    known_failure: str | None = None
    auto_confirm: bool = True


@dataclass(slots=True)
class ScenarioResult:
    scenario: Scenario
    engine: Engine
    cycles: int
    seconds: float
    log: list[str] = field(default_factory=list)


# ====================================================================== loading
def _fmt_location(source: str, step: int | None, action: str | None = None) -> str:
    if step is None:
        return source
    return f"{source}: steps[{step}]" + (f" ({action})" if action else "")


def _require_mapping(value: Any, location: str, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidInputError(f"{what} must be a mapping, got {type(value).__name__}", location=location)
    return value


def _check_keys(value: Mapping[str, Any], allowed: Iterable[str], location: str,
                required: Iterable[str] = ()) -> None:
    allowed_set = set(allowed) | set(required)
    unknown = sorted(str(k) for k in value if k not in allowed_set)
    if unknown:
        raise InvalidInputError(f"unknown key(s) {', '.join(unknown)}", location=location,
                                accepted=", ".join(sorted(allowed_set)) or "no keys")
    missing = sorted(k for k in required if k not in value)
    if missing:
        raise InvalidInputError(f"missing key(s) {', '.join(missing)}", location=location)


def _int(value: Any, location: str, name: str, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(f"{name} must be an integer, got {value!r}", location=location, field=name)
    if minimum is not None and value < minimum:
        raise InvalidInputError(f"{name} {value} < {minimum}", location=location, field=name)
    return value


def _number(value: Any, location: str, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidInputError(f"{name} must be a finite number, got {value!r}", location=location, field=name)
    return float(value)


def _str(value: Any, location: str, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"{name} must be a non-empty string, got {value!r}", location=location, field=name)
    return value


def _str_list(value: Any, location: str, name: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidInputError(f"{name} must be a string or a list of strings", location=location, field=name)
    return list(value)


def _groups(value: Any, location: str, name: str) -> list[list[int]]:
    if not isinstance(value, list) or not all(
            isinstance(g, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in g) for g in value):
        raise InvalidInputError(f"{name} must be a list of lists of GPU indices", location=location, field=name)
    return [list(g) for g in value]


def _build_nodes(raw: Any, source: str) -> tuple[Node, ...]:
    location = f"{source}: cluster"
    entries: list[Any]
    if isinstance(raw, Mapping):
        _check_keys(raw, ("groups", "nodes"), location)
        entries = [*(raw.get("groups") or []), *(raw.get("nodes") or [])]
    elif isinstance(raw, list):
        entries = list(raw)
    else:
        raise InvalidInputError("cluster must be a list of node groups and nodes", location=location,
                                accepted="[{count: 4, gpus: 8, model: V100M32, racksOf: 2}, {name: n9, gpus: 8}]")
    counters: dict[str, int] = {}
    nodes: list[Node] = []
    for position, entry in enumerate(entries):
        where = f"{location}[{position}]"
        item = _require_mapping(entry, where, "a node group or node")
        gpus = _int(item.get("gpus", 8), where, "gpus", 0)
        model = str(item.get("model", DEFAULT_MODEL)) if gpus else ""
        cpu = _int(item.get("cpuMilli", DEFAULT_CPU_MILLI), where, "cpuMilli", 0)
        memory = _int(item.get("memoryMiB", DEFAULT_MEMORY_MIB), where, "memoryMiB", 0)
        gpu_memory = item.get("gpuMemoryMiB")
        gpu_memory_mib = None if gpu_memory is None else _int(gpu_memory, where, "gpuMemoryMiB", 1)
        nvlink = _groups(item.get("nvlinkGroups", []), where, "nvlinkGroups")
        numa = _groups(item.get("numaGroups", []), where, "numaGroups")
        zone = str(item.get("zone", ""))
        if "count" in item:
            _check_keys(item, _GROUP_KEYS, where)
            count = _int(item["count"], where, "count", 1)
            prefix = str(item.get("prefix", "n"))
            rack_prefix = str(item.get("rackPrefix", "rack"))
            racks_of = _int(item.get("racksOf", 0), where, "racksOf", 0)
            first_rack = counters.get("rack:" + rack_prefix, 0)
            for i in range(count):
                number = counters.get(prefix, 0)
                counters[prefix] = number + 1
                rack = f"{rack_prefix}{first_rack + i // racks_of}" if racks_of else ""
                nodes.append(make_node(f"{prefix}{number}", cpu_milli=cpu, memory_mib=memory, gpu_count=gpus,
                                       gpu_model=model, gpu_memory_mib=gpu_memory_mib, nvlink_groups=nvlink,
                                       numa_groups=numa, rack=rack, zone=zone, location=where))
            if racks_of:
                counters["rack:" + rack_prefix] = first_rack + math.ceil(count / racks_of)
        else:
            _check_keys(item, _NODE_KEYS, where, required=("name",))
            nodes.append(make_node(_str(item["name"], where, "name"), cpu_milli=cpu, memory_mib=memory,
                                   gpu_count=gpus, gpu_model=model, gpu_memory_mib=gpu_memory_mib,
                                   nvlink_groups=nvlink, numa_groups=numa, rack=str(item.get("rack", "")),
                                   zone=zone, location=where))
    if not nodes:
        raise InvalidInputError("the cluster has no nodes", location=location)
    names = [n.name for n in nodes]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise InvalidInputError(f"duplicate node names {', '.join(duplicates)}", location=location,
                                accepted="distinct 'prefix' values for node groups")
    return tuple(nodes)


def _options(policy: str, raw: Any, source: str) -> EngineOptions:
    location = f"{source}: options"
    key = policy.strip().lower()
    if key not in PRESETS:
        raise InvalidInputError(f"unknown policy {policy!r}", location=f"{source}: policy",
                                accepted=", ".join(PRESETS))
    options = PRESETS[key]
    if raw is None:
        return options
    mapping = _require_mapping(raw, location, "options")
    kinds = {f.name: str(f.type) for f in fields(EngineOptions) if f.name != "name"}
    _check_keys(mapping, kinds, location)
    changes: dict[str, object] = {}
    for key, value in mapping.items():
        kind = kinds[key]
        if value is None and "None" in kind:
            changes[key] = None
        elif kind == "bool":
            if not isinstance(value, bool):
                raise InvalidInputError(f"{key} must be true or false", location=location, field=key)
            changes[key] = value
        elif kind == "int":
            changes[key] = _int(value, location, key, 0)
        else:
            changes[key] = _number(value, location, key)
    return options.with_(**changes)


def _job_spec(raw: Any, location: str) -> JobSpec:
    item = _require_mapping(raw, location, "a job")
    _check_keys(item, _SUBMIT_KEYS, location, required=("name", "vc"))
    name = _str(item["name"], location, "name")
    where = f"{location} job {name!r}"
    gpus = item.get("gpus")
    milli = item.get("milli")
    gpu_memory = _int(item.get("gpuMemoryMiB", 0), where, "gpuMemoryMiB", 0)
    if gpus is not None and milli is not None:
        raise InvalidInputError("give either gpus (whole GPUs) or milli (a share of one GPU)", location=where)
    gpu_count, gpu_milli = 0, 0
    if gpus is not None:
        gpu_count, gpu_milli = _int(gpus, where, "gpus", 0), MILLI_PER_GPU
        if gpu_count == 0:
            gpu_milli = 0
    elif milli is not None:
        gpu_count, gpu_milli = 1, _int(milli, where, "milli", 1)
    elif gpu_memory:
        gpu_count = 1
    models = item.get("models")
    member = Request(
        name=name,
        cpu_milli=_int(item.get("cpuMilli", 0), where, "cpuMilli", 0),
        memory_mib=_int(item.get("memoryMiB", 0), where, "memoryMiB", 0),
        gpu_count=gpu_count,
        gpu_milli=gpu_milli,
        gpu_memory_mib=gpu_memory,
        gpu_models=None if models is None else frozenset(_str_list(models, where, "models")),
    )
    topology = item.get("topology")
    level = None if topology is None else TopologyLevel.parse(_str(topology, where, "topology"), location=where)
    members = _int(item.get("members", 1), where, "members", 1)
    minimum = item.get("min")
    return JobSpec(
        name=name,
        vc=_str(item["vc"], where, "vc"),
        member=member,
        members=members,
        min_members=None if minimum is None else _int(minimum, where, "min", 1),
        priority=_int(item.get("priority", 0), where, "priority"),
        topology=level,
        work=_number(item.get("work", 0), where, "work"),
    )


def _located(error: InvalidInputError, location: str) -> InvalidInputError:
    """The same error, placed in the scenario file (core errors name only the job or request)."""
    where = location if not error.location else f"{location}: {error.location}"
    return InvalidInputError(error.message, location=where, field=error.field, accepted=error.accepted)


def _parse_step(raw: Any, index: int, source: str) -> Step:
    location = _fmt_location(source, index)
    item = _require_mapping(raw, location, "a step")
    actions = [k for k in item if k not in _STEP_KEYS]
    if len(actions) != 1 or actions[0] not in _ACTIONS:
        raise InvalidInputError(
            f"a step needs exactly one action, found {', '.join(map(str, actions)) or 'none'}",
            location=location, accepted=", ".join(_ACTIONS) + " (plus optional at, note)")
    action = str(actions[0])
    location = _fmt_location(source, index, action)
    at = None if item.get("at") is None else _number(item["at"], location, "at")
    args: Any = item[action]
    if args is None:
        args = {}
    keys = _ACTIONS[action]
    if action == "submit":
        try:
            args = [_job_spec(one, location) for one in (args if isinstance(args, list) else [args])]
        except InvalidInputError as error:
            if (error.location or "").startswith(location):
                raise
            raise _located(error, location) from None
    elif action == "reload_config":
        args = _require_mapping(args, location, "reload_config")
    elif keys is not None:
        mapping = _require_mapping(args, location, f"the arguments of {action}")
        required, optional = keys
        # expect_status takes any key of Engine.status(); those are checked against the engine when run
        _check_keys(mapping, set(mapping) if action == "expect_status" else optional, location, required=required)
        args = mapping
    cycle = item.get("cycle", True)
    if not isinstance(cycle, bool):
        raise InvalidInputError("cycle must be true or false", location=location, field="cycle")
    return Step(index, action, args, at, str(item.get("note", "")), cycle)


def parse_scenario(data: Any, source: str) -> Scenario:
    """Validate a parsed scenario document; errors name ``source`` and the step."""
    top = _require_mapping(data, source, "a scenario")
    _check_keys(top, _TOP_KEYS, source, required=("name", "cluster", "tenants", "steps"))
    policy = _str(top.get("policy", "kubecell"), source, "policy")
    options = _options(policy, top.get("options"), source)
    nodes = _build_nodes(top["cluster"], source)
    tenants = _require_mapping(top["tenants"], f"{source}: tenants", "tenants")
    resolve_tenants(tenants, CellForest(nodes), source=f"{source}: tenants")  # fail early on bad configs
    steps_raw = top["steps"]
    if not isinstance(steps_raw, list) or not steps_raw:
        raise InvalidInputError("steps must be a non-empty list", location=f"{source}: steps")
    steps = tuple(_parse_step(raw, index, source) for index, raw in enumerate(steps_raw))
    clock = 0.0
    for step in steps:
        if step.at is not None:
            if step.at < clock:
                raise InvalidInputError(f"time goes backwards ({step.at:g} < {clock:g})",
                                        location=_fmt_location(source, step.index, step.action), field="at",
                                        accepted="non-decreasing 'at' values")
            clock = step.at
    known = top.get("known_failure")
    auto = top.get("autoConfirm", True)
    if not isinstance(auto, bool):
        raise InvalidInputError("autoConfirm must be true or false", location=source, field="autoConfirm")
    return Scenario(
        name=_str(top["name"], source, "name"),
        description=str(top.get("description", "")),
        source=source,
        policy=policy,
        options=options,
        nodes=nodes,
        tenants=tenants,
        steps=steps,
        known_failure=None if known is None else _str(known, source, "known_failure"),
        auto_confirm=auto,
    )


def load_scenario(path: str | Path) -> Scenario:
    path = Path(path)
    source = str(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise InvalidInputError(f"not valid YAML: {error}".replace("\n", " "), location=source) from None
    except OSError as error:
        raise InvalidInputError(f"cannot read: {error}", location=source) from None
    return parse_scenario(data, source)


def discover(directory: str | Path) -> list[Path]:
    return sorted(Path(directory).glob("*.yaml"))


# ====================================================================== running
def _contains_all(text: str, wanted: Sequence[str]) -> list[str]:
    low = text.lower()
    return [w for w in wanted if w.lower() not in low]


class _Runner:
    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.forest = CellForest(scenario.nodes)
        tenants = resolve_tenants(scenario.tenants, self.forest, source=f"{scenario.source}: tenants")
        self.engine = Engine(scenario.nodes, tenants, scenario.options, forest=self.forest)
        self.now = 0.0
        self.changed = True
        self.cycles = 0
        self.evicted: list[str] = []
        self.downgraded: list[str] = []
        self.log: list[str] = []
        self.step: Step | None = None

    # ------------------------------------------------------------------ helpers
    def fail(self, message: str) -> ScenarioFailure:
        step = self.step
        return ScenarioFailure(message, source=self.scenario.source, step=step.index if step else None,
                               action=step.action if step else None)

    def invalid(self, message: str, **kwargs: Any) -> ScenarioInputError:
        step = self.step
        return ScenarioInputError(message, location=_fmt_location(self.scenario.source, step.index if step else None,
                                                                 step.action if step else None), **kwargs)

    def job(self, name: Any) -> Job:
        if not isinstance(name, str) or name not in self.engine.jobs:
            raise self.invalid(f"no job named {name!r} was submitted", field="job",
                               accepted=", ".join(self.engine.jobs) or "none yet")
        return self.engine.jobs[name]

    def describe(self, job: Job) -> str:
        where = sorted({self.engine.book.allocations[a].node for a in job.running_members
                        if a in self.engine.book.allocations})
        cls = job.job_class.value if job.job_class else "-"
        return (f"[{job.name}: phase={job.phase.value} class={cls} members={job.size}/{job.spec.members} "
                f"preemptions={job.preemptions} nodes={where} reason={job.wait_reason!r}]")

    def gpus_of(self, job: Job) -> list[tuple[int, int, int]]:
        """(node index, GPU index, milli) per GPU slot the job holds."""
        book = self.engine.book
        out: list[tuple[int, int, int]] = []
        for name in job.running_members:
            allocation = book.allocations[name]
            for gpu in allocation.gpu_indices:
                out.append((book.index[allocation.node], gpu, allocation.gpu_milli))
        return out

    def nodes_of(self, job: Job) -> set[str]:
        return {self.engine.book.allocations[a].node for a in job.running_members}

    # ------------------------------------------------------------------ the loop
    def run(self) -> ScenarioResult:
        started = time.perf_counter()
        for step in self.scenario.steps:
            self.step = step
            if step.at is not None:
                if step.at < self.now:
                    raise self.invalid(f"time goes backwards ({step.at:g} < {self.now:g})", field="at",
                                       accepted="non-decreasing 'at' values")
                self.now = step.at
            try:
                self.perform(step)
            except (ScenarioFailure, ScenarioInputError):
                raise
            except Exception as error:  # an engine crash (any error it raises) is a failure of the scenario
                raise self.fail(f"the engine raised {type(error).__name__}: {error}") from error
            self.check_invariants()
        self.step = None
        return ScenarioResult(self.scenario, self.engine, self.cycles, time.perf_counter() - started, self.log)

    def perform(self, step: Step) -> None:
        handler: Callable[[Any], None] = getattr(self, "do_" + step.action)
        if step.action.startswith("expect_") and self.changed and step.cycle:
            self.cycle(confirm=self.scenario.auto_confirm)
        handler(step.args)

    def cycle(self, *, confirm: bool) -> CycleResult:
        result = self.engine.schedule(self.now)
        self.cycles += 1
        self.changed = False
        self.evicted.extend(j.name for j in result.evicted)
        self.downgraded.extend(j.name for j in result.downgraded)
        if confirm:
            for job in result.started:
                if job.phase == JobPhase.RESERVED:
                    self.engine.confirm(job.name, self.now)
        self.log.append(f"t={self.now:g} cycle: started={[j.name for j in result.started]} "
                        f"evicted={[j.name for j in result.evicted]} downgraded={[j.name for j in result.downgraded]} "
                        f"grown={[j.name for j in result.grown]}")
        return result

    # ------------------------------------------------------------------ events
    def do_submit(self, specs: list[JobSpec]) -> None:
        for spec in specs:
            self.engine.submit(replace(spec, submit_time=self.now), self.now)
            self.log.append(f"t={self.now:g} submit {spec.name}")
        self.changed = True

    def do_schedule(self, args: Mapping[str, Any]) -> None:
        cycles = _int(args.get("cycles", 1), self.location(), "cycles", 1)
        confirm = args.get("confirm", self.scenario.auto_confirm)
        if not isinstance(confirm, bool):
            raise self.invalid("confirm must be true or false", field="confirm")
        for _ in range(cycles):
            self.cycle(confirm=confirm)

    def location(self) -> str:
        step = self.step
        return _fmt_location(self.scenario.source, step.index if step else None, step.action if step else None)

    def do_finish(self, args: Mapping[str, Any]) -> None:
        job = self.job(args["job"])
        if job.phase not in (JobPhase.RUNNING, JobPhase.RESERVED):
            raise self.fail(f"cannot finish {job.name}, it is not running (use cancel for a waiting job; a cycle "
                            f"runs only before expect_* and schedule steps): {self.describe(job)}")
        self.engine.finish(job.name, self.now)
        self.changed = True

    def do_cancel(self, args: Mapping[str, Any]) -> None:
        job = self.job(args["job"])
        if job.phase != JobPhase.PENDING:
            raise self.fail(f"cannot cancel {job.name}, it is not waiting: {self.describe(job)}")
        self.engine.cancel(job.name, self.now)
        self.changed = True

    def do_confirm(self, args: Mapping[str, Any]) -> None:
        job = self.job(args["job"])
        if job.phase != JobPhase.RESERVED:
            raise self.fail(f"{job.name} is not reserved: {self.describe(job)}")
        self.engine.confirm(job.name, self.now)
        self.changed = True

    def _node(self, args: Mapping[str, Any]) -> str:
        name = args["node"]
        if name not in self.engine.book.index:
            raise self.invalid(f"unknown node {name!r}", field="node",
                               accepted=", ".join(n.name for n in self.engine.book.nodes))
        return str(name)

    def do_mark_node_bad(self, args: Mapping[str, Any]) -> None:
        killed = self.engine.set_node_health(self._node(args), False, self.now)
        self.log.append(f"t={self.now:g} node {args['node']} bad; stopped {[j.name for j in killed]}")
        self.changed = True

    def do_mark_node_good(self, args: Mapping[str, Any]) -> None:
        self.engine.set_node_health(self._node(args), True, self.now)
        self.changed = True

    def do_reload_config(self, raw: Mapping[str, Any]) -> None:
        try:
            tenants: Tenants = resolve_tenants(raw, self.forest, source=self.location())
        except InvalidInputError as error:
            raise ScenarioInputError(error.message, location=error.location, field=error.field,
                                     accepted=error.accepted) from None
        downgraded = self.engine.reload(tenants, self.now)
        self.downgraded.extend(j.name for j in downgraded)
        self.log.append(f"t={self.now:g} reload; downgraded {[j.name for j in downgraded]}")
        self.changed = True

    # ------------------------------------------------------------------ expectations
    def _class(self, value: Any) -> JobClass:
        try:
            return JobClass(str(value).lower())
        except ValueError:
            raise self.invalid(f"unknown class {value!r}", field="class",
                               accepted=", ".join(c.value for c in JobClass)) from None

    def _phase(self, value: Any) -> JobPhase:
        try:
            return JobPhase(str(value).lower())
        except ValueError:
            raise self.invalid(f"unknown phase {value!r}", field="phase",
                               accepted=", ".join(p.value for p in JobPhase)) from None

    def _bool(self, args: Mapping[str, Any], key: str) -> bool | None:
        value = args.get(key)
        if value is None:
            return None
        if not isinstance(value, bool):
            raise self.invalid(f"{key} must be true or false", field=key)
        return value

    def do_expect_bound(self, args: Mapping[str, Any]) -> None:
        job = self.job(args["job"])
        state = self.describe(job)
        if job.phase not in (JobPhase.RUNNING, JobPhase.RESERVED) or not job.running_members:
            raise self.fail(f"expected {job.name} to be bound, but it is not: {state}")
        if "phase" in args and job.phase != self._phase(args["phase"]):
            raise self.fail(f"expected {job.name} in phase {args['phase']}: {state}")
        if "class" in args and job.job_class != self._class(args["class"]):
            raise self.fail(f"expected {job.name} to run as {args['class']}: {state}")
        if "members" in args and job.size != _int(args["members"], self.location(), "members", 0):
            raise self.fail(f"expected {job.name} to run {args['members']} member(s): {state}")
        slots = self.gpus_of(job)
        if "gpus" in args:
            held = sum(milli for _, _, milli in slots) / MILLI_PER_GPU
            if abs(held - _number(args["gpus"], self.location(), "gpus")) > 1e-9:
                raise self.fail(f"expected {job.name} to hold {args['gpus']} GPU(s), it holds {held:g}: {state}")
        nodes = self.nodes_of(job)
        if "nodes" in args and len(nodes) != _int(args["nodes"], self.location(), "nodes", 1):
            raise self.fail(f"expected {job.name} on {args['nodes']} node(s), it is on {sorted(nodes)}: {state}")
        same_node = self._bool(args, "same_node")
        if same_node is not None and (len(nodes) == 1) != same_node:
            raise self.fail(f"expected {job.name} {'on one node' if same_node else 'on several nodes'}, "
                            f"it is on {sorted(nodes)}: {state}")
        same_rack = self._bool(args, "same_rack")
        if same_rack is not None:
            racks = {(n.zone, n.rack) for n in self.engine.book.nodes if n.name in nodes}
            if (len(racks) == 1 and all(r for _, r in racks)) != same_rack:
                raise self.fail(f"expected {job.name} {'in one rack' if same_rack else 'across racks'}, "
                                f"racks {sorted(r for _, r in racks)}: {state}")
        if "node_in" in args:
            allowed = set(_str_list(args["node_in"], self.location(), "node_in"))
            if not nodes <= allowed:
                raise self.fail(f"expected {job.name} only on {sorted(allowed)}, it is on {sorted(nodes)}: {state}")
        if "node_not_in" in args:
            banned = set(_str_list(args["node_not_in"], self.location(), "node_not_in"))
            if nodes & banned:
                raise self.fail(f"expected {job.name} off {sorted(banned)}, it is on {sorted(nodes)}: {state}")
        if "within_cell" in args:
            self._expect_within_cell(job, _str(args["within_cell"], self.location(), "within_cell"), slots)
        if "same_gpu_as" in args:
            other = self.job(args["same_gpu_as"])
            mine = {(n, g) for n, g, _ in slots}
            theirs = {(n, g) for n, g, _ in self.gpus_of(other)}
            if not mine or mine != theirs or len(mine) != 1:
                raise self.fail(f"expected {job.name} on the same single GPU as {other.name}: {state} "
                                f"{self.describe(other)}")
        if "not_same_gpu_as" in args:
            other = self.job(args["not_same_gpu_as"])
            shared = {(n, g) for n, g, _ in slots} & {(n, g) for n, g, _ in self.gpus_of(other)}
            if shared:
                raise self.fail(f"expected {job.name} to share no GPU with {other.name}: {state} "
                                f"{self.describe(other)}")
        if "same_node_as" in args:
            other = self.job(args["same_node_as"])
            if nodes != self.nodes_of(other) or len(nodes) != 1:
                raise self.fail(f"expected {job.name} on the node of {other.name}: {state} {self.describe(other)}")
        if "not_same_node_as" in args:
            other = self.job(args["not_same_node_as"])
            if nodes & self.nodes_of(other):
                raise self.fail(f"expected {job.name} away from {other.name}'s nodes: {state} {self.describe(other)}")
        within_vc = self._bool(args, "within_vc_cells")
        if within_vc is not None:
            outside = self._outside_vc_cells(job)
            if within_vc and outside:
                raise self.fail(f"expected {job.name} inside cells bound to VC {job.vc}; GPUs outside: "
                                f"{outside}: {state}")
            if not within_vc and not outside:
                raise self.fail(f"expected {job.name} outside VC {job.vc}'s bound cells: {state}")

    def _outside_vc_cells(self, job: Job) -> list[str]:
        tenancy = self.engine.tenancy
        mine = tenancy.vc_index.get(job.vc, -2)
        return [f"{self.engine.book.nodes[n].name}/{g}" for n, g, _ in self.gpus_of(job)
                if tenancy.owner[n, g] != mine]

    def _expect_within_cell(self, job: Job, target: str, slots: list[tuple[int, int, int]]) -> None:
        state = self.describe(job)
        gpus = {(n, g) for n, g, _ in slots}
        if target in self.forest.by_id:
            cell = self.forest.by_id[target]
            if not gpus <= set(cell.gpus):
                raise self.fail(f"expected {job.name} inside cell {target}: {state}")
            return
        try:
            self.forest.parse_type(target)
        except InvalidInputError:
            raise self.invalid(f"{target!r} is neither a cell id nor a cell type", field="within_cell",
                               accepted=", ".join(self.forest.type_names())) from None
        containers: set[Cell] = set()
        for key in gpus:
            leaf: Cell | None = self.forest.gpu_cell.get(key)
            while leaf is not None and leaf.type_name != target:
                leaf = leaf.parent
            if leaf is None:
                raise self.fail(f"expected {job.name} inside one {target} cell; a GPU is in none: {state}")
            containers.add(leaf)
        if len(containers) != 1:
            raise self.fail(f"expected {job.name} inside one {target} cell, it spans "
                            f"{sorted(c.id for c in containers)}: {state}")

    def _reason(self, job: Job, args: Mapping[str, Any]) -> None:
        explanation = self.engine.explain(job.name)
        if "reason_contains" in args:
            missing = _contains_all(explanation, _str_list(args["reason_contains"], self.location(),
                                                           "reason_contains"))
            if missing:
                raise self.fail(f"the reason for {job.name} lacks {missing}: {explanation!r}")
        if "reason_not_contains" in args:
            unwanted = _str_list(args["reason_not_contains"], self.location(), "reason_not_contains")
            found = [w for w in unwanted if w.lower() in explanation.lower()]
            if found:
                raise self.fail(f"the reason for {job.name} should not mention {found}: {explanation!r}")

    def do_expect_waiting(self, args: Mapping[str, Any]) -> None:
        job = self.job(args["job"])
        if job.phase != JobPhase.PENDING:
            raise self.fail(f"expected {job.name} to wait, but: {self.describe(job)}")
        if job.running_members:
            raise self.fail(f"waiting job {job.name} holds allocations: {self.describe(job)}")
        if job.wait_reason in _GENERIC_REASONS:
            raise self.fail(f"waiting job {job.name} has no specific reason: {self.describe(job)}")
        self._reason(job, args)

    def do_expect_rejected(self, args: Mapping[str, Any]) -> None:
        job = self.job(args["job"])
        if job.phase != JobPhase.REJECTED:
            raise self.fail(f"expected {job.name} to be rejected, but: {self.describe(job)}")
        self._reason(job, args)

    def _expect_set(self, args: Mapping[str, Any], seen: list[str], what: str) -> None:
        happened = set(seen)
        wanted = set(_str_list(args.get("jobs", []), self.location(), "jobs"))
        spared = set(_str_list(args.get("not", []), self.location(), "not"))
        for name in wanted | spared:
            self.job(name)
        record = f"{what} since the previous check: {sorted(happened) or 'none'}"
        if wanted - happened:
            raise self.fail(f"expected {sorted(wanted - happened)} {what}; {record}")
        if spared & happened:
            raise self.fail(f"expected {sorted(spared & happened)} not {what}; {record}")
        if "count" in args and len(happened) != _int(args["count"], self.location(), "count", 0):
            raise self.fail(f"expected {args['count']} job(s) {what}; {record}")
        exactly = self._bool(args, "exactly")
        if exactly and happened != wanted:
            raise self.fail(f"expected exactly {sorted(wanted)} {what}; {record}")
        seen.clear()

    def do_expect_preempted(self, args: Mapping[str, Any]) -> None:
        self._expect_set(args, self.evicted, "preempted")

    def do_expect_downgraded(self, args: Mapping[str, Any]) -> None:
        self._expect_set(args, self.downgraded, "downgraded")

    def do_expect_class(self, args: Mapping[str, Any]) -> None:
        job = self.job(args["job"])
        if job.phase not in (JobPhase.RUNNING, JobPhase.RESERVED) or job.job_class != self._class(args["class"]):
            raise self.fail(f"expected {job.name} to run as {args['class']}: {self.describe(job)}")

    def do_expect_phase(self, args: Mapping[str, Any]) -> None:
        job = self.job(args["job"])
        if job.phase != self._phase(args["phase"]):
            raise self.fail(f"expected {job.name} in phase {args['phase']}: {self.describe(job)}")

    def do_expect_preemptions(self, args: Mapping[str, Any]) -> None:
        job = self.job(args["job"])
        if job.preemptions != _int(args["count"], self.location(), "count", 0):
            raise self.fail(f"expected {job.name} preempted {args['count']} time(s): {self.describe(job)}")

    def do_expect_status(self, args: Mapping[str, Any]) -> None:
        status = self.engine.status()
        vc = args["vc"]
        if vc not in status:
            raise self.invalid(f"unknown VC {vc!r}", field="vc", accepted=", ".join(status))
        row = status[vc]
        for key, value in args.items():
            if key == "vc":
                continue
            if key not in row:
                raise self.invalid(f"unknown status key {key!r}", accepted=", ".join(row))
            expected = _number(value, self.location(), str(key))
            if abs(row[key] - expected) > 1e-9:
                raise self.fail(f"VC {vc}: expected {key} = {expected:g}, got {row[key]:g} (status {row})")

    def do_expect_invariants(self, args: Mapping[str, Any]) -> None:
        self.check_invariants()

    def check_invariants(self) -> None:
        try:
            self.engine.check_invariants()
        except EngineInvariantError as error:
            raise self.fail(f"engine invariant broken: {error}") from None


def run_scenario(scenario: Scenario | str | Path) -> ScenarioResult:
    """Run every step; return the result or raise ``ScenarioFailure`` (a step's expectation failed, an
    invariant broke or the engine crashed) or ``InvalidInputError`` (the scenario itself is malformed)."""
    if not isinstance(scenario, Scenario):
        scenario = load_scenario(scenario)
    return _Runner(scenario).run()
