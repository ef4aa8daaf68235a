"""Nothing a user or a node writes can raise past the object it came from.

kubecell reads text anyone may write: pod labels and annotations (a tenant), container resources, PodGroup
specs, Node labels, capacity and the inventory annotation (a node agent, an operator), VirtualCluster specs,
allocation records (anyone who can edit a pod). A reader that raised anything but kubecell's typed errors
would stop the scheduler's loop, which would restart and stop again for as long as the object exists.

First, property-based: hostile objects (random, and valid ones mutated field by field with huge digit
strings, Unicode digits, exponents, very long text, control characters, random and deeply nested YAML/JSON)
driven through ``pod_demand``, ``parse_record``, ``node_view``, ``virtualclusters.resolve`` and the inspect
report: only ``KubecellError`` subclasses come out (``DemandError`` from ``pod_demand``, which its callers
catch), with a message of bounded length, and each call is quick (the ``deadline``). Then one plain
regression test per crash path found, asserting what the message names and accepts.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubecell.core.errors import InvalidInputError, KubecellError
from kubecell.core.model import make_node
from kubecell.core.tenancy.config import resolve_tenants
from kubecell.core.topology import CellForest
from kubecell.kube import names
from kubecell.kube import virtualclusters as vcs
from kubecell.kube.dialects import DemandError, pod_demand
from kubecell.kube.dialects.resources import QuantityError, parse_quantity
from kubecell.kube.inventory import cpu_milli, memory_mib, node_view
from kubecell.kube.records import RecordError, parse_record
from kubecell.scheduler.observe.inspect import InspectReport, build_report
from kubecell.testbed.nodes import node_manifest
from tests.core.support import make_nodes
from tests.kube.dialect_support import HIVED, make_pod, refused

HOSTILE = settings(max_examples=400, deadline=timedelta(seconds=2), derandomize=True,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                          HealthCheck.large_base_example])
"""Bounded so the file runs in well under a minute on two cores; ``derandomize`` makes every run (and CI)
try the same examples. The deadline is each example's budget: tens of milliseconds are typical, and a
reader that converts a 5,000-digit number or expands a YAML alias bomb takes seconds or forever."""

T = TypeVar("T")
E = TypeVar("E", bound=BaseException)


def outcome(call: Callable[[], T], expected: type[E]) -> tuple[T | None, E | None]:
    """``call()``'s result, or the ``expected`` error it raised; any other exception fails the test."""
    try:
        return call(), None
    except expected as error:
        return None, error


MAX_MESSAGE = 4000
"""Messages quote values cut to a few dozen characters, so none comes near this, whatever the input."""

# ---------------------------------------------------------------------------------------------- strategies

SAFE_TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=30)
"""Text YAML and JSON can write (no lone surrogates)."""

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | SAFE_TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(SAFE_TEXT, children, max_size=4),
    max_leaves=16)

ALIAS_BOMB = ("a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
              "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
              "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\nleafCellNumber: *e\nvirtualCluster: *e\n")

HUGE_DIGITS = st.integers(4301, 6000).map(lambda n: "9" * n)
UNICODE_DIGITS = st.sampled_from(["²", "١٢", "٣", "߁", "𝟙", "Ⅻ", "½", "১২", "٨٠٠٠", "１２", "4²", "1١"])
NUMBER_TEXT = st.one_of(
    st.integers(-(10**30), 10**30).map(str),
    st.floats().map(repr),
    st.builds(lambda mantissa, exponent: f"{mantissa}e{exponent}", st.sampled_from(["1", "9.5", "-1", ".5", "0"]),
              st.integers(-(10**12), 10**12)),
    st.builds(lambda number, suffix: f"{number}{suffix}",
              st.one_of(st.integers(-(10**25), 10**25).map(str), st.sampled_from(["0.5", ".5", "1.", "-0", "+3"])),
              st.sampled_from(["", "m", "k", "Ki", "Mi", "Gi", "Ei", "E", "n", "u", "P", "e3", "e-3", "e999999999",
                               "e-999999999", "x", " ", "_000"])),
    st.sampled_from(["NaN", "Infinity", "-inf", "0x10", "1_000", "1e", "e5", "--1", "1..2", "0.1n"]),
)
BLANKS = st.sampled_from(["", " ", "\t", "\n", "\u00a0", "  5  ", "\u2003"])
LONG_TEXT = st.one_of(st.integers(64, 300_000).map(lambda n: "x" * n),
                      st.integers(1_000, 70_000).map(lambda n: "1" * n),
                      st.integers(100, 40_000).map(lambda n: ",".join(f"x{i}" for i in range(n))))
CONTROL = st.one_of(st.text(alphabet=st.characters(max_codepoint=31), min_size=1, max_size=8),
                    st.sampled_from(["\x00", "\ud800", "\u202e", "\x7f", "a\x00b", "\r\n"]))
NESTED_YAML = st.one_of(
    st.integers(10, 5_000).map(lambda n: "[" * n + "]" * n),
    st.integers(10, 5_000).map(lambda n: "{a: " * n + "1" + "}" * n),
    st.integers(10, 400).map(lambda n: "\n".join(" " * i + "a:" for i in range(n)) + " 1"),
    st.sampled_from([ALIAS_BOMB, "&a [*a]", "a: &a {b: *a}", "? [a, b]\n: 1", "!!python/object:os.system x",
                     "virtualCluster: 2020-02-30\nleafCellNumber: 1", "leafCellNumber: !!binary AAAA",
                     "<<: {virtualCluster: a}\nleafCellNumber: 1", "--- a\n--- b", "%YAML 1.1\n---\n1"]),
)
HOSTILE_TEXT = st.one_of(HUGE_DIGITS, UNICODE_DIGITS, NUMBER_TEXT, BLANKS, LONG_TEXT, CONTROL, NESTED_YAML,
                         JSON_VALUES.map(json.dumps), JSON_VALUES.map(yaml.safe_dump), st.text(max_size=40))
