"""Kubernetes' CEL libraries for device selectors, as functions over cel-python's values.

kube-scheduler compiles DRA selectors in the API server's base CEL environment
(``k8s.io/apiserver/pkg/cel/environment/base.go``) plus the ``device`` variable
(``k8s.io/dynamic-resource-allocation/cel/compile.go``). This module implements what selectors use of it:
the quantity library (``quantity("10Gi").compareTo(...)``), the semver library (version attributes are
``Semver`` values), Kubernetes' lists and regex libraries, cel-go's string extensions (version 2), the
list extensions that need no optional types, and ``sets``. Standard CEL (operators, macros, ``size``,
``matches`` with RE2, conversions, timestamps) is cel-python's own. ``SUPPORTED`` names every function;
``KNOWN_UNSUPPORTED`` names Kubernetes' functions kubecell does not implement, refused with that reason.

cel-python dispatches a function by name alone and passes a method's receiver first, so one Python
function serves every overload of a name and tells them apart by argument type. A call no overload takes
raises ``TypeError`` (cel-python makes it a "no such overload" error value, as cel-go would at run time);
a failure of a valid call (``quantity("bad")``, an index out of range) returns a ``CELEvalError`` value.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from functools import lru_cache
from typing import Any

import re2  # type: ignore[import-untyped]
from celpy.celtypes import BoolType, DoubleType, IntType, ListType, StringType
from celpy.evaluation import CELEvalError

from kubecell.kube.dialects.resources import QuantityError, parse_quantity
from kubecell.kube.dra.cel_types import Quantity, Semver, error, parse_semver

INT64_MAX = 2**63 - 1


# --- quantity library (k8s.io/apiserver/pkg/cel/library/quantity.go) ---------------------------------------

def _quantity(text: Any) -> Quantity | CELEvalError:
    if not isinstance(text, str):
        raise TypeError("quantity() takes a string")
    try:
        if text != text.strip():  # Go's ParseQuantity trims nothing
            raise QuantityError("has leading or trailing spaces")
        return Quantity(parse_quantity(text))
    except QuantityError as problem:
        return error(f"quantity({text[:64]!r}): {problem.reason}")


def _is_quantity(text: Any) -> BoolType:
    return BoolType(isinstance(_quantity(text), Quantity))


def _as_quantity(value: Any) -> Decimal:
    if isinstance(value, Quantity):
        return value.value
    if isinstance(value, int) and not isinstance(value, (bool, BoolType)):
        return Decimal(value)
    raise TypeError("no such overload")


def _sign(q: Any) -> IntType:
    if not isinstance(q, Quantity):
        raise TypeError("sign() takes a quantity")
    return IntType((q.value > 0) - (q.value < 0))


def _is_integer(q: Any) -> BoolType:
    value = q.value if isinstance(q, Quantity) else None
    if value is None:
        raise TypeError("isInteger() takes a quantity")
    return BoolType(value == value.to_integral_value() and abs(value) <= INT64_MAX)


def _as_integer(q: Any) -> IntType | CELEvalError:
    if not _is_integer(q):
        return error("cannot convert value to integer")
    return IntType(int(q.value))


def _as_approximate_float(q: Any) -> DoubleType:
    if not isinstance(q, Quantity):
        raise TypeError("asApproximateFloat() takes a quantity")
    return DoubleType(float(q.value))


def _add(q: Any, other: Any) -> Quantity:
    if not isinstance(q, Quantity):
        raise TypeError("add() takes a quantity")
    return Quantity(q.value + _as_quantity(other))


def _sub(q: Any, other: Any) -> Quantity:
    if not isinstance(q, Quantity):
        raise TypeError("sub() takes a quantity")
    return Quantity(q.value - _as_quantity(other))


def _compare(a: Any, b: Any) -> int:
    if isinstance(a, Quantity) and isinstance(b, Quantity):
        return (a.value > b.value) - (a.value < b.value)
    if isinstance(a, Semver) and isinstance(b, Semver):
        return a.compare(b)
    raise TypeError("compares two quantities or two semantic versions")


# --- semver library (k8s.io/apiserver/pkg/cel/library/semverlib.go) ----------------------------------------

def _semver(text: Any, normalize: Any = False) -> Semver | CELEvalError:
    if not isinstance(text, str) or not isinstance(normalize, (bool, BoolType)):
        raise TypeError("semver() takes a string and an optional bool")
    try:
        return parse_semver(text, normalize=bool(normalize))
    except ValueError as problem:
        return error(f"semver({text[:64]!r}): {problem}")


def _is_semver(text: Any, normalize: Any = False) -> BoolType:
    return BoolType(isinstance(_semver(text, normalize), Semver))


def _part(index: int) -> Callable[[Any], IntType]:
    def part(version: Any) -> IntType:
        if not isinstance(version, Semver):
            raise TypeError("takes a semantic version")
        return IntType((version.major, version.minor, version.patch)[index])
    return part


# --- strings extension, version 2 (cel-go ext/strings.go) and the regex library -----------------------------

_GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" \
            "\u2028\u2029\u202f\u205f\u3000"
"""Go's ``unicode.IsSpace``, which ``strings.TrimSpace`` strips (Python's ``str.strip`` strips more)."""
_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_UPPER = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("takes a string")
    return value


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, (bool, BoolType)):
        raise TypeError("takes an int")
    return int(value)


def _char_at(text: Any, index: Any) -> StringType | CELEvalError:
    text, index = _text(text), _int(index)
    if not 0 <= index <= len(text):
        return error(f"index out of range: {index}")
    return StringType(text[index] if index < len(text) else "")


def _index_of(target: Any, item: Any, *offset: Any) -> IntType | CELEvalError:
    if isinstance(target, list) and not offset:  # the lists library
        return IntType(next((i for i, value in enumerate(target) if _equal(value, item)), -1))
    text, sub = _text(target), _text(item)
    start = _int(offset[0]) if offset else 0
    if start < 0:
        return error(f"index out of range: {start}")
    if not sub:
        return IntType(min(start, len(text)))
    return IntType(text.find(sub, start) if start < len(text) else -1)


def _last_index_of(target: Any, item: Any, *offset: Any) -> IntType | CELEvalError:
    if isinstance(target, list) and not offset:
        return IntType(next((i for i in range(len(target) - 1, -1, -1) if _equal(target[i], item)), -1))
    text, sub = _text(target), _text(item)
    if not offset and (not sub or len(sub) > len(text)):
        return IntType(len(text) if not sub else -1)
    start = _int(offset[0]) if offset else len(text) - 1
    if start < 0:
        return error(f"index out of range: {start}")
    if not sub:
        return IntType(min(start, len(text)))
    if start >= len(text):
        return IntType(-1)
    return IntType(text.rfind(sub, 0, min(start, len(text) - len(sub)) + len(sub)))


def _split(text: Any, separator: Any, *limit: Any) -> ListType:
    text, separator = _text(text), _text(separator)
    count = _int(limit[0]) if limit else -1
    if count == 0:
        return ListType()
    if separator:
        parts = text.split(separator, count - 1 if count > 0 else -1)
    else:
        parts = list(text) if count < 0 or count >= len(text) else [*text[:count - 1], text[count - 1:]]
    return ListType(StringType(part) for part in parts)


def _substring(text: Any, start: Any, *end: Any) -> StringType | CELEvalError:
    text, begin = _text(text), _int(start)
    stop = _int(end[0]) if end else len(text)
    if begin > stop:
        return error(f"invalid substring range. start: {begin}, end: {stop}")
    for index in (begin, stop):
        if not 0 <= index <= len(text):
            return error(f"index out of range: {index}")
    return StringType(text[begin:stop])


MAX_BUILT = 10_000_000
"""The longest string ``replace`` builds: one this long spends the whole run-time budget (a unit per 10
characters) by itself, and the budget is looked at only once a step has built its value."""


def _replace(text: Any, old: Any, new: Any, *count: Any) -> StringType | CELEvalError:
    text, old, new = _text(text), _text(old), _text(new)
    limit = _int(count[0]) if count else -1
    found = len(text) + 1 if not old else text.count(old)
    found = found if limit < 0 else min(found, limit)
    if len(text) + found * (len(new) - len(old)) > MAX_BUILT:
        return error(f"actual cost limit exceeded: replace would build more than {MAX_BUILT} characters")
    return StringType(text.replace(old, new, limit if limit >= 0 else -1))


def _join(items: Any, *separator: Any) -> StringType:
    if not isinstance(items, list):
        raise TypeError("join() takes a list of strings")
    return StringType((_text(separator[0]) if separator else "").join(_text(item) for item in items))


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False


compiled = 0
"""Patterns compiled so far (``compile_regex``'s cache misses). One compile may take a quarter of a second
(``\\pL{300}``, 9 characters, builds a large automaton; ``\\pL{600}`` is refused after some 50 ms), far more
than the cost model prices it, so an evaluator on a clock reads it after every compile (``cel._Evaluator``)."""


@lru_cache(maxsize=256)
def compile_regex(pattern: str) -> Any:
    """``pattern`` compiled by RE2 (the syntax and linear-time matching cel-go's Go regexp has), or the
    reason it does not compile, as a string."""
    global compiled
    compiled += 1
    try:
        return re2.compile(pattern, options=_RE2_OPTIONS)
    except re2.error as problem:
        reason = problem.args[0] if problem.args else problem
        return reason.decode("utf-8", "replace") if isinstance(reason, bytes) else str(reason)


def _regex(pattern: Any) -> Any:
    compiled = compile_regex(_text(pattern))
    if isinstance(compiled, str):
        return error(f"invalid regular expression {pattern[:64]!r}: {compiled}")
    return compiled


def _matches(text: Any, pattern: Any) -> BoolType | CELEvalError:
    compiled = _regex(pattern)
    if isinstance(compiled, CELEvalError):
        return compiled
    return BoolType(compiled.search(_text(text)) is not None)


def _find(text: Any, pattern: Any) -> StringType | CELEvalError:
    compiled = _regex(pattern)
    if isinstance(compiled, CELEvalError):
        return compiled
    found = compiled.search(_text(text))
    return StringType(found.group(0) if found else "")


def _find_all(text: Any, pattern: Any, *limit: Any) -> ListType | CELEvalError:
    compiled = _regex(pattern)
    if isinstance(compiled, CELEvalError):
        return compiled
    count = _int(limit[0]) if limit else -1
    if count == 0:
        return ListType()
    found = [StringType(match.group(0)) for match in compiled.finditer(_text(text))]
    return ListType(found if count < 0 else found[:count])


# --- lists library (k8s), list extensions (cel-go ext/lists.go) and sets (ext/sets.go) ----------------------

def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except TypeError:
        return False


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError("takes a list")
    return value


def _is_sorted(items: Any) -> BoolType:
    items = _list(items)
    return BoolType(all(not (items[i] > items[i + 1]) for i in range(len(items) - 1)))


def _sum(items: Any) -> Any:
    items = _list(items)
    if not items:
        return IntType(0)
    total = items[0]
    for item in items[1:]:
        total = total + item
    return total


def _max(items: Any) -> Any:
    items = _list(items)
    return max(items) if items else error("max(list) on an empty list")


def _includes(target: Any, item: Any) -> BoolType:
    if isinstance(target, list):
        return BoolType(any(_equal(value, item) for value in target))
    return BoolType(_equal(target, item))


def _distinct(items: Any) -> ListType:
    kept: list[Any] = []
    for item in _list(items):
        if not any(_equal(item, seen) for seen in kept):
            kept.append(item)
    return ListType(kept)


def _flatten(items: Any, *depth: Any) -> ListType | CELEvalError:
    levels = _int(depth[0]) if depth else 1
    if levels < 0:
        return error("level must be non-negative")
    flat = list(_list(items))
    for _ in range(levels):
        flat = [inner for item in flat for inner in (item if isinstance(item, list) else [item])]
    return ListType(flat)


def _slice(items: Any, start: Any, end: Any) -> ListType | CELEvalError:
    items, begin, stop = _list(items), _int(start), _int(end)
    if not 0 <= begin <= stop <= len(items):
        return error(f"cannot slice({begin}, {stop}) a list of {len(items)}")
    return ListType(items[begin:stop])


def _set_contains(whole: Any, part: Any) -> BoolType:
    return BoolType(all(any(_equal(item, mine) for mine in _list(whole)) for item in _list(part)))


SETS: dict[str, Callable[..., Any]] = {
    "contains": _set_contains,
    "equivalent": lambda a, b: BoolType(_set_contains(a, b) and _set_contains(b, a)),
    "intersects": lambda a, b: BoolType(any(_equal(x, y) for x in _list(a) for y in _list(b))),
}
"""``sets.contains(list, list)``, ``sets.equivalent`` and ``sets.intersects``, called by namespace."""

FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quantity": _quantity, "isQuantity": _is_quantity, "sign": _sign, "isInteger": _is_integer,
    "asInteger": _as_integer, "asApproximateFloat": _as_approximate_float, "add": _add, "sub": _sub,
    "compareTo": lambda a, b: IntType(_compare(a, b)),
    "isGreaterThan": lambda a, b: BoolType(_compare(a, b) > 0),
    "isLessThan": lambda a, b: BoolType(_compare(a, b) < 0),
    "semver": _semver, "isSemver": _is_semver, "major": _part(0), "minor": _part(1), "patch": _part(2),
    "charAt": _char_at, "indexOf": _index_of, "lastIndexOf": _last_index_of,
    "lowerAscii": lambda text: StringType(_text(text).translate(_LOWER)),
    "upperAscii": lambda text: StringType(_text(text).translate(_UPPER)),
    "replace": _replace, "split": _split, "substring": _substring,
    "trim": lambda text: StringType(_text(text).strip(_GO_SPACE)), "join": _join,
    "matches": _matches, "find": _find, "findAll": _find_all,
    "isSorted": _is_sorted, "sum": _sum, "max": _max, "includes": _includes,
    "distinct": _distinct, "flatten": _flatten, "reverse": lambda items: ListType(_list(items)[::-1]),
    "slice": _slice, "sort": lambda items: ListType(sorted(_list(items))),
}
"""Every function this module adds, by name, for cel-python's activation."""

BUILTINS = frozenset({
    "size", "contains", "startsWith", "endsWith", "int", "uint", "double", "string", "bool",
    "bytes", "duration", "timestamp", "dyn", "type", "getDate", "getDayOfMonth", "getDayOfWeek",
    "getDayOfYear", "getFullYear", "getMonth", "getHours", "getMilliseconds", "getMinutes", "getSeconds",
    "min",
})
"""Standard CEL functions cel-python implements itself (``min`` is its macro for the lists library's
``min``)."""

MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})
SUPPORTED = frozenset(FUNCTIONS) | BUILTINS

KNOWN_UNSUPPORTED = frozenset({
    "format", "quote", "url", "isURL", "getScheme", "getHost", "getHostname", "getPort", "getEscapedPath",
    "getQuery", "ip", "isIP", "cidr", "isCIDR", "family", "isUnspecified", "isLoopback",
    "isLinkLocalMulticast", "isLinkLocalUnicast", "isGlobalUnicast", "prefixLength", "containsIP",
    "containsCIDR", "masked", "first", "last", "sortBy", "range", "of", "none", "ofNonZeroValue", "orValue",
    "or", "hasValue", "value", "optMap", "optFlatMap", "unwrapOpt", "transformList", "transformMap",
    "transformMapEntry", "existsOne", "allowed", "reason", "errored", "check", "path", "group", "resource",
    "subresource", "namespace", "name", "fieldSelector", "labelSelector", "serviceAccount", "validate",
    "named", "isNamed",
})
"""Functions of Kubernetes' CEL environment (URLs, IPs, CIDRs, format, optional types, authorizer, two-variable
comprehensions, ``lists.range`` ...) that kubecell's evaluator does not implement: refused by name."""
