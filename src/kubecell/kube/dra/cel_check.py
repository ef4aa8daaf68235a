"""What kubecell checks in a device selector before evaluating it: names, output type, nesting and cost.

cel-go type-checks a selector against declarations and estimates its worst-case cost before kube-scheduler
runs it; cel-python only parses. So this module walks cel-python's parse tree once per expression and
refuses, with the reason and the position, what Kubernetes would refuse or what kubecell cannot run:

* an identifier other than ``device`` and the variables macros and ``cel.bind`` introduce, a field of
  ``device`` that does not exist, a function Kubernetes does not declare ("undeclared reference", as
  cel-go words it), or one it declares that kubecell does not implement (named, with that reason);
* a result that cannot be a bool (``1``, ``device.driver``): "must evaluate to bool or the unknown type";
* a regular-expression literal RE2 does not compile (cel-go's ``ValidateRegexLiterals``);
* nesting deeper than ``MAX_TREE_DEPTH`` levels of the compacted parse tree (about 40 nested calls or
  list literals; parentheses cost nothing and ``&&``/``||`` chains are balanced first): cel-python
  evaluates recursively, within Python's default recursion limit; cel-go's own parser stops at 250;
* an estimated worst-case cost above ``CELSelectorExpressionMaxCost`` (1,000,000), which the API server
  also refuses. The estimate follows cel-go's model (one unit per access or call, string work by tenths
  of the length, comprehensions by the largest size of what they iterate: 32 attribute domains or names
  per device, 64-character attribute values), so nested comprehensions over literals are priced and refused
  as cel-go prices them; it is an approximation, not cel-go's exact number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import lark
from celpy.evaluation import Activation, Evaluator

from kubecell.kube.dra.cel_library import KNOWN_UNSUPPORTED, MACROS, SETS, SUPPORTED, compile_regex
from kubecell.kube.dra.cel_tree import CheckError, Node, at, check_depth, ident_name, unwrap

MAX_COST = 1_000_000
"""``resourceapi.CELSelectorExpressionMaxCost``: the estimated and the run-time limit of one selector."""
_CAP = 2**62
_UNKNOWN = 1024
"""The size assumed for a value nothing bounds (a dynamic value not read from the device)."""
_TYPE_NAMES = ("int", "uint", "double", "bool", "string", "bytes", "list", "map", "null_type", "type")
"""CEL's type identifiers (``type(x) == string``)."""
NAMESPACES = frozenset({"cel", "sets", "lists", "strings", "optional", "math", "base64", "regex"})


@dataclass(frozen=True, slots=True)
class Info:
    """What the checker knows of a sub-expression: its CEL type (``dyn`` when unknown), the worst-case cost
    of evaluating it, its largest size (length or element count; 1 for scalars), what iterating it binds
    (``item``: a list's element or a map's key) and what indexing it gives (``value``)."""

    type: str
    cost: int = 0
    size: int = 1
    item: Info | None = None
    value: Info | None = None

    def costing(self, cost: int) -> Info:
        return replace(self, cost=min(cost, _CAP))


_STRING = Info("string", size=64)
_ATTRIBUTE = Info("dyn", size=64, item=Info("dyn", size=64), value=Info("dyn", size=64))
_DEVICE_FIELDS = {
    "driver": Info("string", size=63),
    "allowMultipleAllocations": Info("bool"),
    "attributes": Info("map", size=32, item=Info("string", size=63),
                       value=Info("map", size=32, item=Info("string", size=32), value=_ATTRIBUTE)),
    "capacity": Info("map", size=32, item=Info("string", size=63),
                     value=Info("map", size=32, item=Info("string", size=32), value=Info("quantity"))),
}
_DYN = Info("dyn", size=_UNKNOWN)
_LITERALS = {"INT_LIT": "int", "UINT_LIT": "uint", "FLOAT_LIT": "double", "STRING_LIT": "string",
             "MLSTRING_LIT": "string", "BYTES_LIT": "bytes", "BOOL_LIT": "bool", "NULL_LIT": "null"}
_RELATIONS = {"relation_lt": "<", "relation_le": "<=", "relation_gt": ">", "relation_ge": ">=",
              "relation_eq": "==", "relation_ne": "!=", "relation_in": "in"}
