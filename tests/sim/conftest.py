"""Fixtures shared by the simulator tests: the bundled example and CSV writing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kubecell.cli.main import example_paths
from kubecell.sim.packing.runner import PackingInputs, load_inputs
from tests.sim.dynamic.support import Writer


@pytest.fixture
def write_csv(tmp_path: Path) -> Callable[[str, str], Path]:
    """Write ``text`` to ``tmp_path/name`` (text is written exactly, no newline translation)."""

    def write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.write_bytes(text.encode("utf-8"))
        return path

    return write


@pytest.fixture(scope="session")
def example_files() -> tuple[Path, Path]:
    return example_paths()


@pytest.fixture(scope="session")
def example_inputs(example_files: tuple[Path, Path]) -> PackingInputs:
    nodes, pods = example_files
    return load_inputs(str(nodes), str(pods))


@pytest.fixture
def write(tmp_path: Path) -> Writer:
    """Write ``text`` to ``tmp_path/name`` (parents created), exactly as given."""

    def writer(name: str, text: str) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode("utf-8"))
        return path

    return writer
