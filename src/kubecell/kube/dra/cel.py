"""DRA device selectors: compiled once, checked and bounded, evaluated against published devices.

A selector is a CEL expression over one variable, ``device``, as kube-scheduler declares it
(``k8s.io/dynamic-resource-allocation/cel``, with the ``DRAConsumableCapacity`` gate on as in 1.37)::

    device.driver                       # "gpu.kubecell.io"
    device.attributes["gpu.kubecell.io"].model == "A100-SXM4-40GB"
    device.capacity["gpu.kubecell.io"].memory.compareTo(quantity("10Gi")) >= 0
    device.allowMultipleAllocations     # whether the device can be shared

``attributes`` and ``capacity`` map a domain to a map of names; a domain the device does not have reads
as an empty map (so ``device.attributes["other.io"].x`` fails on ``x``, as upstream). Version attributes are
semantic versions (``.isGreaterThan(semver("1.2.3"))``), capacities quantities.

The library is cel-python (pure Python, RE2 regular expressions as cel-go has). ``compile_selector``
parses, then ``cel_check`` refuses what Kubernetes or kubecell would not run (a ``SelectorError`` naming
the reason and position: syntax, an undeclared or unimplemented function, a result that cannot be bool,
nesting, an estimated cost above 1,000,000) and keeps up to ``COMPILE_CACHE`` expressions (LRU, and no more
than ``COMPILE_CACHE_NODES`` syntax-tree nodes in all: a tree costs about 1 KiB a node, and one 10 KiB
selector the API server accepts parses into 10,000 of them, so 1,024 such selectors held ~10 GiB). Input is
bounded first: ``CELSelectorExpressionMaxLength`` (10 KiB of UTF-8), as the API server checks.

Evaluation is bounded too: every step of cel-python's evaluator, and every 10 characters or elements of a
value it produces, spends one unit of ``MAX_COST``; a selector that spends them all fails with "actual
cost limit exceeded", as cel-go's run-time limit does. A selector that fails on a device (a missing
attribute, a wrong type, a result that is not a bool) raises ``SelectorError(kind="runtime")``: the
stock allocator treats such an error as fatal for the allocation it is computing (``selectorsMatch``
returns "CEL runtime error"), so callers must not read it as "no match". Results are memoized per
(expression, device content), ``RESULT_CACHE`` of them, keyed by a digest of the expression (not its up to
10 KiB of text) and by the device's values *with their types* (``True == 1`` in Python, not in CEL).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import lark
from celpy.celparser import CELParseError, CELParser
from celpy.celtypes import BoolType, IntType, ListType, MapType, StringType
from celpy.evaluation import Activation, CELEvalError, Evaluator

from kubecell.core.errors import InvalidInputError
from kubecell.kube.dra import cel_library
from kubecell.kube.dra.cel_check import MAX_COST, check
from kubecell.kube.dra.cel_library import FUNCTIONS, SETS
from kubecell.kube.dra.cel_tree import CheckError, Node, compact, ident_name
from kubecell.kube.dra.cel_types import Quantity, Semver

MAX_EXPRESSION_BYTES = 10 * 1024
"""``resourceapi.CELSelectorExpressionMaxLength``: the API server refuses longer selectors."""
COMPILE_CACHE = 1024
COMPILE_CACHE_NODES = 100_000
"""The most syntax-tree nodes the compiled selectors kept hold together (about 100 MiB): 1,024 selectors of
the usual kind (tens of nodes each) fit, ten of the largest the API server accepts do."""
RESULT_CACHE = 65_536

Scalar = int | bool | str | Semver
AttributeValue = Scalar | tuple[Scalar, ...]
"""A device attribute as CEL sees it: int, bool, string, version (``Semver``), or a list of one of them."""


class SelectorError(InvalidInputError):
    """A selector kubecell refuses or that failed on a device. ``kind`` is one of ``length``, ``syntax``,
    ``undeclared``, ``unsupported``, ``type``, ``depth``, ``cost`` (refused when compiled) or ``runtime``
    (failed on one device); ``reason`` says why, with the position when it has one."""

    def __init__(self, kind: str, reason: str, expression: str) -> None:
        shown = expression if len(expression) <= 120 else expression[:117] + "..."
        super().__init__(reason, location=f"CEL selector {shown!r}")
        self.kind = kind
        self.reason = reason
        self.expression = expression


@dataclass(frozen=True, slots=True)
class CelDevice:
    """What a selector sees of one device. Names are fully qualified (``gpu.kubecell.io/model``); hashable,
    so results can be memoized by content. Build it with ``CelDevice.of``."""

    driver: str
    attributes: tuple[tuple[str, AttributeValue], ...] = ()
    capacity: tuple[tuple[str, Decimal], ...] = ()
    allow_multiple_allocations: bool = False
    _value: list[MapType] = field(default_factory=list, compare=False, hash=False, repr=False)
    _key: list[Any] = field(default_factory=list, compare=False, hash=False, repr=False)

    @staticmethod
    def of(driver: str, attributes: Mapping[str, AttributeValue] | None = None,
           capacity: Mapping[str, Decimal] | None = None, *, allow_multiple_allocations: bool = False) -> CelDevice:
        """A device of ``driver``; names without a domain take the driver's, as in a ResourceSlice."""
        def qualified(name: str) -> str:
            return name if "/" in name else f"{driver}/{name}"
        return CelDevice(driver, tuple(sorted((qualified(k), v) for k, v in (attributes or {}).items())),
                         tuple(sorted((qualified(k), v) for k, v in (capacity or {}).items())),
                         allow_multiple_allocations)

    def cel_value(self) -> MapType:
        """The ``device`` variable (built once per device)."""
        if not self._value:
            self._value.append(MapType({
                StringType("driver"): StringType(self.driver),
                StringType("allowMultipleAllocations"): BoolType(self.allow_multiple_allocations),
                StringType("attributes"): _by_domain((name, _cel(value)) for name, value in self.attributes),
                StringType("capacity"): _by_domain((name, Quantity(value)) for name, value in self.capacity),
            }))
        return self._value[0]