_RETURNS = {
    **dict.fromkeys(["contains", "startsWith", "endsWith", "matches", "isQuantity", "isInteger",
                     "isGreaterThan", "isLessThan", "isSemver", "isSorted", "includes", "bool"], "bool"),
    **dict.fromkeys(["size", "sign", "asInteger", "compareTo", "major", "minor", "patch", "indexOf",
                     "lastIndexOf", "int", "getDate", "getDayOfMonth", "getDayOfWeek", "getDayOfYear",
                     "getFullYear", "getMonth", "getHours", "getMilliseconds", "getMinutes", "getSeconds"],
                    "int"),
    **dict.fromkeys(["charAt", "lowerAscii", "upperAscii", "replace", "substring", "trim", "join", "find",
                     "string"], "string"),
    **dict.fromkeys(["split", "findAll", "distinct", "flatten", "reverse", "slice", "sort"], "list"),
    "quantity": "quantity", "add": "quantity", "sub": "quantity", "semver": "semver", "uint": "uint",
    "double": "double", "asApproximateFloat": "double", "bytes": "bytes", "duration": "duration",
    "timestamp": "timestamp", "type": "type",
}
_TEXT_WORK = frozenset({"contains", "startsWith", "endsWith", "lowerAscii", "upperAscii", "trim", "indexOf",
                        "lastIndexOf", "charAt", "substring", "split", "replace", "string"})
_REGEX = frozenset({"matches", "find", "findAll"})
_BUILDS = frozenset({"replace", "join", "split", "flatten"})
"""Calls whose result may be far larger than what they read (``replace("", s)`` puts ``s`` between every two
characters, ``join`` repeats its separator, ``split("")`` makes a string of every character): charged for what
they build too, as the run time charges every value. Priced by their input alone, two replaces of 3,000
characters were admitted and built 27 billion characters in one step, before the budget is looked at."""
_LIST_WORK = frozenset({"isSorted", "sum", "min", "max", "includes", "distinct", "flatten", "reverse",
                        "slice", "sort", "join"})


def _tenth(size: int) -> int:
    return math.ceil(0.1 * size)


