"""Small clusters, tenants and traces shared by the dynamic-simulator tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

Writer = Callable[[str, str], Path]
"""The ``write`` fixture: write text to a file under tmp_path and return its path."""

REPO = Path(__file__).resolve().parents[3]
PHILLY = REPO / ".." / "shared" / "data" / "philly" / "pcs_osdi24_per_vc_traces"

PCS_HEADER = "app_id,submit_time,service,num_jobs,sleep_time,model_name"
SIA_HEADER = "name,time,application,num_replicas,batch_size"

# 2 racks x 2 nodes x 8 V100 GPUs = 32 GPUs
TINY_CLUSTER = """\
nodeGroups:
  - count: 4
    namePrefix: n-
    gpu: {model: V100M32, count: 8}
    cpuMilli: 64000
    memoryMiB: 524288
    nvlinkGroups: [[0, 1, 2, 3], [4, 5, 6, 7]]
    rackSize: 2
"""

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
