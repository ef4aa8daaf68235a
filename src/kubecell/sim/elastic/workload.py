"""Sia workload files as the elastic simulator needs them: name, arrival, application, TunedJobs size and batch.

``sim/traces/sia.py`` reads the same files for the dynamic simulator, where a job must become a fixed-length
gang (``JobSpec``, with an assumed amount of work); here a job is an application trained to its target, so only
the columns are shared, read by the same CSV reader (``inputs/csv_table.py``) with ``file:line`` errors.

A directory argument means every ``workload-*.csv`` below it; the trace family of a file is its folder's name
(``philly/workload-1.csv`` is of family ``philly``), so results can be averaged per family as Sia's Table 3 is.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from kubecell.core.errors import InvalidInputError
from kubecell.inputs.csv_table import open_csv
from kubecell.sim.traces.sia import SIA_COLUMNS

WORKLOAD_COLUMNS = (*SIA_COLUMNS, "batch_size")
MAX_SUBMIT_SECONDS = 10 * 365 * 86_400.0
MAX_REPLICAS = 1024
MAX_BATCH_SIZE = 1 << 24


@dataclass(frozen=True, slots=True)
class WorkloadJob:
    """One row of a Sia workload."""

    name: str
    submitted: float
    """Seconds from the start of the workload."""
    application: str
    num_replicas: int
    """GPUs the user asked for (the TunedJobs size rigid schedulers run it at)."""
    batch_size: int
    """The user's global batch size (rigid schedulers keep it)."""
    where: str = ""
    """``file:line`` of its row, for errors found once the application's profiles are read."""


@dataclass(frozen=True, slots=True)
class Workload:
    """One workload file: its jobs in arrival order, its name and trace family."""

    path: Path
    family: str
    name: str
    jobs: tuple[WorkloadJob, ...]

    @property
    def label(self) -> str:
        return f"{self.family}/{self.name}"


def load_workload(path: Path, applications: Collection[str]) -> Workload:
    """Read one workload file; ``applications`` are those the job model has profiles for."""
    jobs: list[WorkloadJob] = []
    seen: dict[str, str] = {}
    with open_csv(path) as table:
        table.require(WORKLOAD_COLUMNS, kind="Sia workload")
        for row in table.rows():
            if row.problem:
                raise row.problem
            name = row.text("name")
            if name in seen:
                raise InvalidInputError(f"job {name!r} appears twice (first at {seen[name]})", location=row.where,
                                        field="name", accepted="unique job names")
            seen[name] = row.where
            application = row.text("application").lower()
            if application not in applications:
                raise InvalidInputError(f"unknown application {application!r}", location=row.where,
                                        field="application", accepted=", ".join(sorted(applications)))
            jobs.append(WorkloadJob(
                name=name,
                submitted=row.number("time", high=MAX_SUBMIT_SECONDS, unit="seconds"),
                application=application,
                num_replicas=row.count("num_replicas", high=MAX_REPLICAS, noun="replicas"),
                batch_size=row.count("batch_size", high=MAX_BATCH_SIZE, noun="examples"),
                where=row.where,
            ))
    if not jobs:
        raise InvalidInputError("has a header but no jobs", location=str(path), accepted="at least one job row")
    jobs.sort(key=lambda job: (job.submitted, job.name))
    return Workload(path, path.parent.name or "workload", path.stem, tuple(jobs))


def _number(path: Path) -> tuple[int, str]:
    match = re.search(r"(\d+)$", path.stem)
    return (int(match.group(1)) if match else 0, path.stem)


def workload_files(path: Path) -> list[Path]:
    """A file, or every ``workload-*.csv`` below a directory (by family folder, then workload number)."""
    if path.is_file():
        return [path]
    if not path.exists():
        raise InvalidInputError("not found", location=str(path), field="workload",
                                accepted="a Sia workload CSV or a directory holding workload-*.csv files")
    files = sorted(path.rglob("workload-*.csv"), key=lambda p: (str(p.parent), _number(p)))
    if not files:
        raise InvalidInputError("no workload-*.csv files below this directory", location=str(path), field="workload",
                                accepted="a directory such as sia-sosp23-workloads/philly/")
    return files


def models_dir_for(path: Path) -> Path | None:
    """The ``models/`` folder of the data set a workload belongs to: the nearest ``models`` directory beside
    the workload or one of its ancestors (``<data>/philly/workload-1.csv`` -> ``<data>/models``)."""
    start = path if path.is_dir() else path.parent
    for folder in (start, *start.parents):
        if (folder / "models").is_dir():
            return folder / "models"
    return None
