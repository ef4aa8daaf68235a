"""The one CSV reader behind every trace format, seen through each format's public loader: the same
mistake gives the same kind of message whether the file is a node list, a pod list or a job list."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

from kubecell.core.errors import InvalidInputError
from kubecell.sim.traces.openb import load_nodes, load_pods
from kubecell.sim.traces.workloads import load_workloads
from tests.sim.support import NODE_HEADER, POD_HEADER
from tests.support import PCS_HEADER, SIA_HEADER

Writer = Callable[[str, str], Path]
Loader = Callable[[Path], object]



class Format(NamedTuple):
    loader: Loader
    name: str
    header: str
    good: str
    """One valid data row."""
    required: str
    """The columns the format cannot do without."""


FORMATS = {
    "nodes": Format(load_nodes, "nodes.csv", NODE_HEADER, "node-a,96000,393216,8,A100", NODE_HEADER),
    "pods": Format(load_pods, "pods.csv", POD_HEADER, "pod-a,4000,8192,1,500,",
                   "name,cpu_milli,memory_mib,num_gpu,gpu_milli"),
    "pcs": Format(load_workloads, "trace_a.csv", PCS_HEADER, "0,0.0,3600.0,1,0.0,ResNet",
                  "app_id,submit_time,service,num_jobs"),
    "sia": Format(load_workloads, "workload-1.csv", SIA_HEADER, "cifar10-0,1.0,cifar10,4,2048",
                  "name,time,application,num_replicas"),
}


def raised(loader: Loader, path: Path) -> str:
    with pytest.raises(InvalidInputError) as info:
        loader(path)
    text = str(info.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize("kind", ["nodes", "pods"])
def test_a_directory_passed_as_a_file_says_so(tmp_path: Path, kind: str) -> None:
    loader, name, *_ = FORMATS[kind]
    folder = tmp_path / name
    folder.mkdir()
    assert raised(loader, folder) == f"{folder}: is a directory, not a file (accepted: a CSV file)"


def test_a_directory_among_a_workload_folders_csv_files_says_so(tmp_path: Path, write_csv: Writer) -> None:
    write_csv("trace_a.csv", f"{PCS_HEADER}\n0,0,10,1,0,m\n")
    (tmp_path / "trace_b.csv").mkdir()
    text = raised(load_workloads, tmp_path)
    assert text == f"{tmp_path / 'trace_b.csv'}: is a directory, not a file (accepted: a CSV file)"


@pytest.mark.parametrize(
    ("kind", "header", "message"),
    [
        ("nodes", "sn,cpu_milli,memory_mib,gpu", "missing column 'model' (columns: sn, cpu_milli, memory_mib, gpu)"),
        ("nodes", "sn,cpu_milli,memory_mib", "missing columns 'gpu', 'model' (columns: sn, cpu_milli, memory_mib)"),
        ("pods", "name,cpu_milli,memory_mib,num_gpu,gpu_spec",
         "missing column 'gpu_milli' (columns: name, cpu_milli, memory_mib, num_gpu, gpu_spec)"),
        ("pcs", "app_id,submit_time,num_jobs,model_name",
         "missing column 'service' (columns: app_id, submit_time, num_jobs, model_name)"),
        ("sia", "name,time,application,batch_size",
         "missing column 'num_replicas' (columns: name, time, application, batch_size)"),
    ],
)
def test_a_missing_column_is_named(write_csv: Writer, kind: str, header: str, message: str) -> None:
    loader, name, _, _, required = FORMATS[kind]
    width = header.count(",") + 1
    path = write_csv(name, f"{header}\n{','.join(['1'] * width)}\n")
    text = raised(loader, path)
    assert text.startswith(f"{path}:1: {message} (accepted: ")
    assert text.endswith(f"header with {required.replace(',', ', ')})")


@pytest.mark.parametrize("kind", list(FORMATS))
def test_an_empty_file_says_it_is_empty(write_csv: Writer, kind: str) -> None:
    loader, name, *_ = FORMATS[kind]
    path = write_csv(name, "")
    assert raised(loader, path).startswith(f"{path}: the file is empty (accepted: ")


@pytest.mark.parametrize("kind", list(FORMATS))
def test_a_blank_first_line_is_not_a_header(write_csv: Writer, kind: str) -> None:
    loader, name, header, good, _ = FORMATS[kind]
    path = write_csv(name, f"\n{header}\n{good}\n")
    assert raised(loader, path).startswith(f"{path}:1: line 1 is blank; the first line must be the header")


@pytest.mark.parametrize("kind", list(FORMATS))
def test_a_column_named_twice_is_rejected(write_csv: Writer, kind: str) -> None:
    loader, name, header, good, _ = FORMATS[kind]
    first = header.split(",")[1]
    path = write_csv(name, f"{header},{first}\n{good},1\n")
    assert raised(loader, path) == (f"{path}:1: column {first!r} appears twice (columns 2 and "
                                    f"{header.count(',') + 2}) (accepted: unique column names)")


@pytest.mark.parametrize("kind", list(FORMATS))
def test_rows_with_too_few_or_too_many_fields(write_csv: Writer, kind: str) -> None:
    loader, name, header, good, _ = FORMATS[kind]
    columns = header.split(",")
    short = ",".join(good.split(",")[:2])
    path = write_csv(name, f"{header}\n{good}\n{short}\n")
    assert raised(loader, path) == (f"{path}:3: field '{columns[2]}': has 2 fields, header has {len(columns)} "
                                    f"(accepted: {len(columns)} comma-separated fields per row ({header}))")
    path = write_csv(name, f"{header}\n{good}\n{good},extra\n")
    assert raised(loader, path).startswith(f"{path}:3: has {len(columns) + 1} fields, header has {len(columns)}")


@pytest.mark.parametrize("kind", ["nodes", "pods"])
def test_whitespace_only_rows_are_skipped_like_blank_lines(write_csv: Writer, kind: str) -> None:
    loader, name, header, good, _ = FORMATS[kind]
    path = write_csv(name, f"{header}\n   \n{good}\n{',' * header.count(',')}\n")
    loaded = loader(path)
    assert isinstance(loaded, list)
    assert len(loaded) == 1


def test_missing_and_non_utf8_files_name_the_file(tmp_path: Path) -> None:
    for loader, name, header, good, _ in FORMATS.values():
        missing = tmp_path / "absent" / name
        assert raised(loader, missing) == f"{missing}: file not found"
        binary = tmp_path / name
        binary.write_bytes(f"{header}\n{good}\n".encode() + b"\xff\xfe,1\n")
        assert raised(loader, binary) == f"{binary}: not a UTF-8 text file (accepted: a UTF-8 (or ASCII) CSV file)"