HUGE_NUMBERS = st.sampled_from([10**5000, -(10**5000), 10**30, 2**63, -(2**63) - 1, 2**40 + 1, 2**31])
HOSTILE_VALUES = st.one_of(JSON_VALUES, HUGE_NUMBERS, HOSTILE_TEXT,
                           st.sampled_from([1e308, float("inf"), float("nan"), 5e-324, -0.0, True, None, [], {}]))
"""Any value a hand-built object (or a schema-less CRD) could hold where a number or text belongs."""

# ---------------------------------------------------------------------------------------------- pods

POD_KEYS = sorted({value for key, value in vars(names).items() if isinstance(value, str) and "/" in value and (
    key.startswith(("ANNOTATION_", "KUBESHARE_", "HIVED_", "COSCHEDULING_", "VOLCANO_", "HAMI_USE", "HAMI_NOUSE")))}
                  | {names.KAI_POD_GROUP})
"""Every label and annotation key kubecell reads on a pod (``kubecell.kube.names``)."""
VALID_VALUES = ["g", "4", "2", "1", "0.5", "true", "node", "nvlink", "mig", "mps", "A100", "MIG-3g.20gb", "team-a",
                "virtualCluster: vc\nleafCellNumber: 1\n",
                "virtualCluster: vc\nleafCellNumber: 2\naffinityGroup: {name: g, members: [{podNumber: 2, "
                "leafCellNumber: 2}]}\n"]
POD_VALUES = st.one_of(HOSTILE_TEXT, st.sampled_from(VALID_VALUES))
RESOURCE_NAMES = st.sampled_from(["cpu", "memory", *names.MANAGED_RESOURCES])
QUANTITIES = st.one_of(HOSTILE_TEXT, st.sampled_from(["1", "2", "500m", "4Gi", "0", "100", "50", "1000"]),
                       st.integers(-(2**70), 2**70), st.floats(), HUGE_NUMBERS,
                       st.sampled_from([True, None, [1], {"a": 1}]))
RESOURCES = st.fixed_dictionaries({}, optional={"requests": st.dictionaries(RESOURCE_NAMES, QUANTITIES, max_size=4),
                                                "limits": st.dictionaries(RESOURCE_NAMES, QUANTITIES, max_size=4)})
CONTAINERS = st.lists(st.fixed_dictionaries({"name": st.sampled_from(["a", "b", "c"]), "resources": RESOURCES},
                                            optional={"restartPolicy": st.just("Always")}), max_size=3)
PRIORITIES = st.one_of(st.integers(-(2**40), 2**40), HUGE_NUMBERS, st.sampled_from([None, "5", True, 1.5]))


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    """A Pod whose every label and annotation kubecell reads may hold anything, with hostile containers."""
    labels = draw(st.dictionaries(st.sampled_from(POD_KEYS), POD_VALUES, max_size=6))
    annotations = draw(st.dictionaries(st.sampled_from(POD_KEYS), POD_VALUES, max_size=6))
    spec: dict[str, Any] = {}
    if draw(st.booleans()):
        spec["initContainers"] = draw(CONTAINERS)
    if draw(st.booleans()):
        spec["resources"] = draw(RESOURCES)
    if draw(st.booleans()):
        spec["overhead"] = draw(st.dictionaries(RESOURCE_NAMES, QUANTITIES, max_size=3))
    if draw(st.booleans()):
        spec["priority"] = draw(PRIORITIES)
    return make_pod(labels=labels, annotations=annotations, containers=draw(CONTAINERS), **spec)


POD_GROUPS = st.one_of(st.none(), st.fixed_dictionaries({("default", "g"): st.one_of(
    HOSTILE_VALUES, st.fixed_dictionaries({"minMember": HOSTILE_VALUES}))}))


@HOSTILE
@given(pod=pods(), pod_groups=POD_GROUPS)
def test_a_hostile_pod_is_read_or_refused_with_a_demand_error(pod: dict[str, Any], pod_groups: Any) -> None:
    # the scheduler, the extender, restore and inspect all catch exactly DemandError
    _, error = outcome(lambda: pod_demand(pod, pod_groups=pod_groups), DemandError)
    if error is not None:
        assert str(error).startswith("pod default/p1: ")
        assert len(str(error)) < MAX_MESSAGE


# ---------------------------------------------------------------------------------------------- records

RECORD: dict[str, Any] = {
    "schema": "kubecell.io/allocation/v1", "allocationId": "u-1-0", "podUID": "u-1", "attempt": 0, "node": "n1",
    "gpus": [{"index": 2, "uuid": "GPU-cccc", "milli": 500, "memoryMiB": 8192}], "cpuMilli": 4000,
    "memoryMiB": 16384, "isolation": "accounting", "job": "team-a/train", "vc": "team-a", "class": "borrowed",
    "member": 2, "batch": 4, "scheduler": "kubecell/scheduler-0", "createdAt": "2026-11-23T12:00:00Z"}
RAW_JSON = st.one_of(HUGE_DIGITS, HUGE_DIGITS.map(lambda digits: "-" + digits),
                     st.sampled_from(["1e999999", "NaN", "-Infinity", "1" * 25, "[" * 3000 + "]" * 3000]))
"""JSON text no ``json.dumps`` of a Python value writes, spliced in where a value goes."""
PLACEHOLDER = "\u2603placeholder\u2603"


def _spliced(data: Any, raw: str) -> str:
    return json.dumps(data).replace(json.dumps(PLACEHOLDER), raw)


