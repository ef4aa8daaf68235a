"""``kubecell sim elastic`` end to end on the synthetic profiles: summary.json with its documented keys, the
report files, the table; and its one-line input errors."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

from kubecell.cli.main import main
from kubecell.sim.elastic.metrics import FAMILY_KEYS, RUN_KEYS
from tests.sim.elastic.support import write_models, write_workload

REPORT_FILES = ("summary.json", "jobs.csv", "jct_cdf.png", "gpus_per_job.png", "index.html")


def run_main(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> int:
    monkeypatch.setattr(sys, "argv", ["kubecell", *argv])
    with pytest.raises(SystemExit) as info:
        main()
    return int(info.value.code or 0)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    write_models(tmp_path / "data")
    rows = "".join(f"cifar10-{i},{i * 30},cifar10,{1 + i % 4},{64 if i % 2 else 128}\n" for i in range(8))
    for family in ("philly", "saturn"):
        for number in (1, 2):
            write_workload(tmp_path / "data", rows, family=family, name=f"workload-{number}")
    return tmp_path / "data"


def test_summary_per_policy_workload_and_family(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                data: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    assert run_main(monkeypatch, ["sim", "elastic", "--workload", str(data), "--policy", "rigid", "--out",
                                  str(out)]) == 0
    for name in REPORT_FILES:
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == {"runs", "families", "paper_table3", "meta"}
    assert [(r["policy"], r["workload"]) for r in summary["runs"]] == [
        ("rigid", "philly/workload-1"), ("rigid", "philly/workload-2"),
        ("rigid", "saturn/workload-1"), ("rigid", "saturn/workload-2")]
    for run in summary["runs"]:
        assert set(run) == set(RUN_KEYS)
        assert run["completed"] == run["jobs"] == 8
    assert set(summary["families"]) == {"philly", "saturn"}
    for family in summary["families"].values():
        assert set(family["rigid"]) == set(FAMILY_KEYS)
        assert family["rigid"]["workloads"] == 2
    assert summary["paper_table3"]["saturn"]["Gavel+TunedJobs"]["avg_jct_hours"] == 2.5
    assert summary["meta"]["command"].startswith("kubecell sim elastic --workload ")
    printed = capsys.readouterr()
    assert "paper: Gavel+TunedJobs" in printed.out
    assert "4 workloads (32 jobs), 1 policies on sia64" in printed.out
    assert "simulating: 4/4 runs done" in printed.err


ERRORS = [
    (["--policy", "pollux"], "error: field 'policy': unknown elastic policy 'pollux'"),
    (["--cluster", "big"], "error: field 'cluster': unknown cluster 'big' (accepted: sia64)"),
    (["--models", "/nonexistent/models"], "error: field 'models': no profile folder at /nonexistent/models"),
]


@pytest.mark.parametrize(("extra", "message"), ERRORS)
def test_input_errors_are_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], data: Path,
                                   tmp_path: Path, extra: list[str], message: str) -> None:
    out = tmp_path / "report"
    argv = ["sim", "elastic", "--workload", str(data / "philly" / "workload-1.csv"), "--out", str(out), *extra]
    assert run_main(monkeypatch, argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(message), err
    assert "\n" not in err
    assert not out.exists()  # nothing is created before the inputs are valid


def test_out_is_checked_before_running(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                       data: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    argv = ["sim", "elastic", "--workload", str(data), "--policy", "rigid", "--out", str(blocker)]
    assert run_main(monkeypatch, argv) == 2
    assert "is an existing file, not a directory" in capsys.readouterr().err


def test_a_bad_row_names_file_and_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                       data: Path, tmp_path: Path) -> None:
    bad = write_workload(data, "x,0,cifar10,4,128\ny,5,resnet,4,128\n", family="philly", name="workload-3")
    argv = ["sim", "elastic", "--workload", str(data), "--policy", "rigid", "--out", str(tmp_path / "r")]
    assert run_main(monkeypatch, argv) == 2
    assert f"{bad}:3: field 'application': unknown application 'resnet'" in capsys.readouterr().err


def test_a_batch_the_profiles_never_ran_names_file_and_line(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str], data: Path,
                                                            tmp_path: Path) -> None:
    """Outside its profiles' range a rigid run would quietly train at another batch than the file says."""
    bad = write_workload(data, "x,0,cifar10,4,128\ny,5,cifar10,4,16777216\n", family="philly", name="workload-3")
    argv = ["sim", "elastic", "--workload", str(data), "--policy", "rigid", "--out", str(tmp_path / "r")]
    assert run_main(monkeypatch, argv) == 2
    err = capsys.readouterr().err
    assert f"{bad}:3: field 'batch_size': job 'y': batch_size 16777216 is outside what cifar10's profiles ran" in err
    assert not (tmp_path / "r").exists(), "refused before anything is written"