class _Domains(MapType):
    """``device.attributes`` and ``device.capacity``: an unknown domain reads as an empty map."""

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str) and not dict.__contains__(self, key):
            return MapType()
        return super().__getitem__(key)


def _by_domain(items: Any) -> _Domains:
    domains: dict[str, dict[Any, Any]] = {}
    for name, value in items:
        domain, _, ident = name.partition("/")
        domains.setdefault(domain, {})[StringType(ident)] = value
    return _Domains({StringType(domain): MapType(names) for domain, names in domains.items()})


def _cel(value: AttributeValue) -> Any:
    if isinstance(value, tuple):
        return ListType(_cel(item) for item in value)
    if isinstance(value, bool):
        return BoolType(value)
    if isinstance(value, int):
        return IntType(value)
    if isinstance(value, str):
        return StringType(value)
    return value


class _CostExceededError(Exception):
    """Raised inside the evaluator when a selector has spent ``MAX_COST``."""


DEVICE_SECONDS = 0.05
"""The longest a selector may run on one device where a claim's clock is given (``Selector.matches``): a
selector of the usual kind takes under 1 ms a device."""


class _OutOfTimeError(Exception):
    """Raised inside the evaluator when the claim's time (``SelectorTimeoutError``) has run out."""


class SelectorTimeoutError(SelectorError):
    """The selectors of one claim ran past the time it is given over all the devices it is matched against.

    Why a clock besides the cost: ``MAX_COST`` is Kubernetes' budget, which cel-go runs through in
    milliseconds; this evaluator (pure Python) takes about 30 µs a step, so a 1 KB selector the cost check
    admits ran 6 s per device, on the scheduler's only loop: 47 s for one claim over 8 GPUs, nothing placed
    meanwhile for anyone, and a one-character change made it a new claim each time."""



class _Budget:
    __slots__ = ("compiled", "deadline", "left", "steps")

    def __init__(self, units: int, deadline: float | None = None) -> None:
        self.left = units
        self.steps = 0
        self.compiled = cel_library.compiled
        """Patterns compiled when the clock was last read: a compile since brings the next reading forward."""
        """Steps taken: the clock is read every 256 of them (``left`` also drops by a string's or list's
        size, so its low bits would skip the reading for as long as such values come)."""
        self.deadline = deadline
        """``time.monotonic()`` past which the evaluation stops (None: cost alone)."""


