"""Issue 11, cases 7 and 3 for ``sim dynamic``.

7: ``--cluster X`` without ``--tenants`` used the bundled tenants, which belong to the bundled cluster: a
cluster of other GPU models failed with an error about the bundled file's cell types, and a larger P40
cluster ran silently with a fraction of it guaranteed. Now the run stops and says what to write.
3: a workload with no job in the window ran and reported nothing measurable; figures that are undefined
(n/a) now come with a line saying why.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kubecell.cli.examples import philly_example_paths
from kubecell.sim.dynamic import runner as dynamic_runner
from tests.cli.support import assert_one_line_error, pcs_trace, run_main, write

BIG_P40 = """\
nodeGroups:
  - count: 80
    namePrefix: p-
    gpu: {model: P40, count: 8}
    cpuMilli: 48000
    memoryMiB: 393216
    rackSize: 8
"""


@pytest.fixture
def no_simulation(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a simulation started")

    monkeypatch.setattr(dynamic_runner, "run_dynamic", refuse)


@pytest.mark.usefixtures("no_simulation")
@pytest.mark.parametrize(("cluster_text", "cell_type"), [(None, "V100M32x8/node (4)"), (BIG_P40, "P40x8/node (80)")],
                         ids=["other-model", "same-model-larger"])
def test_own_cluster_without_tenants(cluster_text: str | None, cell_type: str, tmp_path: Path,
                                     tiny_dynamic: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    cluster = write(tmp_path / "mine.yaml", cluster_text) if cluster_text else tiny_dynamic["cluster"]
    out = tmp_path / "out"
    code, _, err = run_main(monkeypatch, capsys, "sim", "dynamic", "--cluster", cluster,
                            "--workload", tiny_dynamic["a"], "--out", out)
    line = assert_one_line_error(code, err, "field 'tenants'", f"--cluster {cluster} was given without --tenants",
                                 "the bundled tenants belong to the bundled Philly cluster", "--tenants FILE",
                                 cell_type, "docs/dynamic.md")
    assert "cannot all be met" not in line
    assert "unknown cell type" not in line
    assert not out.exists()


def test_bundled_cluster_named_explicitly_keeps_the_bundled_tenants(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    cluster, tenants = philly_example_paths()
    trace = pcs_trace(tmp_path / "trace_6214e9.csv", (0, 0.0, 3600.0, 1), (1, 60.0, 3600.0, 2))
    out = tmp_path / "out"
    code, _, err = run_main(monkeypatch, capsys, "sim", "dynamic", "--cluster", cluster, "--workload", trace,
                            "--tenancy", "kubecell", "--out", out)
    assert code == 0, err
    assert json.loads((out / "run.json").read_text())["tenants"] == str(tenants)


@pytest.mark.usefixtures("no_simulation")
def test_no_job_in_the_window(tmp_path: Path, tiny_dynamic: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(monkeypatch, capsys, "sim", "dynamic", "--cluster", tiny_dynamic["cluster"],
                            "--tenants", tiny_dynamic["tenants"], "--workload", tiny_dynamic["a"],
                            "--workload", tiny_dynamic["b"], "--start-day", "3", "--days", "1",
                            "--out", tmp_path / "out")
    assert_one_line_error(code, err, "field 'workload'", "no jobs to simulate", "2 workload file(s) hold 6 row(s)",
                          "6 outside the window (days 3 to 4 of each trace)")
    assert not (tmp_path / "out").exists()


def test_undefined_figures_are_explained(tmp_path: Path, tiny_dynamic: dict[str, Path],
                                         monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """One job at t=0 for VC a only: no time before the last arrival, and VC b has no jobs."""
    trace = pcs_trace(tmp_path / "only" / "trace_a.csv", (0, 0.0, 3600.0, 2))
    code, stdout, err = run_main(monkeypatch, capsys, "sim", "dynamic", "--cluster", tiny_dynamic["cluster"],
                                 "--tenants", tiny_dynamic["tenants"], "--workload", trace, "--tenancy", "kubecell",
                                 "--out", tmp_path / "out")
    assert code == 0, err
    assert not re.search(r"\bnan\b", stdout)
    notes = [line for line in stdout.splitlines() if line.startswith("n/a")]
    assert any("every job arrived at the same instant" in note for note in notes), stdout
    assert any(note.startswith("n/a: VC b had no jobs in the workload") for note in notes), stdout
    assert "n/a marks a figure this run could not measure" in (tmp_path / "out" / "index.html").read_text()
