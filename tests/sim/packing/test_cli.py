"""The ``kubecell`` command line as a user runs it: exit codes, stderr, and the files it writes."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from kubecell.core.placement.registry import FGD_BASELINES
from kubecell.sim.packing.metrics import ARRIVED_PCT
from kubecell.sim.packing.runner import run_grid
from tests.sim.support import NODE_HEADER, POD_HEADER

Writer = Callable[[str, str], Path]

REQUIRED_KEYS = {"policy", "seeds", "unallocated_gpu_pct_at_100", "unallocated_gpu_pct_at_130", "frag_ratio_pct_at",
                 "seconds"}
ALL_POLICIES = {"random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd", "binpack", "spread", "kubecell"}
REPORT_FILES = ("summary.json", "curves.csv", "curves_mean.csv", "allocation.png", "fragmentation.png", "index.html")


def kubecell(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kubecell.cli.main", *map(str, args)],
        capture_output=True, text=True, timeout=120, cwd=cwd, check=False,
    )


def assert_user_error(result: subprocess.CompletedProcess[str], *mentions: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    for mention in mentions:
        assert mention in lines[0]


def packing_args(nodes: Path, pods: Path, out: Path, *extra: str) -> list[str | Path]:
    return ["sim", "packing", "--nodes", nodes, "--pods", pods, "--out", out, *extra]


def test_missing_nodes_file(tmp_path: Path, example_files: tuple[Path, Path]) -> None:
    _, pods = example_files
    missing, out = tmp_path / "no-such-nodes.csv", tmp_path / "out"
    result = kubecell(*packing_args(missing, pods, out, "--seeds", "42"), cwd=tmp_path)
    assert_user_error(result, str(missing), "not found")
    assert not out.exists()


@pytest.mark.parametrize(
    ("extra", "mentions"),
    [
        (("--placement", "fgd,Tetris"), ("field 'placement'", "'Tetris'", "bestfit")),
        (("--placement", " , "), ("no policy given",)),
        (("--seeds", "42-x"), ("42-x", "'42-51'")),
        (("--seeds", "51-42"), ("range goes down: 51-42; write low-high, e.g. 42-51",)),
        (("--seeds", "-3"), ("-3",)),
        (("--inflate", "-1"), ("inflate",)),
    ],
)
def test_bad_options(tmp_path: Path, example_files: tuple[Path, Path], extra: tuple[str, ...],
                     mentions: tuple[str, ...]) -> None:
    nodes, pods = example_files
    out = tmp_path / "out"
    result = kubecell(*packing_args(nodes, pods, out, "--seeds", "42", *extra), cwd=tmp_path)
    assert_user_error(result, *mentions)
    assert not out.exists()


def test_malformed_pod_file_and_impossible_pod(tmp_path: Path, write_csv: Writer) -> None:
    nodes = write_csv("nodes.csv", f"{NODE_HEADER}\nn1,32000,131072,2,T4\n")
    bad_cell = write_csv("bad.csv", f"{POD_HEADER}\np1,4000,1024,1,500,\np2,4000,1024,two,1000,\n")
    assert_user_error(kubecell(*packing_args(nodes, bad_cell, tmp_path / "o1"), cwd=tmp_path),
                      f"{bad_cell}:3", "num_gpu", "'two'")
    impossible = write_csv("big.csv", f"{POD_HEADER}\np1,4000,1024,1,500,\nbig,4000,1024,4,1000,\n")
    assert_user_error(kubecell(*packing_args(nodes, impossible, tmp_path / "o2"), cwd=tmp_path),
                      f"{impossible}:3", "field 'num_gpu'", "'big'", "4 GPUs", "--allow-impossible")
    assert not (tmp_path / "o2").exists()

    # eight 2-GPU nodes: the 4-GPU pod fits none, and inflation keeps every original pod
    eight = write_csv("eight.csv", NODE_HEADER + "\n" + "".join(f"n{i},32000,131072,2,T4\n" for i in range(8)))
    allowed = kubecell(*packing_args(eight, impossible, tmp_path / "o3", "--seeds", "42", "--placement", "fgd",
                                     "--allow-impossible"), cwd=tmp_path)
    assert allowed.returncode == 0, allowed.stderr
    warnings = [line for line in allowed.stderr.splitlines() if not line.startswith("packing: ")]
    assert len(warnings) == 1
    assert warnings[0].startswith("warning: 1 pod(s) can never be placed")
    assert "big" in warnings[0]
    run = json.loads((tmp_path / "o3" / "run.json").read_text(encoding="utf-8"))
    assert run["impossible_pods"] == 1
    (summary,) = json.loads((tmp_path / "o3" / "summary.json").read_text(encoding="utf-8"))
    assert summary["failed_pods"]["mean"] >= 1


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_sim_packing_writes_the_report(tmp_path: Path, example_files: tuple[Path, Path]) -> None:
    nodes, pods = example_files
    out = tmp_path / "out"
    result = kubecell(*packing_args(nodes, pods, out, "--seeds", "42,43", "--placement", "FGD,BestFit"),
                      cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    for name in REPORT_FILES:
        assert (out / name).is_file(), name
        assert (out / name).stat().st_size > 0, name

    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert isinstance(summary, list)
    assert [entry["policy"] for entry in summary] == ["fgd", "bestfit"]
    for entry in summary:
        assert set(entry) >= REQUIRED_KEYS
        assert entry["seeds"] == [42, 43]
        for key in ("unallocated_gpu_pct_at_100", "unallocated_gpu_pct_at_130"):
            assert set(entry[key]) == {"mean", "sd"}
            assert 0 <= entry[key]["mean"] <= 100
            assert entry[key]["sd"] >= 0
        assert set(entry["frag_ratio_pct_at"]) == {"50", "80", "90", "100"}
        assert all(set(v) == {"mean", "sd"} for v in entry["frag_ratio_pct_at"].values())
        assert entry["seconds"] >= 0

    # the numbers are those of the library for the same inputs
    expected = {s.policy: s.as_dict() for s in run_grid(nodes, pods, ["fgd", "bestfit"], [42, 43])}
    for entry in summary:
        for key in ("unallocated_gpu_pct_at_100", "unallocated_gpu_pct_at_130", "frag_ratio_pct_at"):
            assert entry[key] == expected[entry["policy"]][key]

    per_seed = read_csv(out / "curves.csv")
    assert len(per_seed) == 2 * 2 * len(ARRIVED_PCT)
    assert {(row["policy"], row["seed"]) for row in per_seed} == {(p, s) for p in ("fgd", "bestfit")
                                                                  for s in ("42", "43")}
    mean_rows = read_csv(out / "curves_mean.csv")
    assert len(mean_rows) == 2 * len(ARRIVED_PCT)
    for entry in summary:
        (row,) = [r for r in mean_rows if r["policy"] == entry["policy"] and r["arrived_pct"] == "130"]
        assert math.isclose(float(row["unallocated_pct_mean"]), entry["unallocated_gpu_pct_at_130"]["mean"],
                            abs_tol=1e-3)
        assert math.isclose(float(row["unallocated_pct_sd"]), entry["unallocated_gpu_pct_at_130"]["sd"],
                            abs_tol=1e-3)

    for image in ("allocation.png", "fragmentation.png"):
        assert (out / image).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    page = (out / "index.html").read_text(encoding="utf-8")
    assert "fgd" in page
    assert "bestfit" in page
    assert 'src="allocation.png"' in page
    assert 'src="fragmentation.png"' in page


def test_simulate_runs_the_bundled_example(tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = kubecell("simulate", "--seeds", "42-43", "--out", out, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    page = out / "index.html"
    assert f"report: {page}" in result.stdout.splitlines()
    for name in REPORT_FILES:
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert [entry["policy"] for entry in summary] == [*FGD_BASELINES, "kubecell"]
    assert all(entry["seeds"] == [42, 43] for entry in summary)


def test_policies_lists_every_policy(tmp_path: Path) -> None:
    result = kubecell("policies", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    words = set(result.stdout.replace("│", " ").split())
    assert words >= ALL_POLICIES
    assert any(line.split("│")[1].split() == ["kubecell", "(default)"]
               for line in result.stdout.splitlines() if line.count("│") >= 2), result.stdout