class _Checker:
    """One walk of a parse tree (depth already checked): the ``Info`` of every node, or a ``CheckError``."""

    def __init__(self) -> None:
        self.scope: dict[str, Info] = {"device": Info("device", size=4), **dict.fromkeys(_TYPE_NAMES, Info("type"))}

    def node(self, tree: Node) -> Info:
        kids: list[Any] = tree.children
        data = tree.data
        if data in ("member", "primary", "paren_expr") or (len(kids) == 1 and data in (
                "expr", "conditionalor", "conditionaland", "relation", "addition", "multiplication", "unary")):
            return self.node(kids[0])
        if data == "expr":
            cond, yes, no = (self.node(kid) for kid in kids)
            self._boolish(cond, kids[0], "a ternary's condition")
            kind = yes.type if yes.type == no.type else "dyn"
            return Info(kind, min(cond.cost + max(yes.cost, no.cost), _CAP), max(yes.size, no.size),
                        yes.item or no.item, yes.value or no.value)
        if data in ("conditionalor", "conditionaland"):
            left, right = self.node(kids[0]), self.node(kids[1])
            return Info("bool", min(left.cost + right.cost, _CAP))
        if data in ("relation", "addition", "multiplication"):
            operator = kids[0]
            left, right = self.node(operator.children[0]), self.node(kids[1])
            return self._binary(operator.data, left, right)
        if data == "unary":
            operand = self.node(kids[1])
            kind = "bool" if kids[0].data == "unary_not" else operand.type
            return Info(kind, min(operand.cost + 1, _CAP))
        if data == "member_dot":
            return self._select(self.node(kids[0]), str(kids[1]), kids[1])
        if data == "member_index":
            target, index = self.node(kids[0]), self.node(kids[1])
            found = self._select(target, None, tree)
            return found.costing(found.cost + index.cost)
        if data == "member_dot_arg":
            args = list(kids[2].children) if len(kids) == 3 else []
            return self._method(kids[0], kids[1], args)
        if data == "dot_ident_arg":
            raise CheckError("unsupported", "a leading-dot function call ('.f(x)') is not supported by kubecell",
                             *at(kids[0]))
        if data == "ident_arg":
            args = list(kids[1].children) if len(kids) == 2 else []
            return self._global(kids[0], args)
        if data in ("ident", "dot_ident"):
            name = str(kids[0])
            if name not in self.scope:
                raise CheckError("undeclared", f"undeclared reference to '{name}'", *at(kids[0]))
            return self.scope[name].costing(1)
        if data == "literal":
            value = _literal(tree)
            kind = _LITERALS.get(kids[0].type, "dyn")
            return Info(kind, 0, len(value) if isinstance(value, (str, bytes)) else 1)
        if data == "list_lit":
            items = [self.node(kid) for kid in kids[0].children] if kids else []
            return Info("list", min(10 + sum(i.cost for i in items), _CAP), max(len(items), 1),
                        _widest(items), _widest(items))
        if data == "map_lit":
            entries = [self.node(kid) for kid in kids[0].children] if kids else []
            keys, values = entries[0::2], entries[1::2]
            return Info("map", min(30 + sum(e.cost for e in entries), _CAP), max(len(keys), 1),
                        _widest(keys), _widest(values))
        line, column = at(tree)
        raise CheckError("unsupported", f"'{data}' (message construction) is not supported in a device "
                         "selector", line, column)

    def _boolish(self, info: Info, tree: Node, what: str) -> None:
        if info.type not in ("bool", "dyn"):
            raise CheckError("type", f"{what} must be a bool, not {info.type}", *at(tree))

    def _binary(self, operator: str, left: Info, right: Info) -> Info:
        cost = 1 + left.cost + right.cost
        if operator in _RELATIONS:
            if operator == "relation_in":
                cost += right.size if right.type in ("list", "dyn") else 1
            elif "string" in (left.type, right.type) or "bytes" in (left.type, right.type):
                cost += _tenth(min(left.size, right.size))
            return Info("bool", min(cost, _CAP))
        if operator == "addition_add" and {left.type, right.type} & {"string", "bytes", "list", "dyn"}:
            size = min(left.size + right.size, _CAP)
            kind = left.type if left.type == right.type else "dyn"
            return Info(kind, min(cost + _tenth(size), _CAP), size, left.item or right.item,
                        left.value or right.value)
        return Info(left.type if left.type == right.type else "dyn", min(cost, _CAP))

    def _select(self, target: Info, field: str | None, where: Node | lark.Token) -> Info:
        if target.type == "device":
            if field is None or field not in _DEVICE_FIELDS:
                shown = f"'{field}'" if field else "an index"
                raise CheckError("undeclared", f"undefined field {shown} of device (it has "
                                 f"{', '.join(sorted(_DEVICE_FIELDS))})", *at(where))
            return _DEVICE_FIELDS[field].costing(target.cost + 1)
        if target.type in ("map", "list") and target.value is not None:
            return target.value.costing(target.cost + 1)
        if target.type in ("map", "list", "dyn"):
            return _DYN.costing(target.cost + 1)
        raise CheckError("type", f"cannot select a field or index of a {target.type}", *at(where))

    def _method(self, target_tree: Node, name_token: lark.Token, args: list[Node]) -> Info:
        name = str(name_token)
        namespace = ident_name(target_tree)
        if namespace in NAMESPACES and namespace not in self.scope:
            return self._namespaced(namespace, name, name_token, args)
        if name in MACROS:
            return self._macro(self.node(target_tree), name, name_token, args)
        return self._call(name, name_token, self.node(target_tree), args)

    def _global(self, name_token: lark.Token, args: list[Node]) -> Info:
        name = str(name_token)
        if name == "has":
            if len(args) != 1 or unwrap(args[0]).data != "member_dot":
                raise CheckError("syntax", "has() takes one field selection such as has(a.b)", *at(name_token))
            selected = self.node(args[0])
            return Info("bool", selected.cost)
        if name == "dyn" and len(args) == 1:
            return replace(self.node(args[0]), type="dyn")
        return self._call(name, name_token, None, args)

    def _namespaced(self, namespace: str, name: str, token: lark.Token, args: list[Node]) -> Info:
        if namespace == "cel" and name == "bind":
            variable = ident_name(args[0]) if len(args) == 3 else None
            if variable is None:
                raise CheckError("syntax", "cel.bind takes a variable name, a value and an expression",
                                 *at(token))
            bound = self.node(args[1])
            saved = self.scope.get(variable)
            self.scope[variable] = bound.costing(0)
            try:
                body = self.node(args[2])
            finally:
                if saved is None:
                    del self.scope[variable]
                else:
                    self.scope[variable] = saved
            return body.costing(bound.cost + body.cost)
        if namespace == "sets" and name in SETS and len(args) == 2:
            left, right = (self.node(arg) for arg in args)
            return Info("bool", min(1 + left.cost + right.cost + left.size * right.size, _CAP))
        reason = "is not implemented by kubecell's selector evaluator"
        if namespace in ("cel", "sets"):
            reason = "is not a function of Kubernetes' CEL environment"
        raise CheckError("unsupported", f"'{namespace}.{name}' {reason}", *at(token))

    def _macro(self, target: Info, name: str, token: lark.Token, args: list[Node]) -> Info:
        variable = ident_name(args[0]) if args else None
        if (len(args) == 3 and name != "map") or len(args) not in (2, 3) or variable is None:
            raise CheckError("unsupported", f"{name}() takes a variable and an expression (two-variable "
                             "comprehensions are not supported by kubecell)", *at(token))
        if target.type not in ("list", "map", "dyn"):
            raise CheckError("type", f"{name}() iterates a list or a map, not a {target.type}", *at(token))
        saved = self.scope.get(variable)
        self.scope[variable] = (target.item or _DYN).costing(0)
        try:
            bodies = [self.node(arg) for arg in args[1:]]
        finally:
            if saved is None:
                del self.scope[variable]
            else:
                self.scope[variable] = saved
        predicates = bodies[:-1] if name == "map" else bodies
        for predicate in predicates:
            self._boolish(predicate, args[1], f"{name}()'s predicate")
        count = target.size
        cost = min(target.cost + 1 + count * (sum(body.cost for body in bodies) + 2), _CAP)
        if name == "map":
            return Info("list", cost, count, bodies[-1], bodies[-1])
        if name == "filter":
            return Info("list", cost, count, target.item, target.item)
        return Info("bool", cost)

    def _call(self, name: str, token: lark.Token, target: Info | None, arg_trees: list[Node]) -> Info:
        if name not in SUPPORTED:
            if name in KNOWN_UNSUPPORTED:
                raise CheckError("unsupported", f"'{name}' is part of Kubernetes' CEL environment but kubecell's "
                                 "selector evaluator does not implement it", *at(token))
            raise CheckError("undeclared", f"undeclared reference to '{name}'", *at(token))
        args = [self.node(arg) for arg in arg_trees]
        receiver = target or (args[0] if args else Info("null"))
        cost = 1 + (target.cost if target else 0) + sum(arg.cost for arg in args)
        if name in _REGEX:
            index = 0 if target else 1
            _check_regex(arg_trees[index] if len(arg_trees) > index else None)
            pattern_size = args[index].size if len(args) > index else 1
            cost += _tenth(receiver.size) * max(1, math.ceil(0.25 * pattern_size))
        elif name in _TEXT_WORK:
            cost += _tenth(receiver.size)
        elif name in _LIST_WORK:
            cost += receiver.size * (receiver.size if name == "distinct" else 1)
        kind = _RETURNS.get(name, "dyn")
        size = 1
        item: Info | None = None
        if kind in ("string", "list"):
            size, item = _result_size(name, receiver, args), _STRING
            if name in ("distinct", "reverse", "slice", "sort", "flatten"):
                item = receiver.item
            if name in _BUILDS:
                cost += _tenth(size)
        elif name in ("sum", "min", "max"):
            return (receiver.item or _DYN).costing(cost)
        return Info(kind, min(cost, _CAP), min(size, _CAP), item, item)


