"""Reading a scenario file: every value is checked before the first step runs, and every error names the
scenario file, the line and the step (or key path) so a malformed scenario is fixed, not debugged.

The ``cluster`` and ``tenants`` sections go through the simulator's own readers
(``kubecell.inputs.cluster.parse_cluster`` and the core's ``resolve_tenants``) on a section of the same
``YamlDocument``, so a scenario cluster is exactly a dynamic-simulator cluster and its errors carry the
scenario file's lines.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from kubecell.core.engine.job import JobSpec, MemberGroup
from kubecell.core.engine.options import PRESETS, EngineOptions
from kubecell.core.errors import InvalidInputError
from kubecell.core.model import MILLI_PER_GPU, Request, TopologyLevel
from kubecell.core.topology import CellForest
from kubecell.core.validation import KeyPath, Locator, key_path
from kubecell.inputs.cluster import parse_cluster
from kubecell.inputs.yaml_document import YamlDocument
from kubecell.testing.scenarios.format import (
    ACTIONS,
    GANG_KEYS,
    GROUP_KEYS,
    STEP_KEYS,
    SUBMIT_KEYS,
    TOP_KEYS,
    Scenario,
    Step,
    TenantSection,
    as_int,
    as_number,
    as_str,
    as_str_list,
    check_keys,
    require_mapping,
)


def _options(policy: str, doc: YamlDocument) -> EngineOptions:
    key = policy.strip().lower()
    if key not in PRESETS:
        raise InvalidInputError(f"unknown policy {policy!r}", location=doc.where(["policy"]),
                                accepted=", ".join(PRESETS))
    options = PRESETS[key]
    raw = doc.section("options").data
    if raw is None:
        return options
    location = doc.where(["options"])
    mapping = require_mapping(raw, location, "options")
    kinds = {f.name: str(f.type) for f in fields(EngineOptions) if f.name != "name"}
    check_keys(mapping, kinds, location)
    changes: dict[str, object] = {}
    for key, value in mapping.items():
        kind = kinds[key]
        where = doc.where(["options", key])
        if value is None and "None" in kind:
            changes[key] = None
        elif kind == "bool":
            if not isinstance(value, bool):
                raise InvalidInputError(f"{key} must be true or false", location=where)
            changes[key] = value
        elif kind == "int":
            changes[key] = as_int(value, where, key, 0)
        else:
            changes[key] = as_number(value, where, key)
    return options.with_(**changes)


def _member(item: Mapping[str, Any], where: str, name: str, *, topology: TopologyLevel | None = None) -> Request:
    """The request of one member: ``gpus`` or ``milli`` and/or ``gpuMemoryMiB``, ``cpuMilli``, ``memoryMiB``,
    ``models``."""
    gpus = item.get("gpus")
    milli = item.get("milli")
    gpu_memory = as_int(item.get("gpuMemoryMiB", 0), where, "gpuMemoryMiB", 0)
    if gpus is not None and milli is not None:
        raise InvalidInputError("give either gpus (whole GPUs) or milli (a share of one GPU)", location=where)
    gpu_count, gpu_milli = 0, 0
    if gpus is not None:
        gpu_count, gpu_milli = as_int(gpus, where, "gpus", 0), MILLI_PER_GPU
        if gpu_count == 0:
            gpu_milli = 0
    elif milli is not None:
        gpu_count, gpu_milli = 1, as_int(milli, where, "milli", 1)
    elif gpu_memory:
        gpu_count = 1
    models = item.get("models")
    return Request(
        name=name,
        cpu_milli=as_int(item.get("cpuMilli", 0), where, "cpuMilli", 0),
        memory_mib=as_int(item.get("memoryMiB", 0), where, "memoryMiB", 0),
        gpu_count=gpu_count,
        gpu_milli=gpu_milli,
        gpu_memory_mib=gpu_memory,
        gpu_models=None if models is None else frozenset(as_str_list(models, where, "models")),
        topology=topology,
    )


def _level(item: Mapping[str, Any], where: str) -> TopologyLevel | None:
    topology = item.get("topology")
    return None if topology is None else TopologyLevel.parse(as_str(topology, where, "topology"), location=where)


def _groups(raw: Any, where: str, job: str) -> list[MemberGroup]:
    """``groups: [{name, members, min, <member keys>}]``: ``min`` defaults to ``members`` (the group runs
    whole), as a job's ``min`` does."""
    if not isinstance(raw, list) or not raw:
        raise InvalidInputError("groups must be a non-empty list of member groups", location=where, field="groups")
    groups = []
    for position, one in enumerate(raw):
        at = f"{where} groups[{position}]"
        item = require_mapping(one, at, "a member group")
        check_keys(item, GROUP_KEYS, at, required=("name",))
        name = item["name"]
        if not isinstance(name, str):
            raise InvalidInputError(f"name must be a string, got {name!r}", location=at, field="name")
        at = f"{where} group {name!r}"
        count = as_int(item.get("members", 1), at, "members", 1)
        minimum = as_int(item.get("min", count), at, "min", 0)
        groups.append(MemberGroup(name, _member(item, at, job, topology=_level(item, at)), count, minimum))
    return groups


