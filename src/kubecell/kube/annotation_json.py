"""JSON read from an annotation with limits (length, digits of a number, depth): every annotation kubecell
reads is written by someone it does not trust, and Python's ``json`` converts a number of any length and
recurses as deep as the text goes."""

from __future__ import annotations

import json
from typing import Any

from kubecell.core.shown import shown

MAX_JSON_DIGITS = 20
"""The most digits of a number in an annotation's JSON: int64 has 19; longer numbers are never converted."""


class AnnotationJsonError(ValueError):
    """JSON an annotation's reader refuses before validating it: too long, nested beyond what the parser
    reads, or a number of more digits than any field holds (at ``path``, the keys and list positions)."""

    def __init__(self, message: str, path: tuple[str | int, ...] = (), accepted: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.path = path
        self.accepted = accepted


class _LongNumber(str):
    """A JSON number of more than ``MAX_JSON_DIGITS`` digits, kept as its text (never converted)."""


def _json_int(text: str) -> int | _LongNumber:
    return _LongNumber(text) if len(text) > MAX_JSON_DIGITS else int(text)


def _long_number(raw: Any) -> tuple[tuple[str | int, ...], _LongNumber] | None:
    """The first ``_LongNumber`` in ``raw`` and its path; walked without recursion."""
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), raw)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, _LongNumber):
            return path, value
        if isinstance(value, dict):
            stack.extend(((*path, str(key)), item) for key, item in reversed(list(value.items())))
        elif isinstance(value, list):
            stack.extend(((*path, index), item) for index, item in reversed(list(enumerate(value))))
    return None


class _RepeatedKeyError(ValueError):
    """Raised inside the parser; becomes an ``AnnotationJsonError`` once ``json.loads`` has unwound."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _RepeatedKeyError(key)
        seen[key] = value
    return seen


def load_annotation_json(text: object, *, max_chars: int, unique_keys: bool = False) -> Any:
    """An annotation's JSON, read with limits: at most ``max_chars`` characters, numbers of at most
    ``MAX_JSON_DIGITS`` digits (Python's ``int`` raises ``ValueError`` beyond 4,300, and no field holds
    more than int64), nesting only as deep as Python's parser goes. With ``unique_keys``, an object with one
    key twice is refused: JSON leaves it undefined which copy counts, and parsers disagree, so a reader that
    trusted one copy could be shown another by the API server's or a client's parser.

    Raises ``json.JSONDecodeError`` for text that is not JSON (each caller words it), and
    ``AnnotationJsonError`` for the limits."""
    if not isinstance(text, str):
        raise AnnotationJsonError(f"is a {type(text).__name__}, not text")
    if len(text) > max_chars:
        raise AnnotationJsonError(f"is {len(text)} characters long", accepted=f"at most {max_chars} characters")
    try:
        raw = json.loads(text, parse_int=_json_int, object_pairs_hook=_unique_keys if unique_keys else None)
    except RecursionError:
        raise AnnotationJsonError("nests deeper than any annotation of kubecell's") from None
    except _RepeatedKeyError as error:
        raise AnnotationJsonError(f"has the key {shown(str(error.args[0]))} twice", accepted="each key once") from None
    found = _long_number(raw)
    if found is not None:
        path, number = found
        raise AnnotationJsonError(f"the number {shown(str(number))} has {len(number.lstrip('-'))} digits", path,
                                  f"numbers of at most {MAX_JSON_DIGITS} digits (int64)")
    return raw
