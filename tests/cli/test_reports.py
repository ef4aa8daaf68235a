"""Issue 11, case 11: reports that explain themselves, and console tables that keep their headers in a log.

The packing index.html listed Python reprs of its inputs and no word on what its figures mean; now it says
what each figure is and which direction is better, lists the inputs in words and prints the command that
reproduces the run (tested by running it). Console tables were squeezed to 80 columns when the output was
not a terminal, wrapping or cutting headers.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kubecell.cli.main import app
from kubecell.sim.packing.report import METRIC_NOTES
from tests.cli.support import pcs_trace, run_main, write

PACKING_HEADERS = ("placement", "unallocated GPU % @100", "unallocated GPU % @130", "frag ratio % @90",
                   "failed pods", "seconds")


def test_packing_page_explains_itself_and_reproduces(tmp_path: Path, bundled: tuple[Path, Path],
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = bundled
    monkeypatch.chdir(tmp_path)
    code, _, err = run_main(monkeypatch, capsys, "sim", "packing", "--nodes", nodes, "--pods", pods,
                            "--out", "first run", "--seeds", "2,1", "--placement", "fgd,BestFit", "--inflate", "1.2")
    assert code == 0, err
    out = tmp_path / "first run"
    page = (out / "index.html").read_text()
    for name, text in METRIC_NOTES:
        assert f"<dt>{name}</dt>" in page
        assert ("Lower is better" in text) or ("Lower is faster" in text)
    assert "<b>placement policies</b>: fgd, bestfit" in page
    assert "<b>seeds</b>: 2,1 (2 seeds)" in page
    assert "<b>workload inflated to</b>: 1.2 x the cluster&#x27;s GPU capacity" in page
    assert "['" not in page  # no Python reprs
    assert "[2, 1]" not in page

    command = json.loads((out / "run.json").read_text())["command"]
    expected = ["kubecell", "sim", "packing", "--nodes", str(nodes), "--pods", str(pods), "--placement",
                "fgd,bestfit", "--seeds", "2,1", "--inflate", "1.2", "--jobs", "1", "--out", "first run"]
    assert shlex.split(command) == expected
    assert "--out 'first run'" in command  # shell-quoted
    assert f"<pre>{command.replace(chr(39), '&#x27;')}</pre>" in page
    assert f"Run in <code>{tmp_path}</code>" in page

    words = shlex.split(command)
    words[words.index("--out") + 1] = "second run"
    code, _, err = run_main(monkeypatch, capsys, *words[1:])
    assert code == 0, err

    def figures(directory: str) -> list[dict[str, object]]:
        entries = json.loads((tmp_path / directory / "summary.json").read_text())
        return [{k: v for k, v in entry.items() if "second" not in k} for entry in entries]

    assert figures("second run") == figures("first run")


def test_simulate_table_keeps_whole_headers_when_piped(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["simulate", "--seeds", "1", "--placement", "fgd", "--out",
                                      str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    header = next(line for line in lines if "unallocated" in line)
    for column in PACKING_HEADERS:
        assert column in header, header
    assert "…" not in result.stdout
    assert "lower is better in every column" in " ".join(result.stdout.split())  # the caption (wrapped)
    assert json.loads((tmp_path / "r" / "run.json").read_text())["command"] == (
        f"kubecell simulate --placement fgd --seeds 1 --jobs 1 --out {tmp_path / 'r'}")


def test_dynamic_tables_keep_whole_headers_when_piped(tmp_path: Path, tiny_dynamic: dict[str, Path]) -> None:
    """A long VC name used to squeeze the other columns of an 80-column table into '…'."""
    vc = "speech-recognition-research-team-east"
    tenants = write(tmp_path / "long.yaml", f"virtualClusters:\n  {vc}: {{cells: {{V100M32x8/rack: 1}}}}\n")
    trace = pcs_trace(tmp_path / "long" / f"trace_{vc}.csv", (0, 0.0, 3600.0, 8), (1, 60.0, 7200.0, 16))
    result = CliRunner().invoke(app, ["sim", "dynamic", "--cluster", str(tiny_dynamic["cluster"]), "--tenants",
                                      str(tenants), "--workload", str(trace), "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    assert "…" not in result.stdout
    lines = result.stdout.splitlines()
    assert any(line.split()[:4] == ["tenancy", "util", "%", "arrival"] for line in lines), result.stdout
    assert any(line.split()[:4] == ["VC", "GPUs", "jobs", "delay"] and line.split()[-3:] == ["quota", "hived",
                                                                                            "kubecell"]
               for line in lines), result.stdout
    assert any(line.split()[:3] == [vc, "16", "2"] for line in lines), result.stdout
    page = (tmp_path / "r" / "index.html").read_text()
    assert "<h2>Reproduce</h2>" in page
    assert "--tenancy quota,hived,kubecell --placement kubecell --seed 0" in page
