"""The openb node and pod list loaders: what they accept, and errors a user can act on."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kubecell.core.errors import InvalidInputError
from kubecell.core.limits import MAX_CPU_MILLI, MAX_MEMORY_MIB
from kubecell.core.model import MILLI_PER_GPU
from kubecell.sim.traces.openb import NODE_COLUMNS, POD_COLUMNS, load_nodes, load_pods
from tests.sim.support import NODE_HEADER, POD_HEADER, openb_file

Writer = Callable[[str, str], Path]

GOOD_NODE = "node-a,96000,393216,8,A100"
GOOD_POD = "pod-a,4000,8192,1,500,"


def raised(loader: Callable[[Path], object], path: Path) -> InvalidInputError:
    with pytest.raises(InvalidInputError) as info:
        loader(path)
    return info.value


def assert_row_error(error: InvalidInputError, path: Path, line: int, field: str, *accepted: str) -> None:
    """The message names file:line, the field and what would have been accepted."""
    text = str(error)
    assert "\n" not in text
    assert f"{path}:{line}" in text
    assert f"field '{field}'" in text
    assert "(accepted: " in text
    for fragment in accepted:
        assert fragment in text
    assert error.location == f"{path}:{line}"
    assert error.field == field


# ---------------------------------------------------------------------------------------------- node lists


@pytest.mark.parametrize(
    ("bad_row", "field", "accepted", "mentions"),
    [
        ("node-b,lots,393216,8,A100", "cpu_milli", "a whole number", "'lots'"),
        ("node-b,96000,12.5,8,A100", "memory_mib", "a whole number", "'12.5'"),
        ("node-b,96000,-1,8,A100", "memory_mib", f"0..{MAX_MEMORY_MIB}", "-1"),
        ("node-b,-96000,393216,8,A100", "cpu_milli", f"0..{MAX_CPU_MILLI}", "-96000"),
        ("node-b,96000,393216,-2,A100", "gpu", "0..64", "-2"),
        ("node-b,96000,393216,65,A100", "gpu", "0..64", "65"),
        ("node-b,96000,393216,8,Z80", "model", "A100", "'Z80'"),
        ("node-b,96000,393216,8,", "model", "T4", "8 GPUs"),
        ("node-a,96000,393216,8,A100", "sn", "unique names", "first at line 2"),
    ],
)
def test_node_row_errors_name_file_line_field_and_accepted(
    write_csv: Writer, bad_row: str, field: str, accepted: str, mentions: str
) -> None:
    path = write_csv("nodes.csv", f"{NODE_HEADER}\n{GOOD_NODE}\n{bad_row}\n")
    error = raised(load_nodes, path)
    assert_row_error(error, path, 3, field, accepted, mentions)


def test_unknown_node_model_lists_known_models(write_csv: Writer) -> None:
    path = write_csv("nodes.csv", f"{NODE_HEADER}\nnode-b,96000,393216,8,Z80\n")
    error = raised(load_nodes, path)
    for known in ("A100", "G2", "P100", "T4", "V100M16", "V100M32"):
        assert known in (error.accepted or "")


def test_malformed_value_on_a_skipped_cpu_node_is_still_reported(write_csv: Writer) -> None:
    path = write_csv("nodes.csv", f"{NODE_HEADER}\ncpu-node,lots,1024,0,\n{GOOD_NODE}\n")
    assert_row_error(raised(load_nodes, path), path, 2, "cpu_milli", "a whole number")


@pytest.mark.parametrize(
    ("bad_row", "fields"),
    [("node-b,96000,393216,8,A100,extra", 6), ("node-b,96000,393216,8", 4), ("node-b", 1)],
)
def test_node_row_with_wrong_field_count(write_csv: Writer, bad_row: str, fields: int) -> None:
    path = write_csv("nodes.csv", f"{NODE_HEADER}\n{GOOD_NODE}\n{bad_row}\n")
    error = raised(load_nodes, path)
    text = str(error)
    assert f"{path}:3" in text
    assert f"has {fields} fields, header has 5" in text
    assert "(accepted: 5 " in text


def test_line_numbers_count_blank_lines(write_csv: Writer) -> None:
    path = write_csv("nodes.csv", f"{NODE_HEADER}\n{GOOD_NODE}\n\n\nnode-b,x,1,1,T4\n")
    assert_row_error(raised(load_nodes, path), path, 5, "cpu_milli")


def test_missing_node_column_names_it_and_the_required_header(write_csv: Writer) -> None:
    path = write_csv("nodes.csv", "sn,cpu_milli,memory_mib,gpu\nnode-a,96000,393216,8\n")
    error = raised(load_nodes, path)
    text = str(error)
    assert f"{path}:1" in text
    assert "model" in error.message
    assert error.accepted is not None
    assert all(column in error.accepted for column in NODE_COLUMNS)


def test_missing_node_file(tmp_path: Path) -> None:
    path = tmp_path / "absent" / "nodes.csv"
    error = raised(load_nodes, path)
    assert str(path) in str(error)
    assert "not found" in str(error)


def test_empty_node_file(write_csv: Writer) -> None:
    path = write_csv("nodes.csv", "")
    error = raised(load_nodes, path)
    assert str(path) in str(error)
    assert error.accepted is not None
    assert all(column in error.accepted for column in NODE_COLUMNS)


@pytest.mark.parametrize("body", ["", "cpu-1,32000,131072,0,\ncpu-2,32000,131072,,\n"])
def test_node_file_without_gpu_nodes(write_csv: Writer, body: str) -> None:
    path = write_csv("nodes.csv", f"{NODE_HEADER}\n{body}")
    error = raised(load_nodes, path)
    assert str(path) in str(error)
    assert "no usable (GPU) nodes" in str(error)


def test_non_utf8_node_file(tmp_path: Path) -> None:
    path = tmp_path / "nodes.csv"
    path.write_bytes(f"{NODE_HEADER}\n{GOOD_NODE}\n".encode() + b"n\xe9ud,96000,393216,8,A100\n")
    error = raised(load_nodes, path)
    assert str(path) in str(error)
    assert "UTF-8" in str(error)


def test_valid_nodes_skip_cpu_only_by_default(write_csv: Writer) -> None:
    path = write_csv(
        "nodes.csv",
        f"{NODE_HEADER}\n{GOOD_NODE}\ncpu-1,32000,131072,0,\nnode-t4,104000,524288,2,T4\ncpu-2,64000,262144,,\n",
    )
    nodes = load_nodes(path)
    assert [node.name for node in nodes] == ["node-a", "node-t4"]
    a100, t4 = nodes
    assert (a100.cpu_milli, a100.memory_mib, a100.gpu_count) == (96000, 393216, 8)
    assert {gpu.model for gpu in a100.gpus} == {"A100"}
    assert (t4.cpu_milli, t4.memory_mib, t4.gpu_count) == (104000, 524288, 2)
    assert {gpu.model for gpu in t4.gpus} == {"T4"}

    everything = load_nodes(path, include_cpu_nodes=True)
    assert [node.name for node in everything] == ["node-a", "cpu-1", "node-t4", "cpu-2"]
    assert [node.gpu_count for node in everything] == [8, 0, 2, 0]


def test_node_file_with_byte_order_mark(tmp_path: Path) -> None:
    path = tmp_path / "nodes.csv"
    path.write_bytes(f"\ufeff{NODE_HEADER}\r\n{GOOD_NODE}\r\n".encode())
    assert [node.name for node in load_nodes(path)] == ["node-a"]


# ---------------------------------------------------------------------------------------------- pod lists


@pytest.mark.parametrize(
    ("bad_row", "field", "accepted", "mentions"),
    [
        ("pod-b,4000,8192,one,1000,", "num_gpu", "a whole number", "'one'"),
        ("pod-b,4k,8192,1,1000,", "cpu_milli", "a whole number", "'4k'"),
        ("pod-b,-4000,8192,1,1000,", "cpu_milli", f"0..{MAX_CPU_MILLI}", "-4000"),
        ("pod-b,4000,-1,1,1000,", "memory_mib", f"0..{MAX_MEMORY_MIB}", "-1"),
        ("pod-b,4000,8192,1,-300,", "gpu_milli", "0..1000", "-300"),
        ("pod-b,4000,8192,1,1200,", "gpu_milli", "0..1000", "1200"),
        ("pod-b,4000,8192,2,500,", "gpu_milli", "1000 for multi-GPU pods", "2 GPUs"),
        ("pod-b,4000,8192,8,999,", "gpu_milli", "1000 for multi-GPU pods", "999"),
        ("pod-b,4000,8192,0,300,", "gpu_milli", "0 for CPU-only pods", "300"),
        ("pod-b,4000,8192,1,0,", "gpu_milli", "1..1000", "num_gpu 1"),
        ("pod-b,4000,8192,1,500,Z80", "gpu_spec", "'|'-separated", "'Z80'"),
        ("pod-b,4000,8192,1,500,T4|V100M99", "gpu_spec", "V100M32", "'V100M99'"),
        ("pod-a,4000,8192,1,500,", "name", "unique names", "first at line 2"),
    ],
)
def test_pod_row_errors_name_file_line_field_and_accepted(
    write_csv: Writer, bad_row: str, field: str, accepted: str, mentions: str
) -> None:
    path = write_csv("pods.csv", f"{POD_HEADER}\n{GOOD_POD}\n{bad_row}\n")
    error = raised(load_pods, path)
    assert_row_error(error, path, 3, field, accepted, mentions)


@pytest.mark.parametrize(("bad_row", "fields"), [("pod-b,4000,8192,1,500,,LS", 7), ("pod-b,4000,8192,1", 4)])
def test_pod_row_with_wrong_field_count(write_csv: Writer, bad_row: str, fields: int) -> None:
    path = write_csv("pods.csv", f"{POD_HEADER}\n{GOOD_POD}\n{bad_row}\n")
    text = str(raised(load_pods, path))
    assert f"{path}:3" in text
    assert f"has {fields} fields, header has 6" in text


def test_missing_pod_column(write_csv: Writer) -> None:
    path = write_csv("pods.csv", "name,cpu_milli,memory_mib,num_gpu\npod-a,4000,8192,1\n")
    error = raised(load_pods, path)
    assert f"{path}:1" in str(error)
    assert "gpu_milli" in error.message
    assert error.accepted is not None
    assert all(column in error.accepted for column in POD_COLUMNS)


@pytest.mark.parametrize("text", ["", f"{POD_HEADER}\n"])
def test_pod_file_without_pods(write_csv: Writer, text: str) -> None:
    path = write_csv("pods.csv", text)
    assert str(path) in str(raised(load_pods, path))


def test_missing_and_non_utf8_pod_files(tmp_path: Path) -> None:
    missing = tmp_path / "pods.csv"
    assert str(missing) in str(raised(load_pods, missing))
    missing.write_bytes(f"{POD_HEADER}\n".encode() + b"p\xff,4000,8192,1,500,\n")
    error = raised(load_pods, missing)
    assert str(missing) in str(error)
    assert "UTF-8" in str(error)


def test_valid_pods_parse_requests_and_gpu_spec(write_csv: Writer) -> None:
    path = write_csv(
        "pods.csv",
        f"{POD_HEADER},qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
        "share,4000,8192,1,470,,LS,Running,10,20,11\n"
        "whole,8000,16384,8,1000,A100,BE,Pending,10,20,\n"
        "pinned,2000,4096,1,1000,V100M16|V100M32|V100M32,LS,Failed,10,20,12\n"
        "cpu,1000,0,0,0,,BE,Running,10,20,11\n",
    )
    pods = {pod.name: pod for pod in load_pods(path)}
    assert list(pods) == ["share", "whole", "pinned", "cpu"]

    share = pods["share"]
    assert (share.cpu_milli, share.memory_mib, share.gpu_count, share.gpu_milli) == (4000, 8192, 1, 470)
    assert share.gpu_models is None
    assert share.total_gpu_milli == 470

    whole = pods["whole"]
    assert whole.total_gpu_milli == 8 * MILLI_PER_GPU
    assert whole.gpu_models == frozenset({"A100"})
    request = whole.request()
    assert (request.gpu_count, request.gpu_milli, request.gpu_models) == (8, 1000, frozenset({"A100"}))

    pinned = pods["pinned"]
    assert pinned.gpu_models == frozenset({"V100M16", "V100M32"})
    assert pinned.request().gpu_models == frozenset({"V100M16", "V100M32"})

    cpu = pods["cpu"]
    assert cpu.total_gpu_milli == 0
    assert not cpu.request().wants_gpu
    assert cpu.request("cpu-copy").name == "cpu-copy"


def test_multigpu_style_five_column_pod_list(write_csv: Writer) -> None:
    path = write_csv("pods.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,8000,1024,4,1000\np2,1000,0,1,250\n")
    pods = load_pods(path)
    assert [(p.name, p.gpu_count, p.gpu_milli, p.total_gpu_milli) for p in pods] == [
        ("p1", 4, 1000, 4000),
        ("p2", 1, 250, 250),
    ]
    assert all(p.gpu_models is None and p.gpu_spec == "" for p in pods)


# ---------------------------------------------------------------------------------------------- real files


@pytest.mark.shared_data
def test_openb_node_lists_match_their_documented_inventory() -> None:
    gpu_nodes = load_nodes(openb_file("csv", "openb_node_list_gpu_node.csv"))
    assert len(gpu_nodes) == 1213
    assert sum(node.gpu_count for node in gpu_nodes) == 6212
    assert sum(node.cpu_milli for node in gpu_nodes) == 107_018_000
    assert sum(node.memory_mib for node in gpu_nodes) == 503_828_480

    all_nodes = openb_file("csv", "openb_node_list_all_node.csv")
    assert len(load_nodes(all_nodes)) == 1213
    with_cpu = load_nodes(all_nodes, include_cpu_nodes=True)
    assert len(with_cpu) == 1523
    assert sum(node.gpu_count == 0 for node in with_cpu) == 310


@pytest.mark.shared_data
def test_openb_pod_lists_load() -> None:
    default = load_pods(openb_file("csv", "openb_pod_list_default.csv"))
    assert len(default) == 8152
    assert sum(pod.gpu_count > 0 for pod in default) == 7064
    assert round(sum(pod.total_gpu_milli for pod in default) / MILLI_PER_GPU) == 6087
    assert all(pod.gpu_models is None for pod in default)

    spec = load_pods(openb_file("csv", "openb_pod_list_gpuspec10.csv"))
    assert len(spec) == 8152
    assert sum(pod.gpu_models is not None for pod in spec) == 732

    multigpu = load_pods(openb_file("csv", "openb_pod_list_multigpu20.csv"))
    assert len(multigpu) == 8324
    assert all(pod.gpu_spec == "" for pod in multigpu)
