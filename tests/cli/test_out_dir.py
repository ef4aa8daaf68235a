"""Issue 11, case 1: an --out that cannot be written stops every writing command before anything runs.

Before, the whole grid or dynamic run went ahead and died at the end with a traceback, results lost.
Each case here replaces the simulation with a function that fails the test if it is ever called.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from kubecell.cli import packing as packing_cli
from kubecell.cli.output import check_out_dir, prepare_out_dir
from kubecell.core.errors import InvalidInputError
from kubecell.sim.dynamic import runner as dynamic_runner
from tests.cli.support import assert_one_line_error, run_main, write


@pytest.fixture(autouse=True)
def no_simulation(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a simulation started although --out cannot be written")

    monkeypatch.setattr(packing_cli, "run_grid", refuse)
    monkeypatch.setattr(dynamic_runner, "run_dynamic", refuse)


def commands(out: Path, bundled: tuple[Path, Path], tiny: dict[str, Path]) -> dict[str, list[str | Path]]:
    nodes, pods = bundled
    return {
        "sim packing": ["sim", "packing", "--nodes", nodes, "--pods", pods, "--seeds", "1", "--placement", "fgd",
                        "--out", out],
        "simulate": ["simulate", "--seeds", "1", "--placement", "fgd", "--out", out],
        "sim dynamic": ["sim", "dynamic", "--cluster", tiny["cluster"], "--tenants", tiny["tenants"],
                        "--workload", tiny["a"], "--out", out],
    }


@pytest.mark.parametrize("command", ["sim packing", "simulate", "sim dynamic"])
def test_out_that_is_an_existing_file(command: str, tmp_path: Path, bundled: tuple[Path, Path],
                                      tiny_dynamic: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = write(tmp_path / "results.txt", "keep me\n")
    code, _, err = run_main(monkeypatch, capsys, *commands(out, bundled, tiny_dynamic)[command])
    assert_one_line_error(code, err, "field 'out'", f"{out} is an existing file, not a directory",
                          "a directory that exists or can be created")
    assert out.read_text() == "keep me\n"


@pytest.mark.parametrize("command", ["sim packing", "simulate", "sim dynamic"])
def test_out_under_a_file(command: str, tmp_path: Path, bundled: tuple[Path, Path], tiny_dynamic: dict[str, Path],
                          monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = write(tmp_path / "file", "")
    out = blocker / "sub" / "report"
    code, _, err = run_main(monkeypatch, capsys, *commands(out, bundled, tiny_dynamic)[command])
    assert_one_line_error(code, err, f"{out} cannot be created: {blocker} is a file, not a directory")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="permission bits do not bind root")
def test_out_in_a_read_only_directory(tmp_path: Path, bundled: tuple[Path, Path], tiny_dynamic: dict[str, Path],
                                      monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        for argv in commands(locked / "report", bundled, tiny_dynamic).values():
            code, _, err = run_main(monkeypatch, capsys, *argv)
            assert_one_line_error(code, err, "cannot be created: no permission to write in", str(locked))
    finally:
        locked.chmod(0o700)


def test_unwritable_directory_is_found_by_writing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Permission bits do not show everything (read-only mounts, quotas, root on NFS): the check writes."""

    def read_only(*args: object, **kwargs: object) -> tuple[int, str]:
        raise PermissionError(13, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    with pytest.raises(InvalidInputError, match=r"cannot write in .*: Read-only file system") as info:
        prepare_out_dir(tmp_path / "out")
    assert info.value.field == "out"


def test_a_good_out_is_created_only_once_inputs_are_valid(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b"
    check_out_dir(out)
    assert not out.exists()  # the cheap check creates nothing: an input error must leave no directory
    prepare_out_dir(out)
    assert out.is_dir()
    assert list(out.iterdir()) == []  # the scratch file is gone
