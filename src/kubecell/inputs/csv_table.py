"""One CSV reader for every CSV input (traces, co-location tables): the file, its header, its rows and typed
fields, with errors a user can act on.

Every trace kubecell reads (openb node and pod lists, Philly PCS and Sia job lists) is a CSV file with
a header line, and every one must fail the same way on the same mistakes: a directory or a missing
file, a file that is not UTF-8, an empty file, a header without a column the format needs (each missing
column named), a row with too few or too many fields, a field that is not a number or out of range.
Each message names ``file:line``, the column and what would have been accepted, so a bad row in a
50,000-row file is found without reading a traceback.

Usage::

    with open_csv(path) as table:
        table.require(("sn", "cpu_milli"), kind="node list")
        for row in table.rows():
            if row.problem:
                raise row.problem           # or collect it and go on (``--skip-bad-rows``)
            cpu = row.integer("cpu_milli", high=MAX_CPU_MILLI)
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from kubecell.core.errors import InvalidInputError


@dataclass(frozen=True, slots=True)
class Row:
    """One data row: where it is and its fields by column name (raw text, as in the file).

    ``problem`` is set when the row has a different number of fields than the header; its fields are
    then unreliable, and the caller raises or records the problem instead of reading them.
    """

    path: Path
    line: int
    """Physical line of the file (blank lines count; a quoted field spanning lines ends the row)."""
    values: Mapping[str, str]
    problem: InvalidInputError | None = None

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    def optional(self, column: str) -> str:
        """The raw text of a column the format does not require ('' when the file lacks it)."""
        return self.values.get(column) or ""

    def text(self, column: str) -> str:
        """A non-empty text field, stripped."""
        text = self.values[column].strip()
        if not text:
            raise InvalidInputError("is empty", location=self.where, field=column, accepted="a non-empty value")
        return text

    def integer(self, column: str, *, high: int, low: int = 0, blank: int | None = None) -> int:
        """A whole number written as an integer (``12``, not ``12.0``) in ``low..high``; an empty field is
        ``blank`` when given (openb leaves GPU columns of CPU-only rows empty), else an error."""
        text = self.values[column].strip()
        if not text and blank is not None:
            return blank
        try:
            value = int(text)
        except ValueError:
            raise InvalidInputError(f"{text!r} is not an integer", location=self.where, field=column,
                                    accepted=f"a whole number in {low}..{high}") from None
        if not low <= value <= high:
            raise InvalidInputError(f"{value} is out of range", location=self.where, field=column,
                                    accepted=f"{low}..{high}")
        return value

    def count(self, column: str, *, high: int, noun: str, low: int = 1) -> int:
        """A whole number that may be written as a decimal (``4.0`` is 4; job lists written by numpy do
        that) in ``low..high``; ``noun`` says what is counted (``GPUs``)."""
        text = self.values[column].strip()
        accepted = f"a whole number of {noun} in {low}..{high}"
        try:
            value = float(text)
        except ValueError:
            raise InvalidInputError(f"{text!r} is not a number", location=self.where, field=column,
                                    accepted=accepted) from None
        if not math.isfinite(value) or value != int(value):
            raise InvalidInputError(f"{text!r} {noun} is not a whole number", location=self.where, field=column,
                                    accepted=accepted)
        if not low <= value <= high:
            raise InvalidInputError(f"{text!r} {noun} is out of range", location=self.where, field=column,
                                    accepted=accepted)
        return int(value)

    def number(self, column: str, *, positive: bool = False, high: float = math.inf, unit: str = "") -> float:
        """A finite decimal number >= 0 (> 0 when ``positive``) and <= ``high``: times and amounts of work,
        in ``unit`` (for the message)."""
        text = self.values[column].strip()
        low = "> 0" if positive else ">= 0"
        of = f" of {unit}" if unit else ""
        accepted = f"a finite number{of} {low}" + (f" and <= {high:.0f}" if math.isfinite(high) else "")
        try:
            value = float(text)
        except ValueError:
            raise InvalidInputError(f"{text!r} is not a number", location=self.where, field=column,
                                    accepted=accepted) from None
        if not math.isfinite(value) or value < 0 or (positive and value == 0) or value > high:
            raise InvalidInputError(f"{text!r} is out of range", location=self.where, field=column, accepted=accepted)
        return value


class CsvTable:
    """An open CSV file: its header (read on opening), then its data rows, read once, in order."""

    def __init__(self, path: Path, handle: TextIO) -> None:
        self.path = path
        self._reader = csv.reader(handle)
        try:
            first = next(self._reader, None)
        except (UnicodeDecodeError, csv.Error) as error:
            raise self._unreadable(error) from None
        self.empty = first is None
        """The file holds nothing at all (not even a header line)."""
        self.header: tuple[str, ...] = tuple(column.strip() for column in first or ())

    def _unreadable(self, error: UnicodeDecodeError | csv.Error) -> InvalidInputError:
        if isinstance(error, UnicodeDecodeError):  # decoding runs ahead of the reader: no reliable line
            return InvalidInputError("not a UTF-8 text file", location=str(self.path),
                                     accepted="a UTF-8 (or ASCII) CSV file")
        return InvalidInputError(f"malformed CSV: {error}", location=f"{self.path}:{self._reader.line_num}")

    def no_header(self, accepted: str) -> InvalidInputError:
        """The error for a file whose first line is not a header (``accepted`` describes one)."""
        if self.empty:
            return InvalidInputError("the file is empty", location=str(self.path), accepted=accepted)
        return InvalidInputError("line 1 is blank; the first line must be the header", location=f"{self.path}:1",
                                 accepted=accepted)

    def require(self, columns: Sequence[str], *, kind: str) -> None:
        """Raise unless the header has every one of ``columns`` (each missing one is named) exactly once.

        ``kind`` names what the file should be (``node list``, ``philly-pcs job list``) for the message.
        """
        accepted = f"a {kind} header with {', '.join(columns)}"
        if not any(self.header):
            raise self.no_header(accepted)
        seen: dict[str, int] = {}
        for position, column in enumerate(self.header, start=1):
            if column in seen and column:
                raise InvalidInputError(f"column {column!r} appears twice (columns {seen[column]} and {position})",
                                        location=f"{self.path}:1", accepted="unique column names")
            seen[column] = position
        missing = [column for column in columns if column not in seen]
        if missing:
            names = ", ".join(repr(column) for column in missing)
            plural = "s" if len(missing) > 1 else ""
            raise InvalidInputError(f"missing column{plural} {names} (columns: {', '.join(self.header)})",
                                    location=f"{self.path}:1", accepted=accepted)

    def rows(self) -> Iterator[Row]:
        """Each data row; rows whose fields are all blank are skipped (spreadsheets leave them)."""
        header = self.header
        width = len(header)
        reader = self._reader
        try:
            for fields in reader:
                if not any(field.strip() for field in fields):
                    continue
                line = reader.line_num
                if len(fields) == width:
                    yield Row(self.path, line, dict(zip(header, fields, strict=True)))
                    continue
                problem = InvalidInputError(
                    f"has {len(fields)} fields, header has {width}", location=f"{self.path}:{line}",
                    field=header[len(fields)] if len(fields) < width else None,
                    accepted=f"{width} comma-separated fields per row ({','.join(header)})")
                yield Row(self.path, line, {}, problem)
        except (UnicodeDecodeError, csv.Error) as error:
            raise self._unreadable(error) from None


@contextmanager
def open_csv(path: str | Path) -> Iterator[CsvTable]:
    """Open a CSV trace file and read its header; file-level problems raise ``InvalidInputError``."""
    path = Path(path)
    if path.is_dir():
        raise InvalidInputError("is a directory, not a file", location=str(path), accepted="a CSV file")
    if not path.exists():
        raise InvalidInputError("file not found", location=str(path))
    try:
        handle = path.open(newline="", encoding="utf-8-sig")  # tolerate the BOM spreadsheets write
    except OSError as error:
        raise InvalidInputError(f"cannot read file: {error.strerror}", location=str(path)) from None
    with handle:
        yield CsvTable(path, handle)
