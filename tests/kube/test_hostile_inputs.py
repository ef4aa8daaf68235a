"""Nothing a user or a node writes can raise past the object it came from.

kubecell reads text anyone may write: pod labels and annotations (a tenant), container resources, PodGroup
specs, Node labels, capacity and the inventory annotation (a node agent, an operator), VirtualCluster specs,
allocation records (anyone who can edit a pod). A reader that raised anything but kubecell's typed errors
would stop the scheduler's loop, which would restart and stop again for as long as the object exists.

First, property-based: hostile objects (random, and valid ones mutated field by field with huge digit
strings, Unicode digits, exponents, very long text, control characters, random and deeply nested YAML/JSON)
driven through ``pod_demand``, ``parse_record``, ``node_view``, ``virtualclusters.resolve`` and the inspect
report: only ``KubecellError`` subclasses come out (``DemandError`` from ``pod_demand``, which its callers
catch), with a message of bounded length, and each call is quick (the ``deadline``). One plain regression
test per crash path found, asserting what the message names and accepts, is in ``test_input_bounds``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubecell.core.errors import InvalidInputError, KubecellError
from kubecell.core.model import make_node
from kubecell.core.topology import CellForest
from kubecell.kube import names
from kubecell.kube import virtualclusters as vcs
from kubecell.kube.dialects import DemandError, pod_demand
from kubecell.kube.inventory import node_view
from kubecell.kube.records import RecordError, parse_record
from kubecell.kube.rest import ApiError, Kube, checked_path, loads
from kubecell.scheduler.observe.inspect import InspectReport, build_report
from kubecell.testbed.nodes import node_manifest
from tests.core.support import make_nodes
from tests.kube.dialect_support import make_pod

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


@pytest.mark.parametrize("path", [
    "/apis/kubecell.io/v1alpha1/namespaces/a/elasticjobs/../../b/elasticjobs/victim",
    "/api/v1/namespaces/a/pods/./x",
    "/api/v1/namespaces//pods",
    "/api/v1/namespaces/a/pods/x?dryRun=All",
    "/api/v1/namespaces/a/pods/x#y",
    "/api/v1/namespaces/a/pods/%2e%2e",
    "/api/v1/namespaces/a/pods/x y",
    "api/v1/pods",
])
def test_no_request_leaves_for_a_path_a_name_could_have_bent(path: str) -> None:
    """Paths are built from names pods and owner references carry; urllib3 resolves '..' before sending, so a
    name like '../../b/elasticjobs/victim' would reach another namespace. Every request is refused before it
    leaves (no connection is made: this Kube has none)."""
    kube = Kube.__new__(Kube)
    with pytest.raises(ApiError, match="refused to send a request") as caught:
        kube.get(path)
    assert caught.value.status == 400
    assert checked_path("/apis/kubecell.io/v1alpha1/namespaces/a/elasticjobs/x/scale").endswith("/x/scale")


def test_json_nested_as_deep_as_the_api_server_accepts_is_read() -> None:
    """A ResourceClaim's opaque parameters (or a CRD keeping unknown fields) may nest as deep as the API server
    accepts, 10,000 levels; Python's decoder stops near 1,000 with RecursionError, which ended the watcher
    thread of a 3 KB claim nested 1,500 deep and left the scheduler with a frozen copy of every claim."""
    deep = '{"items": [{"a": ' + "[" * 1500 + "]" * 1500 + '}, {"b": 1}]}'
    with pytest.raises(RecursionError):
        json.loads(deep)
    read = loads(deep)
    assert read["items"][1] == {"b": 1}
    assert loads(b'{"kind": "List"}') == {"kind": "List"}
    deepest = "[" * 10_000 + "]" * 10_000
    assert isinstance(loads(deepest), list)
    with pytest.raises(ValueError, match="Expecting"):
        loads("[" * 2000)  # not JSON, however deep: the error a caller expects, from the caller's thread
