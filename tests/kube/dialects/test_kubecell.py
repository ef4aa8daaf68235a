"""kubecell's own dialect (``kubecell.kube.dialects.kubecell``): its resources and annotations, what its reader
states, and every refusal."""

from __future__ import annotations

from typing import Any

import pytest

from kubecell.core.model import TopologyLevel
from kubecell.kube.dialects import DialectOptions, GroupDemand, pod_demand
from kubecell.kube.dialects.kubecell import read
from tests.kube.dialect_support import make_pod, refused, shape, states


@pytest.mark.parametrize(("gpu", "expected"), [
    ({"kubecell.io/gpu-milli": "250"}, (1, 250, 0)),
    ({"kubecell.io/gpu-milli": "1"}, (1, 1, 0)),
    ({"kubecell.io/gpu-milli": "1000"}, (1, 1000, 0)),
    ({"kubecell.io/gpu-milli": "1k"}, (1, 1000, 0)),
    ({"kubecell.io/gpu-memory": "2048"}, (1, 0, 2048)),
    ({"kubecell.io/gpu-milli": "300", "kubecell.io/gpu-memory": "8192"}, (1, 300, 8192)),
    ({"kubecell.io/gpu": "3"}, (3, 1000, 0)),
    ({"kubecell.io/gpu": "1"}, (1, 1000, 0)),
])
def test_kubecell_resources(gpu: dict[str, str], expected: tuple[int, int, int]) -> None:
    demand = pod_demand(make_pod(gpu))
    assert shape(demand.request) == expected
    assert demand.dialects == ("kubecell",)


def test_kubecell_annotations() -> None:
    demand = pod_demand(make_pod({"kubecell.io/gpu": "4"}, annotations={
        "kubecell.io/vc": "team-a", "kubecell.io/topology": "NVLink", "kubecell.io/gpu-models": "A100, V100M32",
        "kubecell.io/isolation": "mps", "kubecell.io/group": "train", "kubecell.io/group-size": "8",
        "kubecell.io/group-min": "6"}))
    assert demand.vc == "team-a"
    assert demand.topology == demand.request.topology == TopologyLevel.NVLINK
    assert demand.request.gpu_models == frozenset({"A100", "V100M32"})
    assert demand.isolation == "mps"
    assert demand.group == GroupDemand("default/train", "kubecell", 8, 6)


def test_group_min_defaults_to_all_or_nothing_and_rack_topology_fits_shares() -> None:
    demand = pod_demand(make_pod({"kubecell.io/gpu-milli": "500"}, annotations={
        "kubecell.io/group": "g", "kubecell.io/group-size": "3", "kubecell.io/topology": "rack"}))
    assert demand.group == GroupDemand("default/g", "kubecell", 3, 3)
    assert demand.request.topology == TopologyLevel.RACK


def test_opportunistic_annotation_and_pod_priority() -> None:
    assert pod_demand(make_pod(priority=7)).priority == 7
    demand = pod_demand(make_pod(priority=7, annotations={"kubecell.io/opportunistic": "true"}))
    assert (demand.priority, demand.opportunistic) == (-1, True)
    assert pod_demand(make_pod(priority=7, annotations={"kubecell.io/opportunistic": "false"})).priority == 7


def test_model_annotation_on_a_cpu_only_pod_restricts_nothing() -> None:
    assert pod_demand(make_pod(annotations={"kubecell.io/gpu-models": "A100"})).request.gpu_models is None


def test_memory_limit_follows_the_largest_gpu_given() -> None:
    options = DialectOptions(largest_gpu_memory_mib=40536)
    assert shape(pod_demand(make_pod({"kubecell.io/gpu-memory": "40536"}), options=options).request) == (1, 0, 40536)
    refused(make_pod({"kubecell.io/gpu-memory": "40537"}), "40537", "largest GPU's 40536 MiB", options=options)


