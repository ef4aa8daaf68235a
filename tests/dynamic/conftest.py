"""Fixtures of the dynamic-simulator tests: small files written into tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.dynamic.support import Writer


@pytest.fixture
def write(tmp_path: Path) -> Writer:
    """Write ``text`` to ``tmp_path/name`` (parents created), exactly as given."""

    def writer(name: str, text: str) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode("utf-8"))
        return path

    return writer