def _result_size(name: str, receiver: Info, args: list[Info]) -> int:
    if name == "replace" and len(args) >= 2:
        return (receiver.size + 1) * (args[-1 if len(args) == 2 else 1].size + 1)
    if name == "join":
        return receiver.size * ((receiver.item.size if receiver.item else _UNKNOWN) + (args[0].size if args else 0))
    if name == "flatten":
        return receiver.size * (receiver.item.size if receiver.item else _UNKNOWN)
    if name == "string":
        return receiver.size if receiver.type in ("string", "bytes", "dyn") else 32
    if name == "charAt":
        return 1
    return receiver.size + (1 if name in ("split", "findAll") else 0)


def _widest(items: list[Info]) -> Info | None:
    if not items:
        return None
    kinds = {item.type for item in items}
    widest = max(items, key=lambda item: item.size)
    return replace(widest, type=kinds.pop() if len(kinds) == 1 else "dyn", cost=0)


def _check_regex(pattern: Node | None) -> None:
    """A literal pattern must compile (cel-go refuses regular-expression literals that do not)."""
    literal = unwrap(pattern) if pattern is not None else None
    if literal is None or literal.data != "literal":
        return
    value = _literal(literal)
    if isinstance(value, str):
        compiled = compile_regex(value)
        if isinstance(compiled, str):
            raise CheckError("syntax", f"invalid regular expression {value[:64]!r}: {compiled}", *at(literal))


def _literal(tree: Node) -> object:
    """A literal's value as cel-python reads it, or a refusal (a bad escape, an int beyond 64 bits)."""
    try:
        value = Evaluator(tree, Activation()).evaluate()
    except Exception as problem:  # cel-python raises several kinds for a literal it cannot read
        reason = problem.args[0] if problem.args else type(problem).__name__
        raise CheckError("syntax", f"invalid literal: {reason}", *at(tree)) from None
    return value


def check(tree: Node) -> Info:
    """The checked ``Info`` of a selector's parse tree; raises ``CheckError`` with the reason and position."""
    check_depth(tree)
    info = _Checker().node(tree)
    if info.type not in ("bool", "dyn"):
        raise CheckError("type", f"must evaluate to bool or the unknown type, not {info.type}")
    if info.cost > MAX_COST:
        raise CheckError("cost", f"too complex, exceeds cost limit (estimated worst case "
                         f"{info.cost if info.cost < _CAP else 'unbounded'}, limit {MAX_COST})")
    return info