@pytest.mark.parametrize(("annotations", "expected"), [
    ({"kubecell.io/isolation": "MPS"}, ("mps", None)),
    ({"kubecell.io/gpu-models": "MIG-1g.5gb"}, ("mig", None)),  # only MIG profiles: mig isolation, implied
    ({"kubecell.io/gpu-models": "MIG-1g.5gb", "kubecell.io/isolation": "mig"}, ("mig", None)),
    ({"kubecell.io/topology": " Node "}, ("accounting", TopologyLevel.NODE)),
    ({"kubecell.io/topology": "zone"}, ("accounting", TopologyLevel.ZONE)),
])
def test_isolation_and_topology_of_one_whole_gpu(annotations: dict[str, str],
                                                 expected: tuple[str, TopologyLevel | None]) -> None:
    demand = pod_demand(make_pod({"kubecell.io/gpu": "1"}, annotations=annotations))
    assert (demand.isolation, demand.topology) == expected
    assert demand.dialects == ("kubecell",)


# ---------------------------------------------------------------- what the reader states on its own

@pytest.mark.parametrize(("pod", "expected"), [
    (make_pod(), {}),
    (make_pod({"kubecell.io/gpu": "2"}), {"ask": ("kubecell", (2, 1000, 0))}),
    (make_pod({"kubecell.io/gpu-milli": "250", "kubecell.io/gpu-memory": "1024"}),
     {"ask": ("kubecell", (1, 250, 1024))}),
    (make_pod({"nvidia.com/gpu": "1"}), {}),  # another dialect's resource says nothing here
    (make_pod(annotations={"kubecell.io/gpu-models": "A100,T4"}), {"models": [frozenset({"A100", "T4"})]}),
    (make_pod(annotations={"kubecell.io/group": "g", "kubecell.io/group-size": "4"}),
     {"groups": [("kubecell", "g", 4, None)]}),
    (make_pod(annotations={"kubecell.io/vc": " team-a "}), {"vc": "team-a", "carried": True}),
    (make_pod(annotations={"kubecell.io/opportunistic": "true"}), {"priority": -1, "carried": True}),
    (make_pod(annotations={"kubecell.io/opportunistic": "false"}), {"carried": True}),
    (make_pod(annotations={"kubecell.io/topology": "rack"}), {"carried": True}),
    (make_pod(annotations={"kubecell.io/isolation": "mps"}), {"carried": True}),
])
def test_what_kubecell_states(pod: dict[str, Any], expected: dict[str, Any]) -> None:
    assert states(read, pod) == expected


# ---------------------------------------------------------------- refusals

