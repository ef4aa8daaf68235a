"""Pydantic validation errors told in the input's own terms: where, what is wrong, what is accepted.

Every configuration kubecell reads (cluster descriptions, tenants, scenarios) is a mapping validated by
a pydantic model, and every one of them must fail with one line a user can act on. Pydantic's own
report is written for programmers: its locations mix the user's keys with validator internals
(``gpus.constrained-int``, ``gpus.GpuShorthand.count``, ``function-after[...]``), a field that accepts
two forms fails once per form, and its messages name Python types. This module is the one place that
turns such a report into an ``InvalidInputError``: it keeps only the key path the user wrote (found by
walking the input itself, so no internal name can leak), reports one problem per field (of the forms a
field accepts, the one the input came closest to), and says in plain words what was wrong and what would
have been accepted.

It is pure: the caller supplies a *locator* that turns a key path into a location string, so the core
can report ``file:line: key.path`` for input read from YAML without knowing anything about files.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from kubecell.core.errors import InvalidInputError

KeyPath = Sequence[str | int]
Locator = Callable[[KeyPath], str]
"""Turns a key path such as ``("virtualClusters", "a", "gpus")`` into a location for an error message."""

_TYPE_ERRORS = {
    "int_type": "must be a whole number",
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "finite_number": "must be a finite number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": "must be text",
    "dict_type": "must be a mapping of keys to values",
    "model_type": "must be a mapping of keys to values",
    "model_attributes_type": "must be a mapping of keys to values",
    "list_type": "must be a list",
}
_BOUNDS = {
    "greater_than_equal": ("ge", "must be at least {}"),
    "greater_than": ("gt", "must be greater than {}"),
    "less_than_equal": ("le", "must be at most {}"),
    "less_than": ("lt", "must be less than {}"),
}


def key_path(parts: KeyPath) -> str:
    """``("nodeGroups", 0, "gpu", "model")`` -> ``nodeGroups[0].gpu.model`` (integers are list indices)."""
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def plain_locator(source: str) -> Locator:
    """A locator for input without line numbers: ``source: key.path``."""

    def locate(parts: KeyPath) -> str:
        return f"{source}: {key_path(parts)}" if parts else source

    return locate


def show(value: Any) -> str:
    """A value as the user wrote it in YAML (``true``, ``null``, ``'two'``), or what kind of value it is."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null (nothing)"
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else repr(value[:37] + "...")
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return f"a {type(value).__name__}"


class _Problem:
    """One pydantic error item, reduced to the user's key path and what went wrong there."""

    def __init__(self, item: Mapping[str, Any], data: Any) -> None:
        self.kind: str = item["type"]
        self.item = item
        self.parts: list[str | int] = []
        self.field_depth: int | None = None  # where the first internal name (a union branch) appeared
        self.bad_key = False
        current = data
        loc = list(item["loc"])
        for position, part in enumerate(loc):
            last = position == len(loc) - 1
            if part == "[key]":
                self.bad_key = True
            elif isinstance(current, Mapping) and (part in current or (last and self.kind == "missing")):
                self.parts.append(str(part))  # a mapping key as written (``virtualClusters.1``), not an index
                current = current.get(part)
            elif isinstance(current, list | tuple) and isinstance(part, int) and 0 <= part < len(current):
                self.parts.append(part)
                current = current[part]
            elif self.field_depth is None:
                self.field_depth = len(self.parts)
        self.value = item.get("input")

    @property
    def field(self) -> tuple[str | int, ...]:
        """The path of the field this problem is about (for a union: the field, not the branch)."""
        depth = len(self.parts) if self.field_depth is None else self.field_depth
        return tuple(self.parts[:depth])

    @property
    def is_type_error(self) -> bool:
        return self.kind in _TYPE_ERRORS or self.kind.endswith("_type")

    def message(self) -> str:
        if self.bad_key:
            return f"keys here must be text, got {show(self.value)}"
        if self.kind == "extra_forbidden":
            return f"unknown key {self.parts[-1]!r}" if self.parts else "unknown key"
        if self.kind == "missing":
            return "required key missing"
        if self.kind in _BOUNDS:
            name, text = _BOUNDS[self.kind]
            bound = (self.item.get("ctx") or {}).get(name, "?")
            return f"{text.format(bound)}, got {show(self.value)}"
        if self.kind == "string_too_short":
            return "must not be empty"
        if self.kind in _TYPE_ERRORS:
            text = _TYPE_ERRORS[self.kind]
        elif self.is_type_error:  # e.g. dataclass_type: pydantic's message would name a Python class
            text = "is the wrong kind of value"
        else:
            raw = str(self.item.get("msg", "is not valid"))
            raw = raw.removeprefix("Value error, ").removeprefix("Assertion failed, ")
            text = "must be " + raw.removeprefix("Input should be ") if raw.startswith("Input should be") else raw
        return f"{text}, got {show(self.value)}{_yaml_boolean_hint(self.value)}"