def _job_spec(raw: Any, location: str) -> JobSpec:
    item = require_mapping(raw, location, "a job")
    check_keys(item, SUBMIT_KEYS, location, required=("name", "vc"))
    name = as_str(item["name"], location, "name")
    where = f"{location} job {name!r}"
    level = _level(item, where)
    minimum = item.get("min")
    vc = as_str(item["vc"], where, "vc")
    priority = as_int(item.get("priority", 0), where, "priority")
    work = as_number(item.get("work", 0), where, "work")
    if "groups" in item:
        mixed = sorted(k for k in item if k not in GANG_KEYS)
        if mixed:
            raise InvalidInputError(f"{', '.join(mixed)} given next to groups", location=where,
                                    accepted="the member's keys inside each group; next to groups only "
                                             + ", ".join(sorted(GANG_KEYS)))
        return JobSpec.gang(name, vc, _groups(item["groups"], where, name),
                            min_members=None if minimum is None else as_int(minimum, where, "min", 1),
                            priority=priority, topology=level, work=work)
    return JobSpec(
        name=name,
        vc=vc,
        member=_member(item, where, name),
        members=as_int(item.get("members", 1), where, "members", 1),
        min_members=None if minimum is None else as_int(minimum, where, "min", 1),
        priority=priority,
        topology=level,
        work=work,
    )


def _located(error: InvalidInputError, location: str) -> InvalidInputError:
    """The same error, placed in the scenario file (core errors name only the job or request)."""
    where = location if not error.location else f"{location}: {error.location}"
    return InvalidInputError(error.message, location=where, field=error.field, accepted=error.accepted)


def _reload_locator(doc: YamlDocument, index: int) -> Locator:
    """Locations inside a ``reload_config`` step: the line of the key, the step, then the key path
    (``s.yaml:31: steps[4] (reload_config): virtualClusters.a.gpus``)."""

    def locate(parts: KeyPath) -> str:
        line = doc.line(["steps", index, "reload_config", *parts])
        head = f"{doc.path}:{line}" if line is not None else str(doc.path)
        text = f"{head}: steps[{index}] (reload_config)"
        return f"{text}: {key_path(parts)}" if parts else text

    return locate


def _parse_step(doc: YamlDocument, index: int) -> Step:
    source = doc.section("steps", index)
    location = source.where()
    item = require_mapping(source.data, location, "a step")
    actions = [k for k in item if k not in STEP_KEYS]
    if len(actions) != 1 or actions[0] not in ACTIONS:
        raise InvalidInputError(
            f"a step needs exactly one action, found {', '.join(map(str, actions)) or 'none'}",
            location=location, accepted=", ".join(ACTIONS) + " (plus optional at, note, cycle)")
    action = str(actions[0])
    location = f"{location} ({action})"
    at = None if item.get("at") is None else as_number(item["at"], location, "at")
    args: Any = item[action]
    if args is None:
        args = {}
    keys = ACTIONS[action]
    if action == "submit":
        try:
            args = [_job_spec(one, location) for one in (args if isinstance(args, list) else [args])]
        except InvalidInputError as error:
            if (error.location or "").startswith(location):
                raise
            raise _located(error, location) from None
    elif action == "reload_config":
        args = TenantSection(require_mapping(args, location, "reload_config"), str(doc.path),
                             _reload_locator(doc, index))
    elif keys is not None:
        mapping = require_mapping(args, location, f"the arguments of {action}")
        required, optional = keys
        # expect_status takes any key of Engine.queries.status(); those are checked against the engine when run
        check_keys(mapping, set(mapping) if action == "expect_status" else optional, location, required=required)
        args = mapping
    cycle = item.get("cycle", True)
    if not isinstance(cycle, bool):
        raise InvalidInputError("cycle must be true or false", location=location, field="cycle")
    return Step(index, action, args, at, str(item.get("note", "")), cycle, location)


def parse_scenario(doc: YamlDocument) -> Scenario:
    """Validate a parsed scenario document; errors name the file, the line and the key or step."""
    source = str(doc.path)
    top = require_mapping(doc.data, source, "a scenario")
    check_keys(top, TOP_KEYS, source, required=("name", "cluster", "tenants", "steps"))
    policy = as_str(top.get("policy", "kubecell"), doc.where(["policy"]), "policy")
    options = _options(policy, doc)
    nodes = tuple(parse_cluster(doc, ("cluster",)))
    section = doc.section("tenants")
    tenants = TenantSection(section.data, source, section.where)
    tenants.resolve(CellForest(nodes))  # fail early on bad configs
    steps_raw = top["steps"]
    if not isinstance(steps_raw, list) or not steps_raw:
        raise InvalidInputError("steps must be a non-empty list", location=doc.where(["steps"]))
    steps = tuple(_parse_step(doc, index) for index in range(len(steps_raw)))
    clock = 0.0
    for step in steps:
        if step.at is not None:
            if step.at < clock:
                raise InvalidInputError(f"time goes backwards ({step.at:g} < {clock:g})", location=step.location,
                                        field="at", accepted="non-decreasing 'at' values")
            clock = step.at
    known = top.get("known_failure")
    auto = top.get("autoConfirm", True)
    if not isinstance(auto, bool):
        raise InvalidInputError("autoConfirm must be true or false", location=doc.where(["autoConfirm"]))
    return Scenario(
        name=as_str(top["name"], doc.where(["name"]), "name"),
        description=str(top.get("description", "")),
        source=source,
        policy=policy,
        options=options,
        nodes=nodes,
        tenants=tenants,
        steps=steps,
        known_failure=None if known is None else as_str(known, doc.where(["known_failure"]), "known_failure"),
        auto_confirm=auto,
    )


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file."""
    return parse_scenario(YamlDocument.read(path))


def discover(directory: str | Path) -> list[Path]:
    """The scenario files of a directory, in name order."""
    return sorted(Path(directory).glob("*.yaml"))