class _Evaluator(Evaluator):
    """cel-python's evaluator with a cost budget, ``cel.bind`` and ``sets.*`` (which it lacks)."""

    def __init__(self, ast: Node, activation: Activation, budget: _Budget) -> None:
        super().__init__(ast, activation)
        self.budget = budget

    def sub_evaluator(self, ast: Node) -> Evaluator:
        return _Evaluator(ast, self.activation, self.budget)

    def _visit_tree(self, tree: Node) -> Any:
        budget = self.budget
        budget.left -= 1
        budget.steps += 1
        if budget.deadline is not None and (not budget.steps & 255 or budget.compiled != cel_library.compiled):
            budget.compiled = cel_library.compiled
            if time.monotonic() > budget.deadline:
                raise _OutOfTimeError
        result = super()._visit_tree(tree)
        if isinstance(result, (str, bytes, list, dict)):
            budget.left -= len(result) // 10
        if budget.left < 0:
            raise _CostExceededError
        return result

    def member_dot_arg(self, tree: Node) -> Any:
        if str(tree.children[1]) in ("all", "exists"):
            return self._quantifier(tree)
        namespace = ident_name(tree.children[0])
        if namespace in ("cel", "sets") and not self._is_variable(namespace):
            name = str(tree.children[1])
            args = tree.children[2].children
            if namespace == "cel":
                return self._bind(args)
            values = [self.visit(arg) for arg in args]
            for value in values:
                if isinstance(value, CELEvalError):
                    return value
            try:
                return SETS[name](*values)
            except TypeError as problem:
                return CELEvalError("no such overload", TypeError, problem.args)
        return super().member_dot_arg(tree)

    def _quantifier(self, tree: Node) -> Any:
        """``all`` and ``exists`` joined by ``_and``/``_or`` (cel-python joins them with its own operators, whose
        errors grow exponentially: see ``_or``); every item is evaluated, as cel-python does and the cost
        estimate assumes."""
        items = self.visit(tree.children[0])
        if isinstance(items, CELEvalError):
            return items
        test = self.build_ss_macro_eval(tree)
        join, result = (_and, BoolType(True)) if str(tree.children[1]) == "all" else (_or, BoolType(False))
        for item in items:
            result = join(result, test(item))
        return result

    def _is_variable(self, name: str) -> bool:
        try:
            self.activation.resolve_variable(name)
        except KeyError:
            return False
        return True

    def _bind(self, args: list[Node]) -> Any:
        variable = ident_name(args[0])
        value = self.visit(args[1])
        if isinstance(value, CELEvalError) or variable is None:
            return value
        try:
            return self.sub_evaluator(args[2]).evaluate({variable: value})
        except CELEvalError as problem:
            return problem


def _joined(x: Any, y: Any, decides: bool) -> Any:
    """CEL's ``||`` (``decides`` True) or ``&&``: commutative over errors, so a side that decides absorbs an
    error on the other; else the first error. cel-python's own operators raise a TypeError holding the repr of
    both operands when neither is a bool, and an error's repr holds its cause's, escaped again at each level:
    the text doubled with every error joined, and ``[0, ..., 29].exists(x, 1 / (x - x) == 1)`` or a chain of
    100 errored comparisons took gigabytes."""
    if (isinstance(x, BoolType) and bool(x) is decides) or (isinstance(y, BoolType) and bool(y) is decides):
        return BoolType(decides)
    if isinstance(x, BoolType) and isinstance(y, BoolType):
        return BoolType(not decides)
    for side in (x, y):
        if isinstance(side, CELEvalError):
            return side
    return CELEvalError("no such overload", TypeError, ("_||_" if decides else "_&&_",))


def _or(x: Any, y: Any) -> Any:
    return _joined(x, y, True)


def _and(x: Any, y: Any) -> Any:
    return _joined(x, y, False)


_PARSER = CELParser(tree_class=lark.Tree)
_ACTIVATION = Activation(functions={**FUNCTIONS, "_||_": _or, "_&&_": _and})
_RESULTS: OrderedDict[tuple[bytes, Any], bool | SelectorError] = OrderedDict()
_RESULTS_LOCK = threading.Lock()


def _typed(value: Any) -> Any:
    """A value with its type, for a cache key: Python finds ``True == 1`` (and hashes them alike), CEL does not
    (``1 == true`` is an error), so a key without types would serve one device's answer to another."""
    if isinstance(value, tuple):
        return ("list", tuple(_typed(item) for item in value))
    return (type(value).__name__, value)