@st.composite
def record_texts(draw: st.DrawFn) -> str:
    """A valid record mutated one field at a time (at the top or in its GPU), or text that is no record."""
    data = copy.deepcopy(RECORD)
    target = data if draw(st.booleans()) else data["gpus"][0]
    key = draw(st.sampled_from([*target, "unknown"]))
    how = draw(st.sampled_from(["value", "delete", "raw", "text", "json", "many gpus"]))
    if how == "delete":
        target.pop(key, None)
    elif how == "raw":
        target[key] = PLACEHOLDER
        return _spliced(data, draw(RAW_JSON))
    elif how == "text":
        return str(draw(HOSTILE_TEXT))
    elif how == "json":
        return json.dumps(draw(JSON_VALUES))
    elif how == "many gpus":
        data["gpus"] = [dict(data["gpus"][0], index=i, uuid=f"G{i}") for i in range(draw(st.integers(0, 200)))]
    else:
        value = draw(HOSTILE_VALUES)
        if isinstance(value, int) and value.bit_length() > 4000:  # json.dumps cannot write it: splice digits
            target[key] = PLACEHOLDER
            return _spliced(data, "9" * 5000)
        target[key] = value
    return json.dumps(data)


@HOSTILE
@given(text=record_texts(), uid=st.sampled_from([None, "u-1", "other"]))
def test_a_hostile_allocation_record_is_read_or_refused_with_a_record_error(text: str, uid: str | None) -> None:
    # restore, the gate, inspect and the node agent all catch exactly RecordError
    _, error = outcome(lambda: parse_record(text, pod="team-a/p1", uid=uid), RecordError)
    if error is not None:
        assert str(error).startswith("pod team-a/p1: annotation kubecell.io/allocation")
        assert len(str(error)) < MAX_MESSAGE


# ---------------------------------------------------------------------------------------------- nodes

PLAIN_NODE = node_manifest(make_node("n1", cpu_milli=64_000, memory_mib=512_000, gpu_count=4, gpu_model="A100",
                                     nvlink_groups=[[0, 1], [2, 3]], numa_groups=[[0, 1], [2, 3]]))
MIG_INVENTORY: dict[str, Any] = {
    "schema": "kubecell.io/gpu-inventory/v1", "agent": "test", "isolation": ["accounting", "mig"], "devicePlugin": True,
    "gpus": [{"index": i, "uuid": f"GPU-{i}", "model": "A100", "product": "NVIDIA A100-SXM4-40GB", "memoryMiB": 40536,
              "numaNode": i, "nvlinkPeers": [], "healthy": True, "migMode": "enabled",
              "migInstances": [{"uuid": f"MIG-{i}-{j}", "profile": "3g.20gb", "memoryMiB": 20096, "start": 4 * j,
                                "size": 4} for j in range(2)]} for i in range(2)]}
MIG_NODE: dict[str, Any] = {"metadata": {"name": "n1", "labels": {}, "annotations": {
                names.ANNOTATION_INVENTORY: json.dumps(MIG_INVENTORY)}},
            "spec": {}, "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "kubecell.io/gpu": "4"},
                                   "capacity": {"cpu": "64", "memory": "512Gi", "kubecell.io/gpu": "4"},
                                   "conditions": [{"type": "Ready", "status": "True"}]}}
GFD_NODE: dict[str, Any] = {"metadata": {"name": "n1", "labels": {names.GFD_COUNT: "8", names.GFD_MEMORY: "81920",
                                                  names.GFD_PRODUCT: "NVIDIA-A100-SXM4-80GB"}},
            "spec": {}, "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8"},
                                   "conditions": [{"type": "Ready", "status": "True"}]}}
NODE_LABELS = st.sampled_from([names.GFD_COUNT, names.GFD_MEMORY, names.GFD_PRODUCT, names.LABEL_RACK,
                               names.LABEL_ZONE, "topology.kubecell.io/rack", "failure-domain.beta.kubernetes.io/zone"])
NODE_RESOURCES = st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "kubecell.io/gpu", "nvidia.com/mig-3g.20gb",
                                  "nvidia.com/mig-1g.5gb", "pods"])
GPU_FIELDS = st.sampled_from(["index", "uuid", "model", "product", "memoryMiB", "numaNode", "nvlinkPeers", "healthy",
                              "migMode", "migInstances", "unknown"])
MIG_FIELDS = st.sampled_from(["uuid", "profile", "memoryMiB", "start", "size", "unknown"])
TOP_FIELDS = st.sampled_from(["schema", "agent", "heartbeat", "gpus", "isolation", "devicePlugin", "unknown"])


def _inventory_text(inventory: dict[str, Any], draw: st.DrawFn) -> str:
    """The inventory with one field changed: a hostile value, spliced digits, or the whole text replaced."""
    how = draw(st.sampled_from(["top", "gpu", "mig", "raw", "text", "copies", "health"]))
    if how == "text":
        return str(draw(HOSTILE_TEXT))
    gpus = inventory.get("gpus") or []
    if how == "copies" and gpus:
        count = draw(st.integers(0, 300))
        inventory["gpus"] = [dict(gpus[0], index=i, uuid=f"G{i}") for i in range(count)]
        return json.dumps(inventory)
    if how == "health" and gpus:
        for gpu in gpus:
            gpu["healthy"] = draw(st.booleans())
        return json.dumps(inventory)
    if how == "mig" and gpus and gpus[0].get("migInstances"):
        target = gpus[0]["migInstances"][0]
        key = draw(MIG_FIELDS)
    elif how in ("gpu", "raw") and gpus:
        target, key = gpus[draw(st.integers(0, len(gpus) - 1))], draw(GPU_FIELDS)
    else:
        target, key = inventory, draw(TOP_FIELDS)
    if how == "raw":
        target[key] = PLACEHOLDER
        return _spliced(inventory, draw(RAW_JSON))
    value = draw(HOSTILE_VALUES)
    if isinstance(value, int) and value.bit_length() > 4000:
        target[key] = PLACEHOLDER
        return _spliced(inventory, "-" + "9" * 5000)
    target[key] = value
    return json.dumps(inventory)


