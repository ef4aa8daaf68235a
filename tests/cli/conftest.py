"""Fixtures of the CLI tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubecell.cli import progress
from kubecell.cli.examples import example_paths
from tests.cli.support import TINY_CLUSTER, TINY_TENANTS, pcs_trace, write


@pytest.fixture
def bundled() -> tuple[Path, Path]:
    """The bundled example node and pod lists."""
    return example_paths()


@pytest.fixture
def tiny_dynamic(tmp_path: Path) -> dict[str, Path]:
    """A 32-GPU cluster, two VCs and a trace of three jobs for each."""
    hour = 3600.0
    return {
        "cluster": write(tmp_path / "cluster.yaml", TINY_CLUSTER),
        "tenants": write(tmp_path / "tenants.yaml", TINY_TENANTS),
        "a": pcs_trace(tmp_path / "philly" / "trace_a.csv", (0, 0.0, 8 * hour, 8), (1, 600.0, 16 * hour, 16),
                       (2, 700.0, 4 * hour, 4)),
        "b": pcs_trace(tmp_path / "philly" / "trace_b.csv", (0, 0.0, 8 * hour, 8), (1, 10.0, 8 * hour, 8),
                       (2, 30.0, 2 * hour, 2)),
    }


@pytest.fixture
def every_progress_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Progress in a log prints a line per step (the default waits seconds between lines)."""
    monkeypatch.setattr(progress, "LOG_INTERVAL_SECONDS", 0.0)