@pytest.mark.parametrize(("gpu", "annotations", "fragments"), [
    ({"kubecell.io/gpu-milli": "0"}, {}, ("kubecell.io/gpu-milli 0:", "no share", "accepted: 1..999")),
    ({"kubecell.io/gpu-milli": "-5"}, {}, ("kubecell.io/gpu-milli -5:", "no share")),
    ({"kubecell.io/gpu-milli": "1500"}, {}, ("kubecell.io/gpu-milli 1500:", "more than one GPU's compute",
                                             "kubecell.io/gpu: N")),
    ({"kubecell.io/gpu-milli": "500m"}, {}, ("kubecell.io/gpu-milli 0.5:", "not a whole number")),
    ({"kubecell.io/gpu-milli": "lots"}, {}, ("container main: kubecell.io/gpu-milli 'lots'", "quantity")),
    ({"kubecell.io/gpu": "2", "kubecell.io/gpu-milli": "500"}, {},
     ("kubecell.io/gpu 2 with kubecell.io/gpu-milli:", "exclusive")),
    ({"kubecell.io/gpu-milli": "1000", "kubecell.io/gpu-memory": "100"}, {},
     ("kubecell.io/gpu-milli 1000 with kubecell.io/gpu-memory 100:", "exclusive")),
    ({"kubecell.io/gpu-memory": "0"}, {}, ("kubecell.io/gpu-memory 0:", "no GPU memory")),
    ({"kubecell.io/gpu-memory": "90000"}, {}, ("kubecell.io/gpu-memory 90000:", "largest GPU's 81559 MiB")),
    ({"kubecell.io/gpu": "65"}, {}, ("kubecell.io/gpu 65:", "more GPUs than one node has")),
    ({"kubecell.io/gpu": "-1"}, {}, ("kubecell.io/gpu -1:", "negative")),
    ({}, {"kubecell.io/topology": "row"}, ('annotation kubecell.io/topology "row":', "nvlink, numa, node, rack, zone")),
    ({"kubecell.io/gpu-milli": "500"}, {"kubecell.io/topology": "nvlink"},
     ('annotation kubecell.io/topology "nvlink":', "a share of one GPU")),
    ({}, {"kubecell.io/isolation": "hami-core"}, ('annotation kubecell.io/isolation "hami-core":', "accounting, mps")),
    ({}, {"kubecell.io/opportunistic": "yes"}, ('annotation kubecell.io/opportunistic "yes":', "true or false")),
    ({}, {"kubecell.io/vc": " "}, ('annotation kubecell.io/vc " ":', "is empty")),
    ({"kubecell.io/gpu": "1"}, {"kubecell.io/gpu-models": "A200"},
     ('annotation kubecell.io/gpu-models "A200":', "matches no GPU model", "A100-80G")),
    ({}, {"kubecell.io/group-size": "4"}, ('annotation kubecell.io/group-size "4":', "without kubecell.io/group")),
    ({}, {"kubecell.io/group": "g"}, ('annotation kubecell.io/group "g":', "without kubecell.io/group-size")),
    ({}, {"kubecell.io/group": "g", "kubecell.io/group-size": "four"},
     ('annotation kubecell.io/group-size "four":', "not a whole number")),
    ({}, {"kubecell.io/group": "g", "kubecell.io/group-size": "0"},
     ('annotation kubecell.io/group-size "0":', "out of range")),
    ({}, {"kubecell.io/group": "g", "kubecell.io/group-size": "2", "kubecell.io/group-min": "3"},
     ('annotation kubecell.io/group-min "3":', "above the group's size 2")),
    # added with the cut by dialect: the refusals no case named yet
    ({}, {"kubecell.io/topology": "numa"}, ('annotation kubecell.io/topology "numa":', "asks for no GPU")),
    ({"kubecell.io/gpu": "2"}, {"kubecell.io/isolation": "mig"},
     ('annotation kubecell.io/isolation "mig":', "places one whole MIG instance", "asks for 2 GPUs")),
    ({"kubecell.io/gpu": "1"}, {"kubecell.io/isolation": "mig", "kubecell.io/gpu-models": "MIG-1g.5gb,A100"},
     ('annotation kubecell.io/isolation "mig":', "allows A100")),
    ({"kubecell.io/gpu": "1"}, {"kubecell.io/isolation": "mps", "kubecell.io/gpu-models": "MIG-1g.5gb"},
     ('annotation kubecell.io/isolation "mps":', "asks for mps on MIG instances")),
    ({}, {"kubecell.io/vc": "v" * 254}, ("annotation kubecell.io/vc", "is 254 characters long")),
    ({}, {"kubecell.io/group": "g" * 254, "kubecell.io/group-size": "2"},
     ("annotation kubecell.io/group", "is 254 characters long")),
    ({}, {"kubecell.io/group-min": "1"}, ('annotation kubecell.io/group-min "1":', "without kubecell.io/group")),
    ({"kubecell.io/gpu": "1"}, {"kubecell.io/gpu-models": "A100," * 300},
     ("annotation kubecell.io/gpu-models", "is 1500 characters long", "at most 1024 characters")),
])
def test_kubecell_refusals(gpu: dict[str, str], annotations: dict[str, str], fragments: tuple[str, ...]) -> None:
    refused(make_pod(gpu, annotations=annotations), *fragments)
