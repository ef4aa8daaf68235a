"""Helpers of the CLI tests: run ``kubecell`` in-process the way a user runs it, and small input files.

The inputs are written here rather than imported from the simulator tests so these tests keep their own
fixtures wherever those move.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kubecell.cli.main import main
from tests.support import NODE_HEADER as NODE_HEADER
from tests.support import PCS_HEADER as PCS_HEADER
from tests.support import POD_HEADER as POD_HEADER
from tests.support import TINY_CLUSTER as TINY_CLUSTER

TINY_TENANTS = """\
virtualClusters:
  a: {cells: {V100M32x8/rack: 1}}
  b: {cells: {V100M32x8/node: 1}}
"""


def write(path: Path, text: str) -> Path:
    """Write ``text`` exactly (parents created) and return the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode("utf-8"))
    return path


def pcs_trace(path: Path, *rows: tuple[int, float, float, int]) -> Path:
    """A Philly PCS per-VC file from (app_id, submit seconds, service GPU-seconds, GPUs) rows."""
    lines = [PCS_HEADER]
    previous = 0.0
    for app, submit, service, gpus in rows:
        lines.append(f"{app},{submit},{service},{gpus},{submit - previous},ResNet")
        previous = submit
    return write(path, "\n".join(lines) + "\n")


def run_main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str | Path,
             ) -> tuple[int, str, str]:
    """Run the installed entry point (which turns a KubecellError into one line and exit status 2);
    returns (status, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["kubecell", *map(str, argv)])
    with pytest.raises(SystemExit) as info:
        main()
    captured = capsys.readouterr()
    code = info.value.code
    return (code if isinstance(code, int) else 0), captured.out, captured.err


def assert_one_line_error(code: int, err: str, *mentions: str) -> str:
    """Status 2, exactly one line on stderr starting with 'error: ', no traceback; returns the line."""
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    for mention in mentions:
        assert mention in lines[0], lines[0]
    return lines[0]