@st.composite
def node_objects(draw: st.DrawFn, name: str = "n1") -> dict[str, Any]:
    """One of three valid nodes (inventory, MIG inventory, GFD labels only) mutated in its labels, its
    allocatable and capacity maps, its inventory annotation and its conditions."""
    obj: dict[str, Any] = copy.deepcopy(draw(st.sampled_from([PLAIN_NODE, MIG_NODE, GFD_NODE])))
    obj["metadata"]["name"] = name
    labels = obj["metadata"].setdefault("labels", {})
    labels.update(draw(st.dictionaries(NODE_LABELS, st.one_of(HOSTILE_TEXT, st.sampled_from(["8", "A100", "r1"])),
                                       max_size=3)))
    status = obj["status"]
    for table in ("allocatable", "capacity"):
        if draw(st.booleans()):
            values = status.setdefault(table, {})
            values.update(draw(st.dictionaries(NODE_RESOURCES, st.one_of(QUANTITIES, st.sampled_from(
                ["0", "2", "3", "8", "16", "64", "65"])), max_size=3)))
        if draw(st.integers(0, 9)) == 0:
            status[table] = draw(st.sampled_from([None, [], "x", {}]))
    notes = obj["metadata"].setdefault("annotations", {})
    text = notes.get(names.ANNOTATION_INVENTORY)
    if text and draw(st.booleans()):
        notes[names.ANNOTATION_INVENTORY] = _inventory_text(json.loads(text), draw)
    elif draw(st.integers(0, 4)) == 0:
        notes[names.ANNOTATION_INVENTORY] = draw(st.one_of(HOSTILE_TEXT, JSON_VALUES.map(json.dumps)))
    return obj


@HOSTILE
@given(obj=node_objects())
def test_a_hostile_node_is_read_or_refused_naming_the_node(obj: dict[str, Any]) -> None:
    view, error = outcome(lambda: node_view(obj), InvalidInputError)  # the scheduler leaves the node out with it
    if error is not None:
        assert str(error).startswith("node n1"), str(error)[:200]
        assert len(str(error)) < MAX_MESSAGE
    if view is not None and view.node is not None:
        assert len(view.node.gpus) <= 64
        assert len(view.uuids) in (0, len(view.node.gpus))


# ---------------------------------------------------------------------------------------------- VirtualClusters

FOREST = CellForest(make_nodes(4, racks_of=2))
"""Four 8-GPU V100M32 nodes in two racks: chain V100M32x8."""
VC_VALUES = st.one_of(HOSTILE_VALUES, st.sampled_from([8, 4, "V100M32x8", {"V100M32x8/node": 1}, ["n0"], 2.5]))


def _deep(depth: int) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    for _ in range(depth):
        spec = {"cells": spec}
    return spec


VC_SPECS = st.one_of(
    JSON_VALUES,
    st.fixed_dictionaries({}, optional=dict.fromkeys(
        ("cells", "gpus", "chain", "pinnedCells", "weight", "borrowLimitGpus", "minRuntimeMinutes", "unknown"),
        VC_VALUES)),
    st.integers(10, 5_000).map(_deep),
)


@st.composite
def virtualcluster_objects(draw: st.DrawFn) -> list[dict[str, Any]]:
    names_ = draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3, unique=True))
    return [{"apiVersion": "kubecell.io/v1alpha1", "kind": "VirtualCluster",
             "metadata": {"name": name, "generation": draw(st.one_of(st.integers(0, 5), HOSTILE_VALUES))},
             "spec": draw(VC_SPECS)} for name in names_]


@HOSTILE
@given(objects=virtualcluster_objects())
def test_hostile_virtualclusters_are_judged_never_raised(objects: list[dict[str, Any]]) -> None:
    # by design resolve reports on the objects; a typed error would still be no crash
    resolution, _ = outcome(lambda: vcs.resolve(objects, FOREST), KubecellError)
    outcome(lambda: vcs.signature(objects), KubecellError)
    if resolution is None:
        return
    assert {verdict.name for verdict in resolution.verdicts} == {obj["metadata"]["name"] for obj in objects}
    for verdict in resolution.verdicts:
        assert len(verdict.message) < MAX_MESSAGE


# ---------------------------------------------------------------------------------------------- inspect

@st.composite
def inspected_pods(draw: st.DrawFn, index: int) -> dict[str, Any]:
    pod = draw(pods())
    pod["metadata"].update(name=f"p{index}", uid=f"u-{index}")
    if draw(st.booleans()):  # bound: its record (valid, hostile) is read
        pod["spec"]["nodeName"] = draw(st.sampled_from(["n0", "n1", "gone"]))
        pod["status"]["phase"] = "Running"
        text = _spliced(RECORD, "0") if draw(st.integers(0, 3)) == 0 else draw(record_texts())
        pod["metadata"]["annotations"][names.ANNOTATION_ALLOCATION] = text
    return pod


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    nodes = [draw(node_objects(f"n{i}")) for i in range(draw(st.integers(0, 2)))]
    pods_ = [draw(inspected_pods(i)) for i in range(draw(st.integers(0, 3)))]
    return nodes, pods_, draw(st.one_of(st.just([]), virtualcluster_objects()))


@settings(HOSTILE, max_examples=150)
@given(cluster=clusters())
def test_inspect_lists_every_hostile_object_and_never_raises(
        cluster: tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]) -> None:
    nodes, pods_, objects = cluster
    report = build_report(nodes, pods_, virtualcluster_objs=objects, scheduler=None)
    assert isinstance(report, InspectReport)
    json.dumps(report.to_data())
    assert {node.name for node in report.nodes} == {node["metadata"]["name"] for node in nodes}


# ---------------------------------------------------------------------------------------------- regressions

def quick(call: Callable[[], Any], budget: float = 1.0) -> Any:
    """``call()``, which must return (or raise) within ``budget`` seconds."""
    start = time.perf_counter()
    try:
        return call()
    finally:
        assert time.perf_counter() - start < budget


BIG = "9" * 5000


