"""Progress of a long run on stderr, in a terminal and in a log.

A grid of packing runs or a dynamic simulation can take minutes to hours. In a terminal a live bar shows
done/total, the step that is running, the time elapsed and an estimate of the time left; when stderr is
a file or a CI log (where a live bar is either invisible or a flood of control codes) the same facts come
as plain lines, at most one every ``LOG_INTERVAL_SECONDS`` plus the final one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

LOG_INTERVAL_SECONDS = 15.0
"""Least time between two progress lines in a log: enough to see a run move without drowning the log."""


def duration(seconds: float) -> str:
    """'42 s', '3 min 05 s', '2 h 04 min': a log line is read by people, not parsed."""
    seconds = max(seconds, 0.0)
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


class RunProgress:
    """Steps of one run: ``start(label)`` when a step begins (optional: parallel runs only finish),
    ``done(label)`` when it ends.

    Use as a context manager; in a terminal the bar disappears when the run ends, in a log the last line
    says how long the whole run took."""

    def __init__(self, name: str, total: int, unit: str, *, console: Console, announces_steps: bool = False,
                 interval: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        """``announces_steps``: ``start`` is called for every step (the dynamic runner does; a parallel grid
        cannot say what runs next), so a due log line waits for it and names the running step."""
        self.name = name
        self.announces_steps = announces_steps
        self.total = total
        self.unit = unit
        self.console = console
        self.interval = LOG_INTERVAL_SECONDS if interval is None else interval
        self.clock = clock
        self.completed = 0
        self.running: str | None = None
        self._started = clock()
        self._last_line = self._started
        self._line_due = False
        self._last_done = ""
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        if console.is_terminal:
            self._progress = Progress(
                TextColumn(f"[bold]{name}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(), console=console, transient=True)

    def __enter__(self) -> RunProgress:
        if self._progress is not None:
            self._progress.start()
            self._task = self._progress.add_task("", total=self.total)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.stop()

    def start(self, label: str) -> None:
        """A step begins: the bar names it; a log line that was due waits for it, so it can name it too."""
        self.running = label
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, description=f"running {label} ({self.completed + 1}/{self.total})",
                                  refresh=True)
        elif self._line_due:
            self._line()

    def done(self, label: str) -> None:
        """A step ended."""
        self.completed += 1
        self.running = None
        self._last_done = label
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, advance=1, description=f"{label} done", refresh=True)
            return
        now = self.clock()
        if self.completed >= self.total:
            self.console.print(f"{self.name}: {self.completed}/{self.total} {self.unit} done in "
                               f"{duration(now - self._started)}", highlight=False, soft_wrap=True, markup=False)
        elif now - self._last_line >= self.interval:
            self._line_due = True
            if not self.announces_steps:
                self._line()

    def _line(self) -> None:
        now = self.clock()
        elapsed = now - self._started
        left = elapsed / self.completed * (self.total - self.completed) if self.completed else None
        running = f"; running {self.running}" if self.running else ""
        estimate = f", about {duration(left)} left" if left is not None else ""
        self.console.print(
            f"{self.name}: {self.completed}/{self.total} {self.unit} done (last: {self._last_done}){running}; "
            f"{duration(elapsed)} elapsed{estimate}", highlight=False, soft_wrap=True, markup=False)
        self._last_line = now
        self._line_due = False
