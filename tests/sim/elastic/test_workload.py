"""Sia workload files for the elastic simulator: rows, one-line errors, directories grouped by family."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubecell.core.errors import InvalidInputError
from kubecell.sim.elastic.workload import load_workload, models_dir_for, workload_files
from tests.sim.elastic.support import WORKLOAD_HEADER, write_workload

APPS = ("cifar10", "bert")


def test_rows_in_arrival_order(tmp_path: Path) -> None:
    path = write_workload(tmp_path, "bert-1,50,bert,8,384\ncifar10-0,10.5,CIFAR10,4.0,2048\n", family="philly")
    workload = load_workload(path, APPS)
    assert (workload.family, workload.name, workload.label) == ("philly", "workload-1", "philly/workload-1")
    first, second = workload.jobs
    assert (first.name, first.submitted, first.application, first.num_replicas, first.batch_size) == (
        "cifar10-0", 10.5, "cifar10", 4, 2048)
    assert second.name == "bert-1"


BAD_ROWS = [
    ("a,0,resnet,4,128\n", "workload-1.csv:2: field 'application': unknown application 'resnet' (accepted: bert, "
     "cifar10)"),
    ("a,0,bert,4,128\na,5,bert,4,128\n", "workload-1.csv:3: field 'name': job 'a' appears twice"),
    ("a,0,bert,0,128\n", "workload-1.csv:2: field 'num_replicas': '0' replicas is out of range"),
    ("a,0,bert,2.5,128\n", "'2.5' replicas is not a whole number"),
    ("a,-1,bert,4,128\n", "workload-1.csv:2: field 'time': '-1' is out of range"),
    ("a,0,bert,4,big\n", "field 'batch_size': 'big' is not a number"),
    ("a,0,bert,4\n", "workload-1.csv:2: field 'batch_size': has 4 fields, header has 5"),
    ("", "has a header but no jobs"),
]


@pytest.mark.parametrize(("rows", "message"), BAD_ROWS)
def test_bad_rows(tmp_path: Path, rows: str, message: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        load_workload(write_workload(tmp_path, rows), APPS)
    assert message in str(info.value)


def test_missing_batch_size_column(tmp_path: Path) -> None:
    path = tmp_path / "w.csv"
    path.write_text(WORKLOAD_HEADER.rsplit(",", 1)[0] + "\na,0,bert,4\n")
    with pytest.raises(InvalidInputError, match=r"w\.csv:1: missing column 'batch_size'"):
        load_workload(path, APPS)


def test_directories_and_models(tmp_path: Path) -> None:
    for family in ("saturn", "philly"):
        for number in (10, 2, 1):
            write_workload(tmp_path / "data", "a,0,bert,4,128\n", family=family, name=f"workload-{number}")
    (tmp_path / "data" / "models").mkdir()
    files = workload_files(tmp_path / "data")
    assert [f"{p.parent.name}/{p.stem}" for p in files] == [
        "philly/workload-1", "philly/workload-2", "philly/workload-10",
        "saturn/workload-1", "saturn/workload-2", "saturn/workload-10"]
    assert models_dir_for(files[0]) == tmp_path / "data" / "models"
    assert models_dir_for(tmp_path / "data" / "philly") == tmp_path / "data" / "models"
    with pytest.raises(InvalidInputError, match=r"no workload-\*\.csv files below this directory"):
        workload_files(tmp_path / "data" / "models")
    with pytest.raises(InvalidInputError, match="not found"):
        workload_files(tmp_path / "nowhere")
