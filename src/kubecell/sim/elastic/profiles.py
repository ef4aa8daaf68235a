"""The measured inputs of the Pollux/Sia job model, read from the Sia artifact's ``models/<app>/`` tables.

One loader per file format, each failing with ``file:line``, the column and what would be accepted (the
shared CSV reader, ``inputs/csv_table.py``), so a hand-edited profile is fixed without a traceback:

- ``placements-<gpu>.csv`` (``placement,local_bsz,step_time,sync_time``, columns in any order): seconds per
  iteration of one placement (digit string of replicas per node, ``"24"`` = 2 + 4 GPUs on two nodes) at a
  per-replica batch size;
- ``scalability-<gpu>.csv`` (``num_nodes,num_replicas,local_bsz,step_time,sync_time``): the same for larger
  jobs, keyed by node and replica counts only;
- ``validation-<B>.csv`` (``progress,iteration,metric,grad_sqr,grad_var``): training at global batch ``B``,
  one row per epoch: the progress reached at the epoch's end and the gradient statistics during it;
- ``seed-1gpu/<app>.csv`` (``gpu_type,local_bsz,placement,step_time,sync_time``): AdaptDL's 1-GPU profiles,
  which an online goodput model starts from.

Rows with the same key are averaged (Sia's ``dgx-ext`` scalability tables repeat each placement's rows).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from kubecell.core.errors import InvalidInputError
from kubecell.inputs.csv_table import Row, open_csv

FloatArray = npt.NDArray[np.float64]

PLACEMENT_COLUMNS = ("placement", "local_bsz", "step_time", "sync_time")
SCALABILITY_COLUMNS = ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time")
VALIDATION_COLUMNS = ("progress", "iteration", "metric", "grad_sqr", "grad_var")
SEED_COLUMNS = ("gpu_type", "local_bsz", "placement", "step_time", "sync_time")

MAX_LOCAL_BSZ = 1 << 20
MAX_NODES = 1024
MAX_REPLICAS = 1 << 16
PLACEMENT_PATTERN = re.compile(r"[1-9]+")


@dataclass(frozen=True, slots=True, eq=False)
class Curve:
    """Seconds per iteration (and of it, synchronising) against the per-replica batch size, at one placement
    or one (nodes, replicas) point; sorted by batch size, one entry per batch size."""

    local_bsz: FloatArray
    step_time: FloatArray
    sync_time: FloatArray

    @property
    def min_bsz(self) -> int:
        return int(self.local_bsz[0])

    @property
    def max_bsz(self) -> int:
        return int(self.local_bsz[-1])

    def at(self, local_bsz: float) -> tuple[float, float]:
        """Step and sync time at ``local_bsz``, linear between measured batch sizes (Sia: ``interp1d``); the
        caller keeps ``local_bsz`` inside ``min_bsz..max_bsz``."""
        return (float(np.interp(local_bsz, self.local_bsz, self.step_time)),
                float(np.interp(local_bsz, self.local_bsz, self.sync_time)))


@dataclass(frozen=True, slots=True, eq=False)
class ValidationCurve:
    """Training at one global batch size, one entry per epoch."""

    batch_size: int
    progress: FloatArray
    """Progress reached at the end of each epoch (Pollux's units: iterations at the initial batch size)."""
    iteration: FloatArray
    grad_sqr: FloatArray
    grad_var: FloatArray

    @property
    def epochs(self) -> int:
        return len(self.progress)


@dataclass(frozen=True, slots=True)
class SeedRow:
    """One row of the 1-GPU seed profiles."""

    gpu_type: str
    local_bsz: int
    step_time: float
    sync_time: float


@dataclass(frozen=True, slots=True)
class GpuTables:
    """The throughput measurements of one application on one GPU type."""

    placements: Mapping[str, Curve]
    scalability: Mapping[tuple[int, int], Curve]


@dataclass(frozen=True, slots=True)
class ApplicationProfile:
    """Everything measured about one application: tables per GPU profile, validation curves, seed rows."""

    name: str
    tables: Mapping[str, GpuTables]
    """By profile suffix (``aws``, ``rtx``, ``dgx-ext``)."""
    validation: tuple[ValidationCurve, ...]
    """Sorted by batch size."""
    seeds: tuple[SeedRow, ...]


Key = TypeVar("Key", str, tuple[int, int])


def _curves(points: Mapping[Key, Mapping[int, list[tuple[float, float]]]]) -> dict[Key, Curve]:
    """One curve per key: batch sizes sorted, rows of the same key and batch size averaged."""
    curves: dict[Key, Curve] = {}
    for key, by_bsz in points.items():
        sizes = sorted(by_bsz)
        curves[key] = Curve(np.array(sizes, dtype=np.float64),
                            np.array([np.mean([s for s, _ in by_bsz[b]]) for b in sizes], dtype=np.float64),
                            np.array([np.mean([y for _, y in by_bsz[b]]) for b in sizes], dtype=np.float64))
    return curves


def _times(row: Row) -> tuple[float, float]:
    step = row.number("step_time", positive=True, unit="seconds")
    sync = row.number("sync_time", unit="seconds")
    if sync > step:
        raise InvalidInputError(f"sync_time {sync:g} is longer than step_time {step:g}", location=row.where,
                                field="sync_time", accepted="0 <= sync_time <= step_time (sync is part of the step)")
    return step, sync


def _placement(row: Row) -> str:
    text = row.text("placement")
    if text.endswith(".0"):  # written by pandas as a float
        text = text[:-2]
    if not PLACEMENT_PATTERN.fullmatch(text):
        raise InvalidInputError(f"{text!r} is not a placement", location=row.where, field="placement",
                                accepted="a digit string of replicas per node, each 1-9 (e.g. 24 = 2 + 4 GPUs)")
    return text


def _rows(path: Path, columns: tuple[str, ...], kind: str) -> Iterable[Row]:
    with open_csv(path) as table:
        table.require(columns, kind=kind)
        count = 0
        for row in table.rows():
            if row.problem:
                raise row.problem
            count += 1
            yield row
        if not count:
            raise InvalidInputError("has a header but no rows", location=str(path), accepted=f"at least one {kind} row")


def load_placements(path: Path) -> dict[str, Curve]:
    """``placements-<gpu>.csv``: a curve per placement digit string."""
    points: dict[str, dict[int, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for row in _rows(path, PLACEMENT_COLUMNS, "placement profile"):
        placement = _placement(row)
        points[placement][row.count("local_bsz", high=MAX_LOCAL_BSZ, noun="examples")].append(_times(row))
    return _curves(points)


def load_scalability(path: Path) -> dict[tuple[int, int], Curve]:
    """``scalability-<gpu>.csv``: a curve per (nodes, replicas)."""
    points: dict[tuple[int, int], dict[int, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for row in _rows(path, SCALABILITY_COLUMNS, "scalability profile"):
        nodes = row.count("num_nodes", high=MAX_NODES, noun="nodes")
        replicas = row.count("num_replicas", high=MAX_REPLICAS, noun="replicas")
        if replicas < nodes:
            raise InvalidInputError(f"{replicas} replicas on {nodes} nodes", location=row.where, field="num_replicas",
                                    accepted="at least one replica per node")
        points[(nodes, replicas)][row.count("local_bsz", high=MAX_LOCAL_BSZ, noun="examples")].append(_times(row))
    return _curves(points)


def validation_batch_size(path: Path) -> int:
    """The global batch size in a validation file's name (``validation-128.csv`` -> 128)."""
    match = re.fullmatch(r"validation-(\d+)\.csv", path.name)
    if not match or int(match.group(1)) <= 0:
        raise InvalidInputError("cannot read the batch size from the file name", location=str(path),
                                accepted="validation-<global batch size>.csv, e.g. validation-128.csv")
    return int(match.group(1))


def load_validation(path: Path) -> ValidationCurve:
    """``validation-<B>.csv``: one row per epoch; progress must not go backwards."""
    batch = validation_batch_size(path)
    progress: list[float] = []
    iteration: list[float] = []
    sqr: list[float] = []
    var: list[float] = []
    for row in _rows(path, VALIDATION_COLUMNS, "validation curve"):
        value = row.number("progress", positive=True)
        if progress and value < progress[-1]:
            raise InvalidInputError(f"progress {value:g} is below the previous epoch's {progress[-1]:g}",
                                    location=row.where, field="progress", accepted="non-decreasing progress per epoch")
        progress.append(value)
        iteration.append(row.number("iteration"))
        sqr.append(row.number("grad_sqr"))
        var.append(row.number("grad_var"))
    return ValidationCurve(batch, np.array(progress), np.array(iteration), np.array(sqr), np.array(var))


def load_seed(path: Path) -> tuple[SeedRow, ...]:
    """``seed-1gpu/<app>.csv``: 1-GPU measurements per GPU type (only placement ``1`` is accepted)."""
    rows: list[SeedRow] = []
    for row in _rows(path, SEED_COLUMNS, "seed profile"):
        if _placement(row) != "1":
            raise InvalidInputError(f"placement {row.text('placement')!r} in a 1-GPU seed profile", location=row.where,
                                    field="placement", accepted="1")
        step, sync = _times(row)
        rows.append(SeedRow(row.text("gpu_type").lower(), row.count("local_bsz", high=MAX_LOCAL_BSZ, noun="examples"),
                            step, sync))
    return tuple(rows)


def _file(path: Path) -> Path:
    if not path.is_file():
        raise InvalidInputError("profile file not found", location=str(path),
                                accepted="the Sia artifact's models/<app>/ tables (see docs/elastic.md)")
    return path


def load_application(models: Path, name: str, profiles: Iterable[str]) -> ApplicationProfile:
    """Read ``models/<name>/`` for the given GPU profiles, plus ``models/seed-1gpu/<name>.csv`` if present."""
    folder = models / name
    if not folder.is_dir():
        raise InvalidInputError(f"no profiles for application {name!r}", location=str(folder),
                                accepted="a folder models/<application>/ with placements-, scalability- and "
                                "validation- tables")
    tables = {profile: GpuTables(load_placements(_file(folder / f"placements-{profile}.csv")),
                                 load_scalability(_file(folder / f"scalability-{profile}.csv")))
              for profile in profiles}
    curves = sorted((load_validation(path) for path in folder.glob("validation-*.csv")), key=lambda c: c.batch_size)
    if not curves:
        raise InvalidInputError("no validation curves", location=str(folder), accepted="validation-<B>.csv files")
    seed = models / "seed-1gpu" / f"{name}.csv"
    return ApplicationProfile(name, tables, tuple(curves), load_seed(seed) if seed.is_file() else ())