@pytest.mark.parametrize(("rows", "says"), [
    ("x,0,cifar10,4,128\ny,5,cifar10,999,128\n", "field 'num_replicas': job 'y' asks for 999 GPUs"),
    ("x,0,cifar10,4,128\ny,100000000,cifar10,4,128\n", "field 'time': job 'y' is submitted"),
], ids=["more GPUs than any type", "past the horizon"])
def test_what_would_stop_a_run_part_way_is_told_before_any_runs(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str], data: Path,
                                                                tmp_path: Path, rows: str, says: str) -> None:
    bad = write_workload(data, rows, family="philly", name="workload-3")
    argv = ["sim", "elastic", "--workload", str(data), "--policy", "kubecell,rigid", "--out", str(tmp_path / "r")]
    assert run_main(monkeypatch, argv) == 2
    assert f"{bad}:3: {says}" in capsys.readouterr().err
    assert not (tmp_path / "r").exists(), "refused before anything is written"


def test_two_workloads_reported_under_one_label_are_refused(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str], data: Path,
                                                            tmp_path: Path) -> None:
    """summary.json and jobs.csv name a workload by <folder>/<file>: two of them under one name would mix."""
    write_workload(data / "again", "x,0,cifar10,4,128\n", family="philly", name="workload-1")
    argv = ["sim", "elastic", "--workload", str(data), "--policy", "rigid", "--out", str(tmp_path / "r")]
    assert run_main(monkeypatch, argv) == 2
    assert "would both be reported as 'philly/workload-1'" in capsys.readouterr().err


def test_an_endless_horizon_is_refused(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                      data: Path, tmp_path: Path) -> None:
    argv = ["sim", "elastic", "--workload", str(data), "--max-hours", "inf", "--out", str(tmp_path / "r")]
    assert run_main(monkeypatch, argv) == 2
    assert "--max-hours" in capsys.readouterr().err


def test_the_handover_delay_reaches_the_run_and_its_command(monkeypatch: pytest.MonkeyPatch, data: Path,
                                                            tmp_path: Path) -> None:
    out = tmp_path / "report"
    argv = ["sim", "elastic", "--workload", str(data), "--policy", "rigid", "--handover-seconds", "30", "--out",
            str(out)]
    assert run_main(monkeypatch, argv) == 0
    meta = json.loads((out / "summary.json").read_text())["meta"]
    assert meta["handover_seconds"] == 30.0
    assert "--handover-seconds 30 " in meta["command"]


@pytest.mark.parametrize("value", ["-5", "nan", "1e9"])
def test_a_handover_that_is_not_a_grace_period_is_refused(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str], data: Path,
                                                          tmp_path: Path, value: str) -> None:
    argv = ["sim", "elastic", "--workload", str(data), "--handover-seconds", value, "--out", str(tmp_path / "r")]
    assert run_main(monkeypatch, argv) == 2
    assert "--handover-seconds" in capsys.readouterr().err


def test_names_a_workload_wrote_never_open_as_formulas(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A workload file is untrusted: jobs named ``=1+2`` or ``-2+3`` were written into jobs.csv as they were, and a
    spreadsheet opening the report ran them as formulas (CSV injection, CWE-1236). Now they are text (a leading
    ``'``); numbers, negative ones included, stay numbers."""
    write_models(tmp_path / "data")
    write_workload(tmp_path / "data", "=1+2,0,cifar10,1,128\n-2+3,30,cifar10,2,64\n@SUM(A1),60,cifar10,1,128\n",
                   family="philly", name="workload-1")
    out = tmp_path / "report"
    assert run_main(monkeypatch, ["sim", "elastic", "--workload", str(tmp_path / "data"), "--policy", "rigid",
                                  "--out", str(out)]) == 0
    with (out / "jobs.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert sorted(row["name"] for row in rows) == ["'-2+3", "'=1+2", "'@SUM(A1)"]
    assert all(float(row["jct_s"]) > 0 for row in rows)


def test_a_name_with_dollars_is_drawn_as_written(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Matplotlib reads ``$...$`` as mathematics: a workload family named ``x$\\foo$`` raised ``Unknown symbol``
    after the run, and the report was never written."""
    write_models(tmp_path / "data")
    write_workload(tmp_path / "data", "a,0,cifar10,1,128\n", family="x$\\foo$", name="workload-1")
    out = tmp_path / "report"
    assert run_main(monkeypatch, ["sim", "elastic", "--workload", str(tmp_path / "data"), "--policy", "rigid",
                                  "--out", str(out)]) == 0
    assert all((out / name).is_file() for name in REPORT_FILES)