# 1. counts: Python's 4,300-digit limit, and digits str.isdigit takes but int refuses or reads otherwise
@pytest.mark.parametrize(("notes", "labels", "fragments"), [
    ({"kubecell.io/group": "g", "kubecell.io/group-size": BIG}, {},
     ('annotation kubecell.io/group-size "9999', "is 5000 characters long", "(accepted: 1..4194304)")),
    ({"kubecell.io/group": "g", "kubecell.io/group-size": "4", "kubecell.io/group-min": BIG}, {},
     ("annotation kubecell.io/group-min", "is 5000 characters long", "(accepted: 1..4194304)")),
    ({"kubecell.io/group": "g", "kubecell.io/group-size": "²"}, {},
     ('annotation kubecell.io/group-size "²"', "is not a whole number (digits 0-9)", "(accepted: 1..4194304)")),
    ({"kubecell.io/group": "g", "kubecell.io/group-size": "١٢"}, {},
     ('annotation kubecell.io/group-size "١٢"', "is not a whole number (digits 0-9)")),
    ({"kubecell.io/group": "g", "kubecell.io/group-size": "99999999"}, {},
     ("annotation kubecell.io/group-size", "is out of range", "(accepted: 1..4194304)")),
    ({}, {"sharedgpu/group_name": "g", "sharedgpu/group_headcount": BIG, "sharedgpu/group_threshold": "1"},
     ("label sharedgpu/group_headcount", "is 5000 characters long", "(accepted: 1..4194304)")),
    ({}, {"sharedgpu/gpu_request": "0.5", "sharedgpu/priority": BIG},
     ("label sharedgpu/priority", "is not a KubeShare priority")),
    ({}, {"sharedgpu/gpu_request": "0.5", "sharedgpu/priority": "١"}, ('label sharedgpu/priority "١"',)),
    ({}, {"sharedgpu/gpu_request": "1e999999999"},
     ('label sharedgpu/gpu_request "1e999999999"', "is beyond the largest amount kubecell reads in a label",
      "9223372036854775807")),
    ({}, {"sharedgpu/gpu_mem": "1e999999"}, ("label sharedgpu/gpu_mem", "is beyond the largest amount")),
    ({}, {"sharedgpu/gpu_request": "١"}, ('label sharedgpu/gpu_request "١"', "is not a number",
                                         "(accepted: a decimal such as 0.5, 1 or 2)")),
    ({}, {"sharedgpu/gpu_request": "1e-999999999"}, ("label sharedgpu/gpu_request", "is closer to 0 than 1e-100")),
])
def test_counts_and_label_numbers_are_bounded_before_conversion(notes: dict[str, str], labels: dict[str, str],
                                                               fragments: tuple[str, ...]) -> None:
    text = quick(lambda: refused(make_pod(annotations=notes, labels=labels), *fragments))
    assert len(text) < 400


# 2. HiveD's YAML: numbers PyYAML cannot convert, recursion, aliases, dates that do not exist, length
@pytest.mark.parametrize(("spec", "fragments"), [
    ("virtualCluster: a\nleafCellNumber: " + "1" * 5000, ("has a number of 5000 characters", "at line 2, column 17")),
    ("virtualCluster: a\nleafCellNumber: 1\npriority: 0x" + "f" * 5000, ("has a number of 5002 characters",)),
    ("a: " + "[" * 5000 + "]" * 5000, ("nests deeper than 16 levels",)),
    ("\n".join(" " * i + "a:" for i in range(100)) + " 1", ("nests deeper than 16 levels",)),
    (ALIAS_BOMB, ("uses the YAML alias *a, which kubecell does not read here", "at line 2")),
    ("&a [*a]", ("uses the YAML alias *a",)),
    ("virtualCluster: 2020-02-30\nleafCellNumber: 1", ("has a date that does not exist (day is out of range",)),
    ("virtualCluster: a\nleafCellNumber: 1\n#" + "x" * 20_000, ("is 20037 characters long",
                                                                "(accepted: a spec of at most 16384 characters)")),
    ("virtualCluster: " + "v" * 300 + "\nleafCellNumber: 1", ("virtualCluster", "is 300 characters long",
                                                              "at most 253 characters")),
    ("virtualCluster: a\nleafCellNumber: 2\naffinityGroup: {name: " + "g" * 300 + ", members: [{podNumber: 2, "
     "leafCellNumber: 2}]}", ("affinityGroup.name", "is 300 characters long")),
    ("virtualCluster: a\nleafCellNumber: 1\n" + "k" * 100 + ": 1", ("kkkkkkkkkk", "...", "unknown key")),
])
def test_hived_yaml_is_read_with_limits(spec: str, fragments: tuple[str, ...]) -> None:
    text = quick(lambda: refused(make_pod(annotations={HIVED: spec}), f"annotation {HIVED}", *fragments))
    assert len(text) < 600


@pytest.mark.parametrize("key", ["kubecell.io/gpu-models", "nvidia.com/use-gputype", "nvidia.com/nouse-gputype"])
def test_a_model_filter_is_bounded_so_matching_stays_quick(key: str) -> None:
    """Each name of a filter is matched against every model the cluster has: 40,000 distinct names took seconds
    per pod. A filter is at most 1,024 characters (real ones name a few models)."""
    names_ = ",".join(f"x{i}" for i in range(40_000))
    quick(lambda: refused(make_pod({"kubecell.io/gpu": "1"}, annotations={key: names_}), f"annotation {key}",
                          f"is {len(names_)} characters long", "(accepted: GPU models in at most 1024 characters)"),
          budget=0.2)
    quick(lambda: outcome(lambda: pod_demand(make_pod({"kubecell.io/gpu": "1"}, annotations={key: names_[:1024]})),
                          DemandError), budget=0.5)


