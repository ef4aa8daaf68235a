"""Values anyone could have written, told in a message: short whatever they are. Every reader of untrusted input
(a YAML file, an annotation, a request) names the bad value in its error, and the value must not make the
message as long as itself."""

from __future__ import annotations

import reprlib

__all__ = ["shown"]


class _Cut(reprlib.Repr):
    """``repr`` for messages about values anyone could have written: short whatever the value is.

    ``reprlib`` already cuts long text, long lists and deep or self-referencing structures; a whole
    number of thousands of digits would still be written out in full (and beyond 4,300 digits Python
    refuses to write it at all), so such a number is told by its size."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxstring = 60
        self.maxother = 60
        self.maxlong = 40
        self.maxlist = self.maxtuple = self.maxdict = self.maxset = self.maxfrozenset = 6

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 128:  # about 39 digits: far beyond any amount a field holds
            return f"<a whole number of about {int(x.bit_length() * 0.30103) + 1} digits>"
        return super().repr_int(x, level)


_CUT = _Cut()


def shown(value: object) -> str:
    """``repr(value)``, cut to a few dozen characters: safe for a message whatever the value (long text, a
    number of 5,000 digits, a structure nested thousands deep)."""
    return _CUT.repr(value)
