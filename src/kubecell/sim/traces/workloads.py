"""Job lists for the dynamic simulator: any mix of files of the supported formats -> ``list[JobSpec]``.

Formats are detected from each file's header, so files can be mixed in one run: Philly PCS per-VC lists
(``philly.py``) and Sia workloads (``sia.py``); what they share is in ``jobs.py`` and the CSV reading
in ``rows.py``. Every row is validated, because a bad row in a 50,000-row file must be reported with
its ``file:line`` and column, not crash a run; with ``skip_bad_rows`` bad rows are collected instead,
so one bad job never stops a long run.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from kubecell.core.engine.job import JobSpec
from kubecell.core.errors import InvalidInputError
from kubecell.inputs.csv_table import CsvTable, open_csv
from kubecell.sim.traces.jobs import (
    CPU_MILLI_PER_GPU,
    MEMORY_MIB_PER_GPU,
    SECONDS_PER_DAY,
    HostDefaults,
    JobFormat,
)
from kubecell.sim.traces.philly import PHILLY_PCS
from kubecell.sim.traces.sia import SIA

__all__ = ["FORMATS", "SECONDS_PER_DAY", "RejectedRow", "Workload", "WorkloadFile", "detect_format", "expand_paths",
           "load_workloads"]

FORMATS: tuple[JobFormat, ...] = (PHILLY_PCS, SIA)


# ---------------------------------------------------------------------- results
@dataclass(frozen=True, slots=True)
class RejectedRow:
    """A trace row that could not become a job, and why (kept, not raised, with ``skip_bad_rows``)."""

    location: str
    field: str | None
    reason: str

    def __str__(self) -> str:
        column = f": field '{self.field}'" if self.field else ""
        return f"{self.location}{column}: {self.reason}"


@dataclass(slots=True)
class WorkloadFile:
    """What one file contributed."""

    path: Path
    format: str
    vc: str
    rows: int = 0
    jobs: int = 0
    rejected: int = 0
    outside_window: int = 0


@dataclass(slots=True)
class Workload:
    jobs: list[JobSpec] = field(default_factory=list)
    rejected: list[RejectedRow] = field(default_factory=list)
    files: list[WorkloadFile] = field(default_factory=list)

    @property
    def vcs(self) -> list[str]:
        return sorted({job.vc for job in self.jobs})


# ---------------------------------------------------------------------- formats
def detect_format(table: CsvTable) -> JobFormat:
    """The format of a file: the first whose columns the header has. A header that has only some of a
    format's columns belongs to the format sharing the most with it, and the error names each missing
    column; a header sharing none with any format is reported with every format's header."""
    accepted = "a header with the columns of one format (" + "; ".join(
        f"{f.name}: {','.join(f.columns)}" for f in FORMATS) + ")"
    if not any(table.header):
        raise table.no_header(accepted)
    columns = set(table.header)
    complete = [f for f in FORMATS if columns.issuperset(f.columns)]
    if complete:
        trace_format = complete[0]
    else:
        shared = [len(columns.intersection(f.columns)) for f in FORMATS]
        best = max(shared)
        if best == 0 or shared.count(best) > 1:
            raise InvalidInputError(f"unrecognised header (columns: {', '.join(table.header)})",
                                    location=f"{table.path}:1", accepted=accepted)
        trace_format = FORMATS[shared.index(best)]
    table.require(trace_format.columns, kind=f"{trace_format.name} job list")
    return trace_format


# ---------------------------------------------------------------------- the dispatcher
def expand_paths(paths: Iterable[str | Path]) -> list[Path]:
    """Files as given; a directory stands for its ``*.csv`` files (sorted). Repeats are dropped."""
    out: list[Path] = []
    seen: set[Path] = set()
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(path.glob("*.csv"))
            if not found:
                raise InvalidInputError("directory holds no *.csv files", location=str(path),
                                        accepted="a trace CSV file or a directory of them")
        else:
            found = [path]
        for item in found:
            key = item.resolve()
            if key not in seen:
                seen.add(key)
                out.append(item)
    if not out:
        raise InvalidInputError("no workload files given", field="workload", accepted="one or more trace CSV files")
    return out


def load_workloads(
    paths: Sequence[str | Path] | str | Path,
    *,
    days: float | None = None,
    start_day: float = 0.0,
    skip_bad_rows: bool = False,
    cpu_milli_per_gpu: int = CPU_MILLI_PER_GPU,
    memory_mib_per_gpu: int = MEMORY_MIB_PER_GPU,
) -> Workload:
    """Load trace files of any supported format into jobs, sorted by submission time.

    ``start_day`` and ``days`` keep the jobs submitted in [start_day, start_day + days) days after time 0
    (each file's own origin: the first job of a PCS VC, the window start of a Sia workload), shifted so
    the window starts at 0; the cluster starts empty at the window's start. A bad row raises ``InvalidInputError``
    with ``file:line`` and column, unless ``skip_bad_rows``: then it is collected in ``rejected`` and
    the rest loads, so one bad job never stops a long run (the report counts them).
    """
    if days is not None and (not math.isfinite(days) or days <= 0):
        raise InvalidInputError(f"days {days}", field="days", accepted="a number of days > 0")
    if not math.isfinite(start_day) or start_day < 0:
        raise InvalidInputError(f"start day {start_day}", field="start-day", accepted="a number of days >= 0")
    offset = start_day * SECONDS_PER_DAY
    limit = offset + days * SECONDS_PER_DAY if days is not None else math.inf
    host = HostDefaults(cpu_milli_per_gpu, memory_mib_per_gpu)
    workload = Workload()
    first_line: dict[str, str] = {}
    for path in expand_paths([paths] if isinstance(paths, str | Path) else paths):
        _load_file(path, workload, first_line, host=host, window=(offset, limit), skip_bad_rows=skip_bad_rows)
    workload.jobs.sort(key=lambda job: (job.submit_time, job.vc, job.name))
    return workload


def _load_file(path: Path, workload: Workload, first_line: dict[str, str], *, host: HostDefaults,
               window: tuple[float, float], skip_bad_rows: bool) -> None:
    """Add one file's jobs submitted in ``window`` (seconds, shifted to start at 0) to ``workload``;
    ``first_line`` maps every job name seen so far to its ``file:line`` (names must be unique)."""
    offset, limit = window
    with open_csv(path) as table:
        trace_format = detect_format(table)
        vc = trace_format.vc_of(path)
        info = WorkloadFile(path, trace_format.name, vc)
        workload.files.append(info)
        for row in table.rows():
            info.rows += 1
            where = row.where
            try:
                if row.problem:
                    raise row.problem
                parsed = trace_format.row(vc, row, host)
                if parsed.submit >= limit or parsed.submit < offset:
                    info.outside_window += 1
                    continue
                if parsed.name in first_line:
                    raise InvalidInputError(f"duplicate job {parsed.name!r} (first at {first_line[parsed.name]})",
                                            location=where, accepted="unique job ids per virtual cluster")
                spec = parsed.spec()
                if offset:
                    spec = replace(spec, submit_time=spec.submit_time - offset)
            except InvalidInputError as error:
                if not skip_bad_rows:
                    if error.location is None or not error.location.startswith(str(path)):
                        # raised by the core's own checks (``job 'x'``): point at the row instead
                        raise InvalidInputError(error.message, location=where, field=error.field,
                                                accepted=error.accepted) from None
                    raise
                info.rejected += 1
                workload.rejected.append(RejectedRow(where, error.field, error.message))
                continue
            first_line[parsed.name] = where
            workload.jobs.append(spec)
            info.jobs += 1
