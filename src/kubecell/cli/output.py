"""Where the CLI writes: the consoles and the report directory.

Two promises a long run must keep: its tables read the same in a terminal and in a log (a console that
is not a terminal gets a wide width, so no header is cut to fit 80 columns), and a report directory that
cannot be written stops the command *before* the run, not after it with the results lost.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.segment import Segment
from rich.text import Text

from kubecell.core.errors import InvalidInputError

LOG_WIDTH = 240
"""Console width when the output is a file or a pipe: wide enough for every table kubecell prints, so
``kubecell simulate | cat`` and CI logs show whole headers (rich would otherwise assume 80 columns)."""

OUT_ACCEPTED = "a directory that exists or can be created, and that kubecell may write in"


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def neutralized(text: str) -> str:
    """``text`` with its terminal control characters written out (``\x1b`` as the four characters ``\x1b``):
    newlines and tabs kept, as kubectl does for the object data it prints since CVE-2021-25743."""
    return _CONTROL.sub(lambda found: f"\\x{ord(found.group()):02x}", text)


class NeutralFormatter(logging.Formatter):
    """Log lines written out as ``neutralized`` does, line breaks in the message included.

    The services' logs quote values others wrote: a node's inventory notes, an ElasticJob's GPU model, a claim's
    selector, an API server's error text. Read with ``kubectl logs`` in a terminal, an ESC in one would be a
    terminal sequence, and a line break would start a log line of its author's making. A traceback kubecell
    appends keeps its own lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging.Formatter's name
        record.message = neutralized(record.message).replace("\n", "\\n")  # (a CR is written out already)
        return super().formatMessage(record)


def configure_logging(verbose: bool) -> None:
    """The services' logging (scheduler, node agent, ElasticJob controller): one line a record, neutralized."""
    handler = logging.StreamHandler()
    handler.setFormatter(NeutralFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler])


class SafeConsole(Console):
    """A rich console that never writes a control character it did not make itself.

    Much of what kubecell prints was written by someone else: Event messages and refusals quote a user's
    values (a CEL selector, an annotation), a node writes its GPUs' product names, an ElasticJob's status is
    whoever may patch it. rich passes ESC through as it comes, so ``\x1b]52;c;...\x07`` in a selector would set
    the clipboard of the operator who inspects the cluster, ``\x1b[2J`` clear the screen, ``\x1b[1A`` rewrite the
    line above. Strings are neutralized as rich turns them into text (so tables measure what is shown), and
    every segment's text again just before rich adds its own styles (for text made some other way).

    Nor is a string read as rich's markup unless a call asks for it (``markup=True``): a workload family named
    ``[link=https://...]x[/link]`` (an owner reference's name, which the API server does not check) wrote a
    hyperlink into the operator's terminal, and one named ``x[/y]`` raised ``MarkupError`` and ended the
    command. Styles are given as ``Text`` or ``style=``."""

    def __init__(self, *args: Any, **options: Any) -> None:
        options.setdefault("markup", False)
        super().__init__(*args, **options)

    def render_str(self, text: str, **options: Any) -> Text:
        return super().render_str(neutralized(text), **options)

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            segment if segment.control else Segment(neutralized(segment.text), segment.style)
            for segment in buffer)


def stdout_console() -> Console:
    """The console for results, made per command so it follows the stream the command really writes to
    (a test runner swaps ``sys.stdout``)."""
    return SafeConsole(width=None if sys.stdout.isatty() else LOG_WIDTH)


def stderr_console() -> Console:
    """The console for warnings, errors and progress."""
    return SafeConsole(stderr=True, width=None if sys.stderr.isatty() else LOG_WIDTH)


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