# 3. quantities: length and magnitude before any conversion
@pytest.mark.parametrize(("value", "fragments"), [
    ("1e999999999", ("cpu '1e999999999'", "is beyond the largest amount a Kubernetes quantity holds "
                     "(9223372036854775807, int64)", "of magnitude at most 9223372036854775807")),
    ("1e999999", ("is beyond the largest amount",)),
    (BIG, ("is 5000 characters long; no number kubecell reads is longer than 64",)),
    ("9223372036854775808", ("is beyond the largest amount",)),
    ("١٢", ("cpu '١٢'", "is not a Kubernetes quantity")),
    pytest.param(10**5000, ("is beyond the largest amount",), id="a 5001-digit int"),
    (True, ("is a boolean, not a quantity",)),
    ([1], ("cpu [1]", "is a list, not a quantity")),
])
def test_quantities_are_bounded_before_conversion(value: Any, fragments: tuple[str, ...]) -> None:
    containers = [{"name": "main", "resources": {"requests": {"cpu": value}}}]
    text = quick(lambda: refused(make_pod(containers=containers), "container main:", *fragments))
    assert len(text) < 400


@pytest.mark.parametrize("resource", ["nvidia.com/gpu", "kubecell.io/gpu-memory", "aliyun.com/gpu-mem",
                                      "nvidia.com/gpucores"])
def test_a_huge_extended_resource_is_refused_not_converted(resource: str) -> None:
    quick(lambda: refused(make_pod({resource: "1e999999"}), f"{resource} '1e999999'", "is beyond the largest"))
    quick(lambda: refused(make_pod(overhead={"cpu": "9" * 70}), "overhead (overhead): cpu", "is 70 characters long"))


def test_kubernetes_rounds_finer_than_a_nano_unit_up_and_so_does_kubecell() -> None:
    assert parse_quantity("1e-999999999") == parse_quantity("1n")
    assert parse_quantity("0.1n") == parse_quantity("1n")
    assert parse_quantity("-1e-999999999") == -parse_quantity("1n")
    assert parse_quantity("9223372036854775807") == 2**63 - 1
    containers = [{"name": "a", "resources": {"requests": {"cpu": "1e-999999999", "memory": "0.5"}}}]
    request = pod_demand(make_pod(containers=containers)).request
    assert (request.cpu_milli, request.memory_mib) == (1, 1)


def test_a_priority_beyond_int32_is_refused() -> None:
    refused(make_pod(priority=10**5000), "spec.priority <a whole number of about 5001 digits>",
            "is beyond the API's int32", "-2147483648..2147483647")


# 4. node readers
def node(labels: dict[str, str] | None = None, **allocatable: str) -> dict[str, Any]:
    """The GFD node with ``labels`` and ``allocatable`` (``nvidia_gpu`` for ``nvidia.com/gpu``) changed."""
    obj = copy.deepcopy(GFD_NODE)
    obj["metadata"]["labels"].update(labels or {})
    obj["status"]["allocatable"].update({RESOURCE_KEYS.get(key, key): value for key, value in allocatable.items()})
    return obj


RESOURCE_KEYS = {"nvidia_gpu": "nvidia.com/gpu", "kubecell_gpu": "kubecell.io/gpu"}


def test_the_node_quantity_readers_raise_a_quantity_error() -> None:
    for call, value in ((cpu_milli, "abc"), (memory_mib, "12Xi"), (cpu_milli, BIG), (memory_mib, "1e999999999")):
        with pytest.raises(QuantityError):
            call(value)


@pytest.mark.parametrize(("obj", "fragments"), [
    (node(cpu="abc"), ("node n1: status.allocatable.cpu: 'abc' is not a Kubernetes quantity",
                       "(accepted: a Kubernetes quantity such as")),
    (node(memory="12Xi"), ("node n1: status.allocatable.memory: '12Xi' is not a Kubernetes quantity",)),
    (node(cpu=BIG), ("node n1: status.allocatable.cpu:", "is 5000 characters long")),
    (node(cpu="-5"), ("node n1: status.allocatable.cpu: '-5' is negative", "(accepted: 0..1099511627776 milli-CPU)")),
    (node(memory="7Ei"), ("node n1: status.allocatable.memory:", "more than a node may have", "0..1099511627776 MiB")),
    (node({names.GFD_COUNT: "abc"}), ("node n1: label nvidia.com/gpu.count: 'abc' is not a whole number",
                                      "at most 64 on a node")),
    (node({names.GFD_COUNT: BIG}), ("node n1: label nvidia.com/gpu.count:", "is 5000 characters long")),
    (node({names.GFD_COUNT: "²"}), ("node n1: label nvidia.com/gpu.count: '²' is not a whole number",)),
    (node({names.GFD_COUNT: "100"}, nvidia_gpu="100"),
     ("node n1: label nvidia.com/gpu.count: 100 GPUs are more than a node may have", "(accepted: 0..64 GPUs)")),
    (node({names.GFD_MEMORY: BIG}), ("node n1: label nvidia.com/gpu.memory:", "is more MiB than a GPU may have",
                                     "0..1099511627776 MiB")),
    (node(nvidia_gpu="1.5"), ("node n1: status.allocatable.nvidia.com/gpu: '1.5' is not a whole number of GPUs",)),
    (node(kubecell_gpu="1e999999999"), ("node n1: status.allocatable.kubecell.io/gpu:", "is beyond the largest")),
])
def test_node_readers_name_the_node_and_the_field(obj: dict[str, Any], fragments: tuple[str, ...]) -> None:
    with pytest.raises(InvalidInputError) as caught:
        quick(lambda: node_view(obj))
    for fragment in fragments:
        assert fragment in str(caught.value), str(caught.value)


def test_gfd_labels_of_unicode_digits_are_not_read_as_numbers() -> None:
    """``"٨٠٠٠".isdigit()`` is true and ``int`` reads it as 8000; GFD writes ASCII, so the memory label is
    left for the catalog's size, as any label that is not digits always was."""
    view = node_view(node({names.GFD_MEMORY: "٨٠٠٠"}))
    assert view.node is not None
    assert {gpu.memory_mib for gpu in view.node.gpus} == {81251}  # A100-80G from the catalog


