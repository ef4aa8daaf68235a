"""Issue 12: progress with an estimate of the time left, in a terminal and in a log.

Before, a run printed nothing until its end when stderr was not a terminal, and the dynamic run's bar named
the simulation that had just finished instead of the one running.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console

from kubecell.cli.progress import RunProgress, duration
from tests.cli.support import run_main


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def log_console() -> tuple[Console, io.StringIO]:
    stream = io.StringIO()
    return Console(file=stream, width=200, force_terminal=False), stream


def test_log_lines_are_rate_limited_with_eta_and_a_final_line() -> None:
    console, stream = log_console()
    clock = Clock()
    with RunProgress("packing", 10, "runs", console=console, interval=10.0, clock=clock) as progress:
        for step in range(10):
            clock.now += 4.0
            progress.done(f"fgd seed {step}")
    lines = stream.getvalue().splitlines()
    # steps end at 4, 8, ... 40 s: a line once 10 s have passed since the last one (12, 24, 36), then the final
    assert lines == [
        "packing: 3/10 runs done (last: fgd seed 2); 12 s elapsed, about 28 s left",
        "packing: 6/10 runs done (last: fgd seed 5); 24 s elapsed, about 16 s left",
        "packing: 9/10 runs done (last: fgd seed 8); 36 s elapsed, about 4 s left",
        "packing: 10/10 runs done in 40 s",
    ]


def test_a_due_line_names_the_step_that_starts() -> None:
    console, stream = log_console()
    clock = Clock()
    with RunProgress("simulating", 3, "simulations", console=console, announces_steps=True, interval=0.0,
                     clock=clock) as progress:
        for label in ("quota", "hived", "private baseline of VC a"):
            progress.start(label)
            clock.now += 90.0
            progress.done(label)
    assert stream.getvalue().splitlines() == [
        "simulating: 1/3 simulations done (last: quota); running hived; 1 min 30 s elapsed, about 3 min 00 s left",
        "simulating: 2/3 simulations done (last: hived); running private baseline of VC a; 3 min 00 s elapsed, "
        "about 1 min 30 s left",
        "simulating: 3/3 simulations done in 4 min 30 s",
    ]


def test_terminal_bar_names_the_running_step_and_the_time_left() -> None:
    stream = io.StringIO()
    console = Console(file=stream, width=160, force_terminal=True, color_system=None)
    with RunProgress("simulating", 3, "simulations", console=console, announces_steps=True) as progress:
        progress.start("quota")
        progress.done("quota")
        progress.start("hived")
        screen = stream.getvalue()
    assert "running quota (1/3)" in screen
    assert "running hived (2/3)" in screen
    assert "1/3" in screen
    assert re.search(r"left (-:--:--|\d+:\d\d:\d\d)", screen), screen  # rich's TimeRemainingColumn


def test_duration_words() -> None:
    assert [duration(s) for s in (0.4, 59, 61, 3599, 3600 * 2 + 240)] == [
        "0 s", "59 s", "1 min 01 s", "59 min 59 s", "2 h 04 min"]


@pytest.mark.usefixtures("every_progress_line")
def test_dynamic_progress_in_a_log_names_the_running_simulation(tmp_path: Path, tiny_dynamic: dict[str, Path],
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(monkeypatch, capsys, "sim", "dynamic", "--cluster", tiny_dynamic["cluster"],
                            "--tenants", tiny_dynamic["tenants"], "--workload", tiny_dynamic["a"], "--workload",
                            tiny_dynamic["b"], "--tenancy", "quota,hived", "--out", tmp_path / "out")
    assert code == 0, err
    lines = err.splitlines()
    assert lines[0].startswith("simulating: 1/4 simulations done (last: quota); running hived; ")
    assert lines[1].startswith("simulating: 2/4 simulations done (last: hived); running private baseline of VC a; ")
    assert lines[2].startswith("simulating: 3/4 simulations done (last: private baseline of VC a); "
                               "running private baseline of VC b; ")
    assert re.fullmatch(r"simulating: 4/4 simulations done in \d+ s", lines[3])
    assert all("elapsed, about" in line for line in lines[:3])


@pytest.mark.usefixtures("every_progress_line")
def test_packing_progress_in_a_log(tmp_path: Path, bundled: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = bundled
    code, _, err = run_main(monkeypatch, capsys, "sim", "packing", "--nodes", nodes, "--pods", pods, "--out",
                            tmp_path / "out", "--placement", "fgd", "--seeds", "1-2")
    assert code == 0, err
    lines = err.splitlines()
    assert lines[0].startswith("packing: 1/2 runs done (last: fgd seed 1); ")
    assert "elapsed, about" in lines[0]
    assert lines[0].endswith("left")
    assert re.fullmatch(r"packing: 2/2 runs done in \d+ s", lines[1])
