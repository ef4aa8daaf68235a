"""Where the CLI writes: the consoles and the report directory.

Two promises a long run must keep: its tables read the same in a terminal and in a log (a console that
is not a terminal gets a wide width, so no header is cut to fit 80 columns), and a report directory that
cannot be written stops the command *before* the run, not after it with the results lost.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from rich.console import Console

from kubecell.core.errors import InvalidInputError

LOG_WIDTH = 240
"""Console width when the output is a file or a pipe: wide enough for every table kubecell prints, so
``kubecell simulate | cat`` and CI logs show whole headers (rich would otherwise assume 80 columns)."""

OUT_ACCEPTED = "a directory that exists or can be created, and that kubecell may write in"


def stdout_console() -> Console:
    """The console for results, made per command so it follows the stream the command really writes to
    (a test runner swaps ``sys.stdout``)."""
    return Console(width=None if sys.stdout.isatty() else LOG_WIDTH)


def stderr_console() -> Console:
    """The console for warnings, errors and progress."""
    return Console(stderr=True, width=None if sys.stderr.isatty() else LOG_WIDTH)


def warn(message: str) -> None:
    """One warning line on stderr (never wrapped, so a log keeps it on one line)."""
    stderr_console().print(f"warning: {message}", highlight=False, soft_wrap=True, markup=False)


def check_out_dir(out: Path) -> None:
    """What can be seen without creating anything: ``out`` is not a file, and its nearest existing ancestor
    is a directory this process may write in. Called before the inputs are read."""
    if out.exists():
        if not out.is_dir():
            raise InvalidInputError(f"{out} is an existing file, not a directory", field="out", accepted=OUT_ACCEPTED)
        if not os.access(out, os.W_OK | os.X_OK):
            raise InvalidInputError(f"no permission to write in {out}", field="out", accepted=OUT_ACCEPTED)
        return
    ancestor = out.absolute().parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise InvalidInputError(f"{out} cannot be created: {ancestor} is a file, not a directory", field="out",
                                accepted=OUT_ACCEPTED)
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise InvalidInputError(f"{out} cannot be created: no permission to write in {ancestor}", field="out",
                                accepted=OUT_ACCEPTED)


def prepare_out_dir(out: Path) -> None:
    """Create ``out`` and write (then remove) a scratch file in it: the real test, which also catches what
    permission bits do not show (read-only file systems, quotas, ACLs). Called once the inputs are valid,
    right before the run, so an input error leaves no empty directory behind."""
    check_out_dir(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise InvalidInputError(f"cannot create {out}: {error.strerror or error}", field="out",
                                accepted=OUT_ACCEPTED) from error
    try:
        handle, scratch = tempfile.mkstemp(dir=out, prefix=".kubecell-write-check-")
        os.close(handle)
        os.unlink(scratch)
    except OSError as error:
        raise InvalidInputError(f"cannot write in {out}: {error.strerror or error}", field="out",
                                accepted=OUT_ACCEPTED) from error