def inventory_node(edit: Callable[[dict[str, Any]], Any] | None = None, *, text: str | None = None) -> dict[str, Any]:
    obj = copy.deepcopy(PLAIN_NODE)
    data = json.loads(obj["metadata"]["annotations"][names.ANNOTATION_INVENTORY])
    if edit is not None:
        edit(data)
    obj["metadata"]["annotations"][names.ANNOTATION_INVENTORY] = text if text is not None else json.dumps(data)
    return obj


INVENTORY = "node n1: annotation kubecell.io/gpu-inventory: "


@pytest.mark.parametrize(("obj", "fragment"), [
    (inventory_node(text='{"gpus": [{"index": 0, "uuid": "u", "model": "A100", "memoryMiB": ' + BIG + "}]}"),
     "gpus.0.memoryMiB: the number '9999", ),
    (inventory_node(lambda d: d["gpus"][0].update(memoryMiB=2**41)),
     "gpus.0.memoryMiB: Input should be less than or equal to 1099511627776"),
    (inventory_node(lambda d: d["gpus"][0].update(numaNode=5000)),
     "gpus.0.numaNode: Input should be less than or equal to 1023"),
    (inventory_node(lambda d: d["gpus"][0].update(nvlinkPeers=[10**12])),
     "gpus.0.nvlinkPeers.0: Input should be less than or equal to 255"),
    (inventory_node(lambda d: d["gpus"][0].update(uuid="G" * 500)),
     "gpus.0.uuid: String should have at most 128 characters"),
    (inventory_node(lambda d: d["gpus"][0].update(migMode="enabled", migInstances=[
        {"uuid": "M", "profile": "1g.5gb", "memoryMiB": 1, "start": 2**62, "size": 1}])),
     "gpus.0.migInstances.0.start: Input should be less than or equal to 255"),
    (inventory_node(text="[" * 300_000), "is 300000 characters long"),
    (inventory_node(text="[" * 10_000 + "]" * 10_000), "nests deeper than any annotation of kubecell's"),
    (inventory_node(text="x" * 300_000), "is 300000 characters long (accepted: at most 262144 characters)"),
    (inventory_node(lambda d: d.update(gpus=[dict(d["gpus"][0], index=i, uuid=f"G{i}") for i in range(100)])),
     "gpus: lists 100 GPUs, more than a node may have (accepted: at most 64 GPUs)"),
])
def test_inventory_numbers_and_text_are_bounded(obj: dict[str, Any], fragment: str) -> None:
    if fragment.startswith("gpus: lists"):  # no advertised count to cut to: the node stands on its inventory
        for table in ("allocatable", "capacity"):
            obj["status"][table] = {"cpu": "64", "memory": "512Gi"}
    with pytest.raises(InvalidInputError) as caught:
        quick(lambda: node_view(obj))
    assert str(caught.value).startswith(INVENTORY), str(caught.value)
    assert fragment in str(caught.value), str(caught.value)


# 5. allocation records
def record_text(**fields: Any) -> str:
    return json.dumps({**RECORD, **fields})


@pytest.mark.parametrize(("text", "fragment"), [
    (record_text(cpuMilli=2**41), "cpuMilli: must be at most 1099511627776, got 2199023255552"),
    (record_text(memoryMiB=2**41), "memoryMiB: must be at most 1099511627776"),
    (record_text(attempt=2**41, allocationId=f"u-1-{2**41}"), "attempt: must be at most 1099511627776"),
    (record_text(member=2**22), "member: must be less than 4194304"),
    (record_text(batch=2**22 + 1), "batch: must be at most 4194304"),
    (record_text(gpus=[{"index": 2, "uuid": "GPU-c", "milli": 500, "memoryMiB": 2**41}]),
     "gpus[0].memoryMiB: must be at most 1099511627776"),
    (record_text(node="n" * 254), "node: String should have at most 253 characters"),
    (record_text(job="j" * 318), "job: String should have at most 317 characters"),
    (record_text(vc="v" * 254), "vc: String should have at most 253 characters"),
    (record_text(scheduler="s" * 513), "scheduler: String should have at most 512 characters"),
    (record_text(podUID="u" * 129), "podUID: String should have at most 128 characters"),
    (record_text(gpus=[{"index": 2, "uuid": "G" * 129, "milli": 500, "memoryMiB": 1}]),
     "gpus[0].uuid: String should have at most 128 characters"),
    (record_text(createdAt="2026-11-23T12:00:00" + "0" * 5000 + "Z"), "createdAt: '2026-11-23T12:00:00000"),
    (json.dumps({**RECORD, "cpuMilli": PLACEHOLDER}).replace(json.dumps(PLACEHOLDER), BIG),
     "cpuMilli: the number '9999"),
    ("[" * 10_000 + "]" * 10_000, "nests deeper than any annotation of kubecell's"),
    (record_text(job="x" * 70_000), "is 70"),
])
def test_record_fields_are_bounded(text: str, fragment: str) -> None:
    with pytest.raises(RecordError) as caught:
        quick(lambda: parse_record(text, pod="team-a/p1"))
    rendered = str(caught.value)
    assert rendered.startswith("pod team-a/p1: annotation kubecell.io/allocation: "), rendered
    assert fragment in rendered, rendered
    assert len(rendered) < 600


def test_a_5000_digit_record_number_names_the_field_and_its_range() -> None:
    text = json.dumps({**RECORD, "cpuMilli": PLACEHOLDER}).replace(json.dumps(PLACEHOLDER), BIG)
    with pytest.raises(RecordError, match=r"cpuMilli: the number .* has 5000 digits \(accepted: 0\.\.1099511627776\)"):
        parse_record(text, pod="team-a/p1")
    with pytest.raises(RecordError, match=r"is 70\d{3} characters long \(accepted: at most 65536 characters\)"):
        parse_record(record_text(job="x" * 70_000), pod="team-a/p1")