def _device_key(device: CelDevice) -> Any:
    """What a selector's result depends on: the device's values with their types (and nothing it keeps
    besides, such as its built CEL value)."""
    if not device._key:
        device._key.append((device.driver, device.allow_multiple_allocations,
                            tuple((name, _typed(value)) for name, value in device.attributes),
                            tuple((name, _typed(value)) for name, value in device.capacity)))
    return device._key[0]


@dataclass(frozen=True, slots=True, eq=False)
class Selector:
    """A compiled selector: ``matches(device)`` is True, False, or raises ``SelectorError(kind="runtime")``."""

    expression: str
    estimated_cost: int
    tree: Node = field(repr=False)
    nodes: int = 1
    """Nodes of ``tree``: its weight in the compile cache."""
    digest: bytes = field(default=b"", repr=False)
    """SHA-256 of ``expression``: the result cache's key, so the cache does not hold 65,536 expressions' text."""

    def knows(self, device: CelDevice) -> bool:
        """Whether the result on ``device`` is kept (``matches`` would take no time)."""
        with _RESULTS_LOCK:
            return (self.digest or _digest(self.expression), _device_key(device)) in _RESULTS

    def matches(self, device: CelDevice, deadline: float | None = None) -> bool:
        """Whether ``device`` passes; ``deadline`` (``time.monotonic()``): raise ``SelectorTimeoutError`` past it."""
        key = (self.digest or _digest(self.expression), _device_key(device))
        with _RESULTS_LOCK:
            known = _RESULTS.get(key)
            if known is not None:
                _RESULTS.move_to_end(key)
        if known is None:
            known, keep = self._evaluate(device, deadline)
            if keep:
                with _RESULTS_LOCK:
                    _RESULTS[key] = known
                    if len(_RESULTS) > RESULT_CACHE:
                        _RESULTS.popitem(last=False)
        if isinstance(known, SelectorError):
            raise known
        return known

    def _evaluate(self, device: CelDevice, deadline: float | None) -> tuple[bool | SelectorError, bool]:
        """The result and whether it depends on the device alone (a recursion error depends on the stack, a
        timeout on the claim's clock)."""
        def failed(reason: str) -> SelectorError:
            return SelectorError("runtime", f"failed on device {_name_of(device)}: {reason}", self.expression)
        if deadline is not None:
            deadline = min(deadline, time.monotonic() + DEVICE_SECONDS)
        try:
            result = _Evaluator(self.tree, _ACTIVATION, _Budget(MAX_COST, deadline)).evaluate(
                {"device": device.cel_value()})
        except _OutOfTimeError:
            out = SelectorTimeoutError("runtime", f"ran out of time on device {_name_of(device)}", self.expression)
            return out, False
        except CELEvalError as problem:
            return failed(_runtime_reason(problem)), True
        except _CostExceededError:
            return failed(f"actual cost limit exceeded (limit {MAX_COST})"), True
        except RecursionError:
            return failed("nested too deeply to evaluate"), False
        except Exception as problem:  # cel-python raises plain exceptions for some ill-typed values
            return failed(f"{type(problem).__name__}: {problem}"[:300]), True
        if not isinstance(result, BoolType):
            return failed(f"must evaluate to bool, not {_type_name(result)}"), True
        return bool(result), True


def _runtime_reason(problem: CELEvalError) -> str:
    """cel-go's words for the usual failures: "no such key: x" with the hint upstream adds to it."""
    reason = str(problem.args[0]) if problem.args else "evaluation error"
    if "no such key" in reason or "no such member" in reason:
        detail = problem.args[2] if len(problem.args) > 2 else None
        key = detail[0] if isinstance(detail, tuple) and detail else None
        if key is None and "'" in reason:
            key = reason.split("'")[1]
        return (f"no such key: {str(key)[:64] if key is not None else '?'}. consider using has() or 'in' to "
                "guard the check for optional fields (CEL optional chaining is not supported by kubecell)")
    return reason[:300]


def _name_of(device: CelDevice) -> str:
    uuid = dict(device.attributes).get(f"{device.driver}/uuid")
    return f"{device.driver} {uuid if uuid is not None else '(no uuid)'}"


