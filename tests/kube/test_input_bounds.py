"""Bounds on what a user or a node writes, one plain test per crash path the fuzzing found
(``test_hostile_inputs``): numbers are checked for length and range before any conversion, text and nesting
are bounded, and every refusal names the object, the field and what is accepted.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from kubecell.core.errors import InvalidInputError
from kubecell.core.model import make_node
from kubecell.core.tenancy.config import resolve_tenants
from kubecell.kube import names
from kubecell.kube import virtualclusters as vcs
from kubecell.kube.dialects import DemandError, pod_demand
from kubecell.kube.dialects.resources import QuantityError, parse_quantity
from kubecell.kube.inventory import cpu_milli, memory_mib, node_view
from kubecell.kube.records import RecordError, parse_record
from kubecell.scheduler.observe.inspect import build_report
from kubecell.testbed.nodes import node_manifest
from tests.kube.dialect_support import HIVED, make_pod, refused
from tests.kube.test_hostile_inputs import (
    ALIAS_BOMB,
    FOREST,
    GFD_NODE,
    PLACEHOLDER,
    PLAIN_NODE,
    RECORD,
    _deep,
    outcome,
)


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
    ("virtualCluster: a\nleafCellNumber: " + "1" * 4000, ("has a number of 4000 characters", "at line 2, column 17")),
    ("virtualCluster: a\nleafCellNumber: 1\npriority: 0x" + "f" * 4000, ("has a number of 4002 characters",)),
    ("a: " + "[" * 2000 + "]" * 2000, ("nests deeper than 16 levels",)),
    ("\n".join(" " * i + "a:" for i in range(80)) + " 1", ("nests deeper than 16 levels",)),
    (ALIAS_BOMB, ("uses the YAML alias *a, which kubecell does not read here", "at line 2")),
    ("&a [*a]", ("uses the YAML alias *a",)),
    ("virtualCluster: 2020-02-30\nleafCellNumber: 1", ("has a date that does not exist (day is out of range",)),
    ("virtualCluster: a\nleafCellNumber: 1\n#" + "x" * 20_000, ("is 20037 characters long",
                                                                "(accepted: a spec of at most 4096 characters)")),
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
