"""Whether a text is a whole number written in ASCII decimal digits, as ``int()`` reads it without surprise.

``str.isdigit()`` is true of ``"²"`` and ``"٣"``, which ``int()`` refuses or reads as another script's digit: a
worker label, a port, a Content-Length or a /proc entry checked with it alone raised ``ValueError`` past the
caller's own error path (found by a hostile review). Every place that parses digits a user, a node or a peer wrote
asks this one function.
"""

from __future__ import annotations

__all__ = ["decimal_digits"]


def decimal_digits(text: str) -> bool:
    """True when ``text`` is one or more of the ASCII digits 0-9 and nothing else (no sign, space or dot)."""
    return text.isascii() and text.isdigit()
