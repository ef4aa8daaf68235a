"""Readers of co-location measurement tables: solo profiles and runs of jobs sharing one GPU.

The format is Lucid's (ASPLOS '23), which is also what a user gets from profiling jobs with nvidia-smi:

* solo table: ``model,dataset,batchsize,amp,gpu_util,gmem_util,gmem`` (percent, percent, MiB); only
  ``model``, ``gpu_util``, ``gmem_util`` and ``gmem`` are required, other columns (``speed``, ``label``) are
  ignored.
* run table: ``model1,dataset1,batchsize1,amp1,speed1,model2,...,speed2`` and so on for as many jobs as
  the run had (``model3``... when three shared); ``speedN`` is job N's shared throughput over its solo
  throughput; ``gpu_util`` (optional) is the GPU's utilization while they shared it, in percent. Columns with
  no name (a pandas index) and any others are ignored.

Parsed with the ``csv`` module, not pandas, so that every error names ``file:line`` and the column: a
measurement table is typed by hand or by a script, and "could not convert string to float" is not enough to
find the cell among a thousand rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from pathlib import Path

from kubecell.core.digits import decimal_digits
from kubecell.core.errors import InvalidInputError
from kubecell.core.interference.profile import InvalidProfileError, JobKey, SharedRun, SoloProfile
from kubecell.core.shown import shown
from kubecell.inputs.csv_table import open_csv

SOLO_REQUIRED = ("model", "gpu_util", "gmem_util", "gmem")
PROFILE_FIELD_COLUMNS = {"gpu_util": "gpu_util", "gmem_util": "gmem_util", "memory_mib": "gmem"}
MAX_SPEED_RATIO = 4.0
"""The fastest a job may run beside others, relative to alone (Lucid's pairs: 0.44-1.50): more is a throughput
typed where a ratio belongs, which would silently move every fit."""
MAX_BATCH_DIGITS = 9
TRUE_WORDS = {"1", "true", "yes"}
FALSE_WORDS = {"0", "false", "no", ""}


def _rows(path: Path) -> Iterator[tuple[str, dict[str, str], list[str]]]:
    """Yield ``(location, row, header)`` for every data row; ``location`` is ``file:line``. The file, its header
    (each column once) and each row's width are checked by the CSV reader every trace shares."""
    with open_csv(path) as table:
        table.require((), kind="co-location table")
        header = list(table.header)
        for row in table.rows():
            if row.problem:
                raise row.problem
            yield row.where, {name: cell.strip() for name, cell in row.values.items() if name}, header


def _require(header: list[str], columns: tuple[str, ...], path: Path) -> None:
    missing = [column for column in columns if column not in header]
    if missing:
        raise InvalidInputError(f"missing column(s) {', '.join(missing)}", location=f"{path}:1",
                                accepted="a header with " + ", ".join(columns))


def _number(row: Mapping[str, str], column: str, where: str) -> float:
    text = row[column]
    try:
        value = float(text)
    except ValueError:
        raise InvalidInputError(f"not a number: {text!r}", location=where, field=column) from None
    if not math.isfinite(value):
        raise InvalidInputError(f"must be a finite number, got {text!r}", location=where, field=column)
    return value


def _key(row: Mapping[str, str], suffix: str, where: str) -> JobKey:
    model = row[f"model{suffix}"]
    if not model:
        raise InvalidInputError("empty model name", location=where, field=f"model{suffix}")
    batch_column, amp_column = f"batchsize{suffix}", f"amp{suffix}"
    batch_size = 0
    if row.get(batch_column):
        text = row[batch_column]
        if not (decimal_digits(text) and len(text) <= MAX_BATCH_DIGITS):
            raise InvalidInputError(f"not a whole number >= 0: {shown(text)}", location=where, field=batch_column,
                                    accepted=f"a whole number of at most {MAX_BATCH_DIGITS} digits")
        batch_size = int(text)
    amp_text = row.get(amp_column, "").lower()
    if amp_text not in TRUE_WORDS | FALSE_WORDS:
        raise InvalidInputError(f"not a flag: {row[amp_column]!r}", location=where, field=amp_column,
                                accepted="0, 1, true, false")
    return JobKey(model, row.get(f"dataset{suffix}", ""), batch_size, amp_text in TRUE_WORDS)


def load_solo_profiles(path: str | Path) -> dict[JobKey, SoloProfile]:
    """Read a solo table; a configuration listed twice is refused with both lines."""
    path = Path(path)
    profiles: dict[JobKey, SoloProfile] = {}
    lines: dict[JobKey, str] = {}
    for where, row, header in _rows(path):
        _require(header, SOLO_REQUIRED, path)
        key = _key(row, "", where)
        if key in profiles:
            raise InvalidInputError(f"job {key} is listed twice (first at {lines[key]})", location=where,
                                    field="model")
        try:
            profiles[key] = SoloProfile(key, _number(row, "gpu_util", where), _number(row, "gmem_util", where),
                                        _number(row, "gmem", where))
        except InvalidProfileError as error:
            column = PROFILE_FIELD_COLUMNS.get(error.field or "", error.field)
            raise InvalidProfileError(error.message, location=where, field=column, accepted=error.accepted) from None
        lines[key] = where
    return profiles


def _job_count(header: list[str], path: Path) -> int:
    count = 0
    while f"model{count + 1}" in header:
        count += 1
    if count < 2:
        raise InvalidInputError("a run table needs at least model1 and model2 columns", location=f"{path}:1",
                                accepted="model1,...,speed1,model2,...,speed2")
    _require(header, tuple(f"speed{index}" for index in range(1, count + 1)), path)
    return count


def load_shared_runs(path: str | Path, solos: Mapping[JobKey, SoloProfile] | None = None) -> list[SharedRun]:
    """Read a run table; with ``solos``, every job must have a solo profile (else ``file:line`` and column)."""
    path = Path(path)
    runs: list[SharedRun] = []
    count = 0
    for where, row, header in _rows(path):
        count = count or _job_count(header, path)
        keys = tuple(_key(row, str(index), where) for index in range(1, count + 1))
        speeds = tuple(_number(row, f"speed{index}", where) for index in range(1, count + 1))
        for index, (key, speed) in enumerate(zip(keys, speeds, strict=True), start=1):
            if solos is not None and key not in solos:
                raise InvalidInputError(f"job {key} has no row in the solo table", location=where,
                                        field=f"model{index}", accepted="jobs of the solo table")
            if speed <= 0:
                raise InvalidInputError(f"must be above 0, got {speed:g}", location=where, field=f"speed{index}")
            if speed > MAX_SPEED_RATIO:
                raise InvalidInputError(f"is {speed:g}: a speed here is the job's throughput beside the others over "
                                        "its throughput alone (1.0: as fast), not a throughput", location=where,
                                        field=f"speed{index}", accepted=f"above 0, at most {MAX_SPEED_RATIO:g}")
        gpu_util = _number(row, "gpu_util", where) if (row.get("gpu_util") or "").strip() else None
        if gpu_util is not None and not 0 <= gpu_util <= 100:
            raise InvalidInputError(f"must be a percentage, got {gpu_util:g}", location=where, field="gpu_util",
                                    accepted="0 to 100")
        runs.append(SharedRun(keys, speeds, gpu_util))
    return runs
