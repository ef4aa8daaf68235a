"""Constants and helpers shared by the simulator tests (fixtures live in conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import NODE_HEADER as NODE_HEADER
from tests.support import POD_HEADER as POD_HEADER

REPO = Path(__file__).resolve().parents[2]
OPENB = REPO / ".." / "shared" / "data" / "alibaba-gpu-v2023-openb"
OPENB_CSV = OPENB / "csv"



def openb_file(*parts: str) -> Path:
    """A file of the shared openb data set, or skip the test with a message naming what is absent."""
    path = OPENB.joinpath(*parts)
    if not OPENB_CSV.is_dir():
        pytest.skip(f"openb trace folder absent: {OPENB_CSV}")
    if not path.is_file():
        pytest.skip(f"openb file absent: {path}")
    return path
