"""Text from a trace, made safe to open in a spreadsheet.

The simulator's CSVs carry names a trace wrote (jobs, VCs, applications, workloads), and traces are untrusted
input: a cell starting with ``=``, ``+``, ``-`` or ``@`` is run as a formula by Excel, LibreOffice and Google
Sheets (``=HYPERLINK(...)``, ``=WEBSERVICE(...)``: CWE-1236), and a leading tab or carriage return hides such a
start from a naive check. Such text gets a leading ``'``, the mark spreadsheets read as "text", and OWASP's advice
for CSV injection. Numbers are written as numbers and never touched: ``-3.5`` is data.
"""

from __future__ import annotations

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_text(text: str) -> str:
    """``text`` as a cell no spreadsheet runs: unchanged unless it starts as a formula would."""
    return "'" + text if text.startswith(FORMULA_STARTS) else text
