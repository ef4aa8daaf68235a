"""``kubecell sim dynamic`` end to end on a tiny cluster and workload, and its one-line input errors."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kubecell.cli.main import main
from kubecell.core.errors import InvalidInputError
from kubecell.inputs.cluster import load_cluster
from kubecell.sim.dynamic.runner import check_run_options, node_failure_events
from tests.sim.dynamic.support import SIA_HEADER, TINY_CLUSTER, Writer, pcs_rows

TENANTS = """\
virtualClusters:
  a: {cells: {V100M32x8/rack: 1}}
  b: {cells: {V100M32x8/node: 1}}
  sia-w1: {cells: {V100M32x8/node: 1}}
"""
REPORT_FILES = ("summary.json", "private.json", "run.json", "jobs.csv", "timeseries.csv", "utilisation.png",
                "allocation_by_vc.png", "queueing_delay.png", "index.html")
VC_KEYS = {"guaranteed_gpus", "allocated_gpus_mean", "borrowed_gpus_mean", "queueing_delay_minutes",
           "within_guarantee_queueing_delay_minutes", "jct_hours", "preemptions_per_job",
           "gpu_hours_lost_to_preemption", "rejected", "unfinished", "sharing_anomaly_minutes",
           "sharing_anomaly_ratio"}
OVERALL_KEYS = {"gpu_utilisation", "gangs_broken", "queueing_delay_minutes", "jct_hours", "preemptions_per_job",
                "gpu_hours_lost_to_preemption", "rejected", "unfinished"}


@pytest.fixture
def inputs(write: Writer) -> dict[str, Path]:
    hour = 3600.0
    return {
        "cluster": write("cluster.yaml", TINY_CLUSTER),
        "tenants": write("tenants.yaml", TENANTS),
        # a: a rack gang arriving after b has borrowed the idle nodes; b: more than its one node
        "a": write("philly/trace_a.csv", pcs_rows((0, 0.0, 8 * hour, 8), (1, 600.0, 16 * 2 * hour, 16),
                                                  (2, 700.0, 4 * hour, 4))),
        "b": write("philly/trace_b.csv", pcs_rows((0, 0.0, 8 * 3 * hour, 8), (1, 10.0, 8 * 3 * hour, 8),
                                                  (2, 20.0, 8 * 3 * hour, 8), (3, 30.0, 2 * hour, 2))),
        "sia": write("sia/workload-1.csv", SIA_HEADER + "\ncifar10-0,0,cifar10,4,2048\nbert-1,50,bert,8,32\n"),
    }


def args(inputs: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return ["sim", "dynamic", "--cluster", str(inputs["cluster"]), "--tenants", str(inputs["tenants"]),
            "--workload", str(inputs["a"]), "--workload", str(inputs["b"]), "--workload", str(inputs["sia"]),
            "--out", str(out), *extra]


def run_main(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> int:
    monkeypatch.setattr(sys, "argv", ["kubecell", *argv])
    with pytest.raises(SystemExit) as info:
        main()
    return int(info.value.code or 0)


def test_end_to_end(inputs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = subprocess.run([sys.executable, "-m", "kubecell.cli.main", *args(inputs, out, "--seed", "7")],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    for name in REPORT_FILES:
        assert (out / name).is_file(), name
    assert "dynamic simulation: per tenancy preset" in result.stdout
    assert "sharing anomaly" in result.stdout
    assert "report:" in result.stdout
    for policy in ("quota", "hived", "kubecell"):
        assert policy in result.stdout

    summary = json.loads((out / "summary.json").read_text())
    assert [entry["policy"] for entry in summary] == ["quota", "hived", "kubecell"]
    jobs = 3 + 4 + 2
    for entry in summary:
        assert set(entry) == {"policy", "overall", "per_vc", "seconds"}
        assert set(entry["overall"]) >= OVERALL_KEYS
        assert entry["overall"]["jobs"] == jobs
        assert entry["overall"]["gangs_broken"] == 0
        assert 0 < entry["overall"]["gpu_utilisation"] <= 1
        assert list(entry["per_vc"]) == ["a", "b", "sia-w1"]
        for vc in entry["per_vc"].values():
            assert set(vc) >= VC_KEYS
    by_policy = {entry["policy"]: entry for entry in summary}
    # hived does not borrow: b queues behind its single node; quota and kubecell lend it idle nodes
    assert by_policy["hived"]["per_vc"]["b"]["sharing_anomaly_minutes"] == pytest.approx(0.0, abs=1e-6)
    assert by_policy["kubecell"]["per_vc"]["b"]["sharing_anomaly_minutes"] < 0
    private = json.loads((out / "private.json").read_text())
    assert set(private) == {"a", "b", "sia-w1"}
    assert private["b"]["gpus"] == 8

    with (out / "jobs.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 3 * jobs + jobs  # three policies plus every job once in its private baseline
    assert {row["policy"] for row in rows} == {"quota", "hived", "kubecell", "private"}
    assert all(row["rejected"] == "" for row in rows if row["policy"] == "kubecell")
    run = json.loads((out / "run.json").read_text())
    assert run["seed"] == 7
    assert run["jobs"] == jobs
    page = (out / "index.html").read_text()
    assert "sia-w1" in page
    assert "queueing_delay.png" in page


def test_single_policy_with_failures_and_horizon(inputs: dict[str, Path], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r"
    code = run_main(monkeypatch, args(inputs, out, "--tenancy", "KubeCell", "--node-failures", "3", "--seed", "1",
                                      "--repair-hours", "1", "--horizon-days", "0.05"))
    assert code == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert [entry["policy"] for entry in summary] == ["kubecell"]
    overall = summary[0]["overall"]
    assert overall["simulated_hours"] <= 1.2 + 1e-6
    assert overall["unfinished"] > 0  # the horizon cut long jobs off
    run = json.loads((out / "run.json").read_text())
    assert 1 <= run["node_failures"] <= 3


def test_node_failures_are_seeded() -> None:
    nodes = load_cluster(Path(__file__).parent / ".." / ".." / ".." / "src" / "kubecell" / "sim" / "examples" / "philly"
                         / "cluster.yaml")
    first = node_failure_events(nodes, 10, seed=3, start=0.0, end=86_400.0, repair_seconds=3600.0)
    assert first == node_failure_events(nodes, 10, seed=3, start=0.0, end=86_400.0, repair_seconds=3600.0)
    assert first != node_failure_events(nodes, 10, seed=4, start=0.0, end=86_400.0, repair_seconds=3600.0)
    downs = [e for e in first if not e.healthy]
    ups = [e for e in first if e.healthy]
    assert len(downs) == len(ups) <= 10
    assert all(0.0 <= e.time < 86_400.0 for e in downs)
    assert node_failure_events(nodes, 0, seed=3, start=0.0, end=1.0, repair_seconds=1.0) == []


def _one_line_error(code: int, err: str, *mentions: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    assert "Traceback" not in err
    for mention in mentions:
        assert mention in lines[0], lines[0]


def test_unknown_tenancy_preset(inputs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                        capsys: pytest.CaptureFixture[str]) -> None:
    code = run_main(monkeypatch, args(inputs, tmp_path / "o", "--tenancy", "quota,fifo"))
    _one_line_error(code, capsys.readouterr().err, "field 'tenancy'", "'fifo'", "quota, hived, kubecell")
    assert not (tmp_path / "o").exists()


def test_placement_policy_is_chosen_and_recorded(inputs: dict[str, Path], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r"
    code = run_main(monkeypatch, args(inputs, out, "--tenancy", "kubecell", "--placement", "FGD"))
    assert code == 0, capsys.readouterr().err
    assert "placement fgd" in capsys.readouterr().out
    assert json.loads((out / "run.json").read_text())["placement"] == "fgd"
    code = run_main(monkeypatch, args(inputs, tmp_path / "o", "--placement", "tetris"))
    _one_line_error(code, capsys.readouterr().err, "field 'placement'", "'tetris'", "kubecell")
    assert not (tmp_path / "o").exists()


def test_bad_row_stops_before_running(write: Writer, inputs: dict[str, Path], tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    inputs["a"] = write("philly/trace_a.csv", pcs_rows((0, 0.0, 10.0, 8)) + "1,oops,10,8,0,m\n")
    code = run_main(monkeypatch, args(inputs, tmp_path / "o"))
    _one_line_error(code, capsys.readouterr().err, f"{inputs['a']}:3", "field 'submit_time'")
    assert not (tmp_path / "o").exists()

    code = run_main(monkeypatch, [*args(inputs, tmp_path / "o", "--tenancy", "kubecell"), "--skip-bad-rows"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "warning: skipped 1 bad trace row(s)" in captured.err
    assert json.loads((tmp_path / "o" / "run.json").read_text())["bad_rows_skipped"] == 1


def test_tenants_that_do_not_fit(write: Writer, inputs: dict[str, Path], tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    inputs["tenants"] = write("big.yaml", "virtualClusters:\n  a: {cells: {V100M32x8/rack: 3}}\n")
    code = run_main(monkeypatch, args(inputs, tmp_path / "o"))
    _one_line_error(code, capsys.readouterr().err, "big.yaml", "cannot all be met")


def test_cluster_error(write: Writer, inputs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                       capsys: pytest.CaptureFixture[str]) -> None:
    inputs["cluster"] = write("c2.yaml", TINY_CLUSTER.replace("rackSize", "rackSise"))
    code = run_main(monkeypatch, args(inputs, tmp_path / "o"))
    _one_line_error(code, capsys.readouterr().err, "c2.yaml:8", "rackSise")


def test_jobs_of_unknown_vcs_are_rejected_and_counted(write: Writer, inputs: dict[str, Path], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    stray = write("philly/trace_zz.csv", pcs_rows((0, 5.0, 10.0, 1)))
    code = run_main(monkeypatch, [*args(inputs, tmp_path / "o", "--tenancy", "hived"), "--workload", str(stray)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "1 job(s) of VC(s) not in" in captured.err
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary[0]["per_vc"]["zz"]["rejected"] == 1
    assert summary[0]["overall"]["rejected"] >= 1


@pytest.mark.parametrize("count", [-1, 10**12])
def test_a_node_failure_count_past_the_bound_is_refused_before_loading(count: int) -> None:
    """10^12 failures reached numpy after the inputs were read and asked it for 7 TiB."""
    with pytest.raises(InvalidInputError, match="node-failures") as info:
        check_run_options(node_failures=count)
    assert "1,000,000" in (info.value.accepted or "")
