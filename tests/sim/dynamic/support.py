"""Small clusters, tenants and traces shared by the dynamic-simulator tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import PCS_HEADER as PCS_HEADER
from tests.support import SIA_HEADER as SIA_HEADER
from tests.support import TINY_CLUSTER as TINY_CLUSTER

Writer = Callable[[str, str], Path]
"""The ``write`` fixture: write text to a file under tmp_path and return its path."""

REPO = Path(__file__).resolve().parents[3]
PHILLY = REPO / ".." / "shared" / "data" / "philly" / "pcs_osdi24_per_vc_traces"



# a: one rack (16 GPUs); b: one node (8); c: one node (8)
TINY_TENANTS = """\
virtualClusters:
  a: {cells: {V100M32x8/rack: 1}}
  b: {cells: {V100M32x8/node: 1}}
  c: {cells: {V100M32x8/node: 1}}
"""


def pcs_rows(*rows: tuple[int, float, float, int]) -> str:
    """PCS file text from (app_id, submit_time, service GPU-seconds, GPUs) tuples."""
    lines = [PCS_HEADER]
    previous = 0.0
    for app, submit, service, gpus in rows:
        lines.append(f"{app},{submit},{service},{gpus},{submit - previous},ResNet")
        previous = submit
    return "\n".join(lines) + "\n"


def philly_trace(vc: str) -> Path:
    """A PCS per-VC file of the shared data set, or skip naming what is absent."""
    if not PHILLY.is_dir():
        pytest.skip(f"Philly PCS trace folder absent: {PHILLY}")
    path = PHILLY / f"trace_{vc}.csv"
    if not path.is_file():
        pytest.skip(f"Philly PCS trace absent: {path}")
    return path