def test_the_schedulers_own_records_stay_within_the_bounds() -> None:
    """What the dialects accept fits the record: a group key is ``<namespace>/<name>`` with a name of at most
    253 characters, so a pod in a 63-character namespace with the longest group name still gets a record."""
    pod = make_pod(annotations={"kubecell.io/group": "g" * 253, "kubecell.io/group-size": "1"}, namespace="n" * 63)
    demand = pod_demand(pod)
    assert demand.group is not None
    assert len(demand.group.key) == 317
    parse_record(record_text(job=demand.group.key), pod="team-a/p1")
    refused(make_pod(annotations={"kubecell.io/group": "g" * 254, "kubecell.io/group-size": "1"}),
            "annotation kubecell.io/group", "is 254 characters long", "at most 253 characters")
    refused(make_pod(annotations={"kubecell.io/vc": "v" * 254}), "annotation kubecell.io/vc",
            "is 254 characters long")


# 6. PodGroup and VirtualCluster specs
@pytest.mark.parametrize(("spec", "fragment"), [
    ([1, 2], "has a spec that is [1, 2], not a mapping"),
    ("minMember: 3", "has a spec that is 'minMember: 3', not a mapping"),
    ({"minMember": 10**5000}, "has spec.minMember <a whole number of about 5001 digits>"),
    ({"minMember": "3"}, "has spec.minMember '3'"),
    ({"minMember": 2**22 + 1}, "has spec.minMember 4194305"),
])
def test_a_hostile_podgroup_spec_is_a_demand_error(spec: Any, fragment: str) -> None:
    refused(make_pod(labels={"scheduling.x-k8s.io/pod-group": "g"}), "its PodGroup default/g", fragment,
            "(accepted: a PodGroup with minMember 0..4194304)", pod_groups={("default", "g"): spec})


def vc(spec: Any, name: str = "a") -> dict[str, Any]:
    return {"apiVersion": "kubecell.io/v1alpha1", "kind": "VirtualCluster",
            "metadata": {"name": name, "generation": 1}, "spec": spec}


@pytest.mark.parametrize(("spec", "fragment"), [
    ({"gpus": 10**5000}, "VirtualCluster a: spec.gpus: <a whole number of about 5001 digits> is beyond int64"),
    ({"gpus": 8, "borrowLimitGpus": 1e308}, "VirtualCluster a: spec.borrowLimitGpus: 1e+308 is not a finite number "
                                            "within int64"),
    ({"gpus": 8, "borrowLimitGpus": 2.0**50}, "VirtualCluster a: spec.borrowLimitGpus: must be at most "
                                              "1099511627776"),
    (_deep(5000), "VirtualCluster a: spec.cells.cells.cells.cells.cells.cells.cells.cells.cells: nests deeper "
                  "than 8 levels"),
    ([1], "VirtualCluster a: spec: is [1], not a mapping"),
    ({"cells": {5: 1, "a": 2}}, "VirtualCluster a: spec.cells: has the key 5, which is not text"),
])
def test_a_hostile_virtualcluster_is_refused_on_itself(spec: Any, fragment: str) -> None:
    """Each is judged on its own object (``InvalidGuarantee``) and the sound one waits (``NotApplied``); a spec
    no tenants document could hold stands for itself as its problem where the scheduler compares specs."""
    resolution = quick(lambda: vcs.resolve([vc(spec), vc({"gpus": 8}, "b")], FOREST))
    assert resolution.tenants is None
    verdicts = {verdict.name: verdict for verdict in resolution.verdicts}
    assert not verdicts["a"].accepted
    assert verdicts["a"].reason == vcs.REASON_INVALID
    assert fragment in verdicts["a"].message, verdicts["a"].message
    assert verdicts["b"].reason == vcs.REASON_NOT_APPLIED
    assert vcs.canonical_spec(vc(spec)).startswith("!") == ("must be at most" not in fragment)


def test_a_borrow_limit_whose_milli_gpus_overflow_is_refused_in_the_configmap_too() -> None:
    with pytest.raises(InvalidInputError, match=r"virtualClusters\.a\.borrowLimitGpus: must be at most 1099511627776"):
        resolve_tenants({"virtualClusters": {"a": {"gpus": 8, "borrowLimitGpus": 1e308}}}, FOREST)


# 7. inspect
def test_inspect_lists_hostile_nodes_pods_and_records_and_goes_on() -> None:
    good = node_manifest(make_node("n0", cpu_milli=64_000, memory_mib=512_000, gpu_count=2, gpu_model="A100"))
    bad_quantity = copy.deepcopy(good)
    bad_quantity["metadata"]["name"] = "n1"
    bad_quantity["status"]["allocatable"]["cpu"] = "1e999999999"
    racked = copy.deepcopy(good)  # racks named as the nodes: the topology's cells cannot be told apart
    racked["metadata"]["name"] = "n2"
    racked["metadata"]["labels"][names.LABEL_RACK] = "n0"
    good["metadata"]["labels"][names.LABEL_RACK] = "n2"
    hostile_pod = make_pod(annotations={"kubecell.io/group": "g", "kubecell.io/group-size": BIG}, name="pending")
    bound = make_pod(name="bound", annotations={names.ANNOTATION_ALLOCATION: "[" * 10_000})
    bound["spec"]["nodeName"] = "n0"
    bound["status"]["phase"] = "Running"
    report = quick(lambda: build_report([good, bad_quantity, racked], [hostile_pod, bound]))
    by_name = {row.name: row for row in report.nodes}
    assert "status.allocatable.cpu" in by_name["n1"].excluded
    assert "pod default/pending: annotation kubecell.io/group-size" in report.pending[0].ask
    assert "nests deeper" in report.pods[0].error
    assert any("the nodes' topology cannot be built" in warning for warning in report.warnings)
    assert report.tenants.kind == "none"
