"""Text someone else wrote never reaches the operator's terminal as control sequences: rich passes ESC through
as it comes, so an Event message quoting a user's CEL selector, a GPU product name a node published or an
ElasticJob status could set the operator's clipboard (OSC 52), retitle the window, clear the screen or rewrite
the line above (kubectl closed the same hole, CVE-2021-25743)."""

from __future__ import annotations

import io
import logging
import re
import sys

import pytest
from rich.table import Table
from rich.text import Text

from kubecell.cli.output import NeutralFormatter, SafeConsole, neutralized, stderr_console, warn

HOSTILE = "gpu\x1b]52;c;cHduZWQ=\x07\x1b[2J\x1b[1Amodel\x9b31m"


def test_control_characters_are_written_out_and_newlines_and_tabs_kept() -> None:
    assert neutralized(HOSTILE) == "gpu\\x1b]52;c;cHduZWQ=\\x07\\x1b[2J\\x1b[1Amodel\\x9b31m"
    assert neutralized("a\tb\nc") == "a\tb\nc"


@pytest.mark.parametrize("terminal", [False, True])
def test_a_table_a_string_and_a_text_print_no_control_sequence_but_rich_styles(terminal: bool) -> None:
    out = io.StringIO()
    console = SafeConsole(file=out, force_terminal=terminal, width=120)
    table = Table("node", "model")
    table.add_row("n1", HOSTILE)
    console.print(table)
    console.print(f"model {HOSTILE}", style="red", markup=False, highlight=False)
    console.print(Text(HOSTILE, style="bold"))
    shown = out.getvalue()
    assert "\x07" not in shown
    assert "\x9b" not in shown
    sequences = re.findall(r"\x1b(.)[^m\x1b]*m?", shown)
    assert set(sequences) <= {"["}, "only rich's own style sequences"
    assert not re.search(r"\x1b\[[0-9;]*[A-LN-Za-ln-z]", shown), "no cursor or erase sequence"
    assert shown.count("\\x1b]52;c;cHduZWQ=") == 3
    lines = [line for line in shown.splitlines() if line.startswith(("┃", "│", "┏", "└"))]
    assert len({len(re.sub(r"\x1b\[[0-9;]*m", "", line)) for line in lines}) == 1, "the table still lines up"


def test_warnings_and_errors_on_stderr_are_neutralized(capsys: pytest.CaptureFixture[str]) -> None:
    warn(f"slice of node n1 publishes {HOSTILE}")
    stderr_console().print(f"error: {HOSTILE}", markup=False, highlight=False)
    err = capsys.readouterr().err
    assert "\x1b" not in err
    assert err.count("\\x1b[2J") == 2


def test_text_others_wrote_is_never_read_as_markup() -> None:
    """A workload family is an owner reference's name, which the API server does not check: as markup,
    ``[link=...]`` wrote a hyperlink into the operator's terminal and ``x[/y]`` raised ``MarkupError``."""
    out = io.StringIO()
    console = SafeConsole(file=out, force_terminal=True, width=120)
    table = Table("family", "why")
    table.add_row("a[/b] [link=https://example.com]c[/link]", "[red]x")
    console.print(table)
    console.print("[bold]kept[/bold] as written")
    assert "\x1b]8;" not in out.getvalue(), "no hyperlink"
    shown = re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())  # (rich's styles and highlighting left aside)
    assert "a[/b] [link=https://example.com]c[/link]" in shown
    assert "[red]x" in shown
    assert "[bold]kept[/bold] as written" in shown
    console.print("[bold]styled[/bold] on request", markup=True)
    assert "[bold]" not in out.getvalue().rsplit("\n", 2)[-2]


def test_a_log_line_quoting_others_values_stays_one_inert_line() -> None:
    """The services log values others wrote (a node's notes, an ElasticJob's model, an API error's text): read
    with ``kubectl logs``, an ESC would be a terminal sequence and a line break a forged log line."""
    formatter = NeutralFormatter("%(levelname)s %(message)s")
    record = logging.LogRecord("kubecell.scheduler.nodes", logging.WARNING, __file__, 1,
                               "node %s: %s", ("n1", "A100\x1b]52;c;ZXZpbA==\x07\nERROR forged line\r"), None)
    line = formatter.format(record)
    assert not {"\n", "\r", "\x1b", "\x07"} & set(line)
    assert line == "WARNING node n1: A100\\x1b]52;c;ZXZpbA==\\x07\\nERROR forged line\\x0d"
    try:
        raise ValueError("boom")
    except ValueError:
        failed = logging.LogRecord("kubecell", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    assert "\nTraceback" in formatter.format(failed), "a traceback kubecell appends keeps its own lines"
