"""Issue 11, cases 2, 3 and 4: packing inputs that used to hang, run out of memory or print ``nan ± nan``.

- ``--inflate inf`` appended pods forever; ``0``, negative and ``nan`` gave a table of nan.
- A pod list without a GPU pod measured nothing and printed ``nan ± nan``; a run that stops below a reported
  point (small inflation) printed nan for it.
- ``--seeds 0-99999999999`` died of MemoryError; ``5-3`` did not say what was wrong with it.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from kubecell.cli import packing as packing_cli
from kubecell.core.errors import InvalidInputError
from kubecell.sim.packing.runner import MAX_INFLATE, MAX_SEEDS, check_inflate, format_seeds, parse_seeds
from tests.cli.support import NODE_HEADER, POD_HEADER, assert_one_line_error, run_main, write


@pytest.fixture
def no_simulation(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a simulation started although the options are invalid")

    monkeypatch.setattr(packing_cli, "run_grid", refuse)


def packing(bundled: tuple[Path, Path], out: Path, *extra: str) -> list[str | Path]:
    nodes, pods = bundled
    return ["sim", "packing", "--nodes", nodes, "--pods", pods, "--out", out, "--placement", "fgd", *extra]


@pytest.mark.usefixtures("no_simulation")
@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("inf", "inflate inf would append pods forever"),
        ("nan", "inflate nan is not a number"),
        ("0", "inflate 0 leaves no GPU load to measure"),
        ("-1", "inflate -1 leaves no GPU load to measure"),
        ("13", "inflate 13 asks for 1,300 % of the cluster's GPU capacity"),
    ],
)
def test_inflate_out_of_range(value: str, says: str, tmp_path: Path, bundled: tuple[Path, Path],
                              monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    started = time.perf_counter()
    code, _, err = run_main(monkeypatch, capsys, *packing(bundled, out, "--seeds", "1", "--inflate", value))
    assert_one_line_error(code, err, "field 'inflate'", says, f"in (0, {MAX_INFLATE:g}]", "1.3")
    assert time.perf_counter() - started < 5
    assert not out.exists()


def test_inflate_range_edges() -> None:
    assert check_inflate(MAX_INFLATE) == MAX_INFLATE
    assert check_inflate(0.01) == 0.01
    for bad in (float("-inf"), MAX_INFLATE + 1e-9, 0.0):
        with pytest.raises(InvalidInputError):
            check_inflate(bad)


@pytest.mark.usefixtures("no_simulation")
@pytest.mark.parametrize(
    ("seeds", "says"),
    [
        ("0-99999999999", "seed range 0-99999999999 holds 100,000,000,000 seeds, more than the 1000"),
        ("5-3", "range goes down: 5-3; write low-high, e.g. 3-5"),
        ("0-999,1000-1500", "hold more than the 1000 seeds"),
    ],
)
def test_seed_ranges(seeds: str, says: str, tmp_path: Path, bundled: tuple[Path, Path],
                     monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(monkeypatch, capsys, *packing(bundled, tmp_path / "out", "--seeds", seeds))
    assert_one_line_error(code, err, "field 'seeds'", says, "'42-51'")


def test_parse_seeds_sizes_ranges_before_expanding() -> None:
    with pytest.raises(InvalidInputError, match="more than the 1000"):
        parse_seeds(f"0-{10**17}")  # would need more memory than any machine has if it were expanded first
    with pytest.raises(InvalidInputError, match="cannot read seeds"):
        parse_seeds(f"0-{10**30}")  # past 18 digits a seed is not read at all
    assert len(parse_seeds(f"5-{5 + MAX_SEEDS - 1}")) == MAX_SEEDS
    assert parse_seeds("0-999,500-999") == list(range(1000))  # overlaps count once


@pytest.mark.parametrize("text", ["42-51", "7", "3,1,2", "1-3,7,9-10", "10,9"])
def test_format_seeds_is_the_inverse_of_parse_seeds(text: str) -> None:
    seeds = parse_seeds(text)
    assert parse_seeds(format_seeds(seeds)) == seeds
    assert format_seeds(parse_seeds("42-51")) == "42-51"


@pytest.mark.usefixtures("no_simulation")
def test_pod_list_without_gpu_pods_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    nodes = write(tmp_path / "nodes.csv", f"{NODE_HEADER}\nn1,32000,131072,2,T4\n")
    pods = write(tmp_path / "pods.csv", f"{POD_HEADER}\nc1,4000,1024,0,0,\nc2,2000,512,0,0,\n")
    code, _, err = run_main(monkeypatch, capsys, "sim", "packing", "--nodes", nodes, "--pods", pods,
                            "--out", tmp_path / "out", "--seeds", "1")
    line = assert_one_line_error(code, err, str(pods), "field 'num_gpu'",
                                 "the pod list has 2 pod(s) and none asks for a GPU",
                                 "measures GPU allocation and fragmentation")
    assert not re.search(r"\bnan\b", line)
    assert not (tmp_path / "out").exists()


def test_undefined_figures_say_why(tmp_path: Path, bundled: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Inflating to 0.5 stops arrivals at ~50 %: the figures at 90, 100 and 130 % are n/a, with the reason."""
    out = tmp_path / "out"
    code, stdout, err = run_main(monkeypatch, capsys, *packing(bundled, out, "--seeds", "1,2", "--inflate", "0.5"))
    assert code == 0, err
    assert not re.search(r"\bnan\b", stdout)
    row = next(line for line in stdout.splitlines() if line.startswith("│ fgd"))
    assert row.count("n/a") == 3
    notes = [line for line in stdout.splitlines() if line.startswith("n/a: ")]
    assert any("arrivals reached only 50 % of GPU capacity, so nothing was measured at 130 %" in n for n in notes)
    assert any("inflate the workload to at least 1.00" in n for n in notes)

    (summary,) = json.loads((out / "summary.json").read_text())
    assert summary["unallocated_gpu_pct_at_130"] == {"mean": None, "sd": None}
    assert summary["arrived_gpu_pct_reached"] == pytest.approx(50, abs=1.5)
    missing = summary["not_measured"]
    assert set(missing) >= {"unallocated_gpu_pct_at_100", "unallocated_gpu_pct_at_130", "frag_ratio_pct_at.90",
                            "allocated_gpu_pct_at.80"}
    assert "allocated_gpu_pct_at.50" not in missing
    page = (out / "index.html").read_text()
    assert ">nan" not in page
    assert "n/a: not measured in this run" in page
    assert "arrivals reached only 50 %" in page
