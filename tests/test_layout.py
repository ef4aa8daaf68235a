"""The package layout is the architecture: these are its rules, checked on the import graph of ``src/kubecell``.

Layers, from the bottom: ``core`` (pure: model, book, placement, tenancy, engine), then ``inputs`` (readers of
hand-written files) and ``testing`` (the scenario format), then ``kube`` (the Kubernetes adapter no driver
owns), then the drivers ``sim``, ``scheduler``, ``node``, ``elastic`` (the ElasticJob controller) and ``profiler``
(the job history), then ``testbed`` (test infrastructure), then ``cli`` (the composition roots). A package
imports only packages of lower layers, except that a driver never imports another driver; nothing but ``cli``
imports ``testbed``; and no module imports itself back through others (no circles), imports made only for type
checking included.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "kubecell"

LAYERS = {"core": 0, "inputs": 1, "testing": 1, "kube": 2, "sim": 3, "scheduler": 3, "node": 3, "elastic": 3,
          "profiler": 3, "testbed": 4, "cli": 5}
DRIVERS = {"sim", "scheduler", "node", "elastic", "profiler"}
TOP_LEVEL_MODULES = {"__init__", "__main__", "cache"}
"""Modules directly under ``kubecell`` (not a package): ``cache`` is the per-machine cache root, owned by none."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> Iterator[str]:
    """Every ``kubecell`` module ``path`` imports, at any depth of its tree (type-checking imports included)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else module_name(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("kubecell"):
                    yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                base = ".".join(anchor[:len(anchor) - node.level + 1] + ([base] if base else []))
            if base.startswith("kubecell"):
                known = {module_name(p) for p in SOURCES}
                for alias in node.names:
                    candidate = f"{base}.{alias.name}"
                    yield candidate if candidate in known else base


SOURCES = sorted(SRC.rglob("*.py"))


def graph() -> dict[str, set[str]]:
    known = {module_name(path) for path in SOURCES}
    edges: dict[str, set[str]] = {}
    for path in SOURCES:
        name = module_name(path)
        targets = set()
        for target in imports(path):
            while target not in known and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in known and target != name:
                targets.add(target)
        edges[name] = targets
    return edges


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_package_has_a_layer() -> None:
    packages = {package_of(module_name(path)) for path in SOURCES} - {""}
    stray = sorted(p for p in packages if p not in LAYERS and p not in TOP_LEVEL_MODULES)
    assert not stray, f"packages outside the layout: {stray}"


def test_no_package_imports_upward_or_a_peer_driver() -> None:
    wrong = []
    for source, targets in graph().items():
        mine = package_of(source)
        for target in targets:
            theirs = package_of(target)
            if theirs == mine or mine in TOP_LEVEL_MODULES or theirs in TOP_LEVEL_MODULES:
                continue
            if theirs == "testbed" and mine != "cli":
                wrong.append(f"{source} -> {target} (only the CLI, tests and benches use the testbed)")
            elif LAYERS.get(theirs, 0) > LAYERS.get(mine, 0):
                wrong.append(f"{source} -> {target} (upward)")
            elif mine in DRIVERS and theirs in DRIVERS:
                wrong.append(f"{source} -> {target} (a driver importing another)")
    assert not wrong, "\n".join(sorted(wrong))


def test_no_circles() -> None:
    edges = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    assert not circles, "modules importing each other: " + "; ".join(" <-> ".join(c) for c in circles)


@pytest.mark.parametrize("path", [p for p in SOURCES if p.stat().st_size], ids=lambda p: str(p.relative_to(SRC)))
def test_the_core_imports_no_driver_and_no_io_library(path: Path) -> None:
    if package_of(module_name(path)) != "core":
        return
    foreign = [target for target in imports(path) if package_of(target) not in ("core", "")]
    assert not foreign, f"{path.relative_to(SRC)} imports {foreign}"
