"""The two value types Kubernetes adds to CEL for device selectors: ``Quantity`` and ``Semver``.

A ResourceSlice's capacities are quantities and its version attributes semantic versions; selectors
compare them with the quantity and semver libraries (``cel_library``). Both are plain frozen values so
that devices can be hashed by content; ``error`` is the CEL error value a failed call returns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal

from celpy.evaluation import CELEvalError

UINT64_MAX = 2**64 - 1


def error(message: str) -> CELEvalError:
    """A CEL error value: the call was well typed, but failed (what cel-go's ``types.NewErr`` is)."""
    return CELEvalError(message, ValueError, (message,))


@dataclass(frozen=True, slots=True)
class Quantity:
    """A Kubernetes quantity as CEL sees it: its exact value (``1Gi == 1024Mi``); no ordering operators."""

    value: Decimal

    def __repr__(self) -> str:
        return f"quantity({format(self.value.normalize(), 'f')!r})"


@dataclass(frozen=True, slots=True, eq=False)
class Semver:
    """A semantic version as blang/semver (``v4``) parses it; equal when ``compareTo`` is 0 (build
    metadata ignored), which is CEL's equality of Semver values."""

    major: int
    minor: int
    patch: int
    pre: tuple[int | str, ...] = ()
    build: tuple[str, ...] = field(default=())

    def compare(self, other: Semver) -> int:
        for mine, theirs in ((self.major, other.major), (self.minor, other.minor), (self.patch, other.patch)):
            if mine != theirs:
                return 1 if mine > theirs else -1
        if not self.pre or not other.pre:
            return (not self.pre) - (not other.pre)
        for mine_pre, theirs_pre in zip(self.pre, other.pre, strict=False):
            if mine_pre == theirs_pre:
                continue
            if isinstance(mine_pre, int) != isinstance(theirs_pre, int):
                return -1 if isinstance(mine_pre, int) else 1  # numeric identifiers sort first
            return 1 if mine_pre > theirs_pre else -1  # type: ignore[operator]
        return (len(self.pre) > len(other.pre)) - (len(self.pre) < len(other.pre))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Semver) and self.compare(other) == 0

    def __hash__(self) -> int:
        return hash((self.major, self.minor, self.patch, self.pre))

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.pre:
            text += "-" + ".".join(str(part) for part in self.pre)
        return text + ("+" + ".".join(self.build) if self.build else "")


_DIGITS = re.compile(r"[0-9]+")
_IDENTIFIER = re.compile(r"[0-9A-Za-z-]+")


def _number(text: str, what: str) -> int:
    if not _DIGITS.fullmatch(text):
        raise ValueError(f"invalid character(s) in {what} {text!r}")
    if len(text) > 1 and text[0] == "0":
        raise ValueError(f"{what} {text!r} must not have leading zeroes")
    value = int(text)
    if value > UINT64_MAX:
        raise ValueError(f"{what} {text!r} is out of range")
    return value


def parse_semver(text: str, *, normalize: bool = False) -> Semver:
    """``text`` as blang/semver's ``Parse`` reads it (``MAJOR.MINOR.PATCH[-pre][+build]``), or, with
    ``normalize``, as Kubernetes' ``semver(s, true)`` does first: a leading ``v`` dropped, leading zeros
    removed and a missing minor or patch filled with 0. Raises ``ValueError`` with the reason."""
    if normalize:
        parts = text.removeprefix("v").split(".", 2)
        for i, part in enumerate(parts):
            if len(part) > 1:
                part = part.lstrip("0")
                parts[i] = part if part and part[0] in "0123456789" else "0" + part
        if len(parts) < 3:
            if "+" in parts[-1] or "-" in parts[-1]:
                raise ValueError("short version cannot contain PreRelease/Build meta data")
            parts += ["0"] * (3 - len(parts))
        text = ".".join(parts)
    if not text:
        raise ValueError("version string empty")
    parts = text.split(".", 2)
    if len(parts) != 3:
        raise ValueError("no Major.Minor.Patch elements found")
    rest, build = parts[2], ""
    if "+" in rest:
        rest, build = rest.split("+", 1)
        if not all(_IDENTIFIER.fullmatch(item) for item in build.split(".")):
            raise ValueError(f"invalid build metadata {build!r}")
    rest, dash, pre = rest.partition("-")
    prerelease: list[int | str] = []
    for item in pre.split(".") if dash else ():
        if not _IDENTIFIER.fullmatch(item):
            raise ValueError(f"invalid prerelease identifier {item!r}")
        prerelease.append(_number(item, "numeric prerelease") if _DIGITS.fullmatch(item) else item)
    return Semver(_number(parts[0], "major number"), _number(parts[1], "minor number"),
                  _number(rest, "patch number"), tuple(prerelease), tuple(build.split(".")) if build else ())
