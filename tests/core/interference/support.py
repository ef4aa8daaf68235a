"""Shared helpers of the interference tests: synthetic profiles, and the Lucid tables (or a skip)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubecell.core.interference import JobKey, SoloProfile
from tests.sim.support import REPO

COLOCATION = REPO / ".." / "shared" / "data" / "colocation"


def colocation_file(name: str) -> Path:
    """A file of the shared co-location data set, or skip the test with a message naming what is absent."""
    path = COLOCATION / name
    if not COLOCATION.is_dir():
        pytest.skip(f"co-location data set absent: {COLOCATION}")
    if not path.is_file():
        pytest.skip(f"co-location data file absent: {path}")
    return path


def job(name: str, gpu_util: float, gmem_util: float = 0.0, memory_mib: float = 1000.0) -> SoloProfile:
    return SoloProfile(JobKey(name), gpu_util, gmem_util, memory_mib)