def _type_name(value: Any) -> str:
    names = {BoolType: "bool", IntType: "int", StringType: "string", ListType: "list", MapType: "map",
             Quantity: "Quantity", Semver: "Semver"}
    for kind, name in names.items():
        if isinstance(value, kind):
            return name
    return type(value).__name__


def _digest(expression: str) -> bytes:
    return hashlib.sha256(expression.encode("utf-8", "surrogatepass")).digest()


def _count_nodes(tree: Node) -> int:
    """The nodes of a compiled tree (iteratively: a tree may be deeper than Python's stack)."""
    count, todo = 0, [tree]
    while todo:
        node = todo.pop()
        count += 1
        todo.extend(child for child in node.children if isinstance(child, lark.Tree))
    return count


_COMPILED: OrderedDict[str, tuple[Selector | SelectorError, int]] = OrderedDict()
_COMPILED_LOCK = threading.Lock()
_compiled_nodes = 0


def _compile(expression: str) -> Selector | SelectorError:
    """``_parse`` kept in an LRU of at most ``COMPILE_CACHE`` entries and ``COMPILE_CACHE_NODES`` tree nodes."""
    global _compiled_nodes
    with _COMPILED_LOCK:
        known = _COMPILED.get(expression)
        if known is not None:
            _COMPILED.move_to_end(expression)
            return known[0]
    compiled = _parse(expression)
    weight = compiled.nodes if isinstance(compiled, Selector) else 1
    if weight > COMPILE_CACHE_NODES:
        return compiled
    with _COMPILED_LOCK:
        if expression not in _COMPILED:
            _COMPILED[expression] = (compiled, weight)
            _compiled_nodes += weight
        while len(_COMPILED) > COMPILE_CACHE or _compiled_nodes > COMPILE_CACHE_NODES:
            _compiled_nodes -= _COMPILED.popitem(last=False)[1][1]
    return compiled


def _clear_caches() -> None:
    """Forget every compiled selector and result (for tests)."""
    global _compiled_nodes
    with _COMPILED_LOCK:
        _COMPILED.clear()
        _compiled_nodes = 0
    with _RESULTS_LOCK:
        _RESULTS.clear()


def _parse(expression: str) -> Selector | SelectorError:
    size = len(expression.encode("utf-8", "surrogatepass"))
    if size > MAX_EXPRESSION_BYTES:
        return SelectorError("length", f"is {size} bytes long; Kubernetes accepts at most {MAX_EXPRESSION_BYTES}",
                             expression)
    try:
        tree = _PARSER.parse(expression)
    except CELParseError as problem:
        where = f" at line {problem.line}, column {problem.column}" if problem.line else ""
        hint = " (optional syntax '.?' and '[?' is not supported by kubecell)" if (
            ".?" in expression or "[?" in expression) else ""
        return SelectorError("syntax", f"syntax error{where}{hint}: {str(problem.args[0]).strip()[:300]}",
                             expression)
    except Exception as problem:  # the lexer refuses some inputs with its own errors
        return SelectorError("syntax", f"syntax error: {type(problem).__name__}: {problem}"[:300], expression)
    try:
        tree = compact(tree)
        info = check(tree)
    except CheckError as problem:
        return SelectorError(problem.kind, str(problem), expression)
    except RecursionError:
        return SelectorError("depth", "nested too deeply", expression)
    return Selector(expression, info.cost, tree, _count_nodes(tree), _digest(expression))


def is_compiled(expression: str) -> bool:
    """Whether ``compile_selector(expression)`` is kept (would take no time): parsing one of the longest
    selectors takes 0.6-3.6 s here, which a caller on a clock may rather spend later."""
    with _COMPILED_LOCK:
        return expression in _COMPILED


def compile_selector(expression: str) -> Selector:
    """The compiled selector, from a cache of ``COMPILE_CACHE`` expressions; raises ``SelectorError`` for a
    selector kubecell refuses (the refusal is cached too)."""
    if not isinstance(expression, str):
        raise SelectorError("syntax", f"a selector is a string, not {type(expression).__name__}", repr(expression))
    compiled = _compile(expression)
    if isinstance(compiled, SelectorError):
        raise compiled
    return compiled


def device_matches(expression: str, device: CelDevice) -> bool:
    """Whether ``device`` matches the selector; raises ``SelectorError`` when it is refused or fails."""
    return compile_selector(expression).matches(device)
