"""The bundled examples every command falls back on, found inside the installed package."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def example_paths() -> tuple[Path, Path]:
    """The bundled example node and pod lists of the packing experiment."""
    base = resources.files("kubecell.sim.examples")
    return Path(str(base / "nodes.csv")), Path(str(base / "pods.csv"))


def philly_example_paths() -> tuple[Path, Path]:
    """The bundled Philly-like cluster and its tenant configuration for the dynamic simulator (the tenants
    guarantee cells of that cluster only)."""
    base = resources.files("kubecell.sim.examples") / "philly"
    return Path(str(base / "cluster.yaml")), Path(str(base / "tenants.yaml"))