def _yaml_boolean_hint(value: Any) -> str:
    return " (YAML reads yes, no, on and off as true and false)" if isinstance(value, bool) else ""


def _pick(problems: list[_Problem]) -> _Problem:
    """Of the errors a union field produced (one per form it accepts), the form the input came closest
    to: the one that got deepest into the input, else one whose type matched (a bound was broken)."""
    return max(problems, key=lambda p: (len(p.parts), not p.is_type_error))


def _matches(pattern: str, parts: KeyPath) -> bool:
    segments = pattern.split(".")
    return len(segments) == len(parts) and all(
        segment in ("*", part) for segment, part in zip(segments, parts, strict=True))


def explain_validation_error(
    error: ValidationError,
    data: Any,
    locate: Locator,
    *,
    accepted: Mapping[str, str] | None = None,
    keys: Callable[[KeyPath], str] | str = "",
) -> InvalidInputError:
    """One ``InvalidInputError`` for the first field pydantic rejected in ``data``.

    ``accepted`` maps key-path patterns (``virtualClusters.*.gpus``: ``*`` is any one key or list index)
    to what the field there accepts, in the user's words; ``keys`` says which keys a mapping accepts (a
    text, or a function of the mapping's key path), for unknown and missing keys.
    """
    patterns = accepted or {}
    # An unknown key often explains a missing one (a typo), so missing keys are reported last.
    problems = sorted((_Problem(item, data) for item in error.errors()), key=lambda p: p.kind == "missing")
    fields = list(dict.fromkeys(p.field for p in problems))
    first = fields[0]
    same_field = [p for p in problems if p.field == first]
    more = len(fields) - 1
    suffix = f" ({more} more problem(s) in this input)" if more else ""

    def keys_at(parts: KeyPath) -> str | None:
        return (keys(parts) if callable(keys) else keys) or None

    def accepted_at(parts: KeyPath) -> str | None:
        return next((text for pattern, text in patterns.items() if _matches(pattern, parts)), None)

    if len(same_field) > 1 and all(p.is_type_error for p in same_field) and \
            all(len(p.parts) == len(first) for p in same_field):
        # every form the field accepts rejected the value's type: one message about the field
        what = accepted_at(first)
        value = same_field[0].value
        message = f"expected {what}, got {show(value)}" if what else f"wrong kind of value {show(value)}"
        return InvalidInputError(message + _yaml_boolean_hint(value) + suffix, location=locate(first),
                                 accepted=None if what else keys_at(first[:-1]))
    problem = _pick(same_field)
    parts = problem.parts
    if problem.bad_key:
        return InvalidInputError(problem.message() + suffix, location=locate(parts))
    if problem.kind in ("extra_forbidden", "missing"):
        return InvalidInputError(problem.message() + suffix, location=locate(parts), accepted=keys_at(parts[:-1]))
    return InvalidInputError(problem.message() + suffix, location=locate(parts),
                             accepted=accepted_at(parts) or keys_at(parts[:-1]))
