"""``decimal_digits``: the one check before ``int()`` of digits someone else wrote."""

from __future__ import annotations

import pytest

from kubecell.core.digits import decimal_digits


@pytest.mark.parametrize("text", ["0", "7", "0123", "65535", "9" * 40])
def test_ascii_digits_are_digits(text: str) -> None:
    assert decimal_digits(text)
    int(text)


@pytest.mark.parametrize("text", ["", "²", "١٢", "٣", "-1", "+1", " 1", "1 ", "1.0", "1e3", "0x1f", "1_000"])
def test_anything_else_is_not(text: str) -> None:
    """``"²".isdigit()`` is true and ``int("²")`` raises; ``int("١٢")`` reads 12 and ``int("1_000")`` 1000:
    none of them is what a label, a port or a Content-Length of digits means."""
    assert not decimal_digits(text)
