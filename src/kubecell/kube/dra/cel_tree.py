"""cel-python's parse tree of a selector, reshaped for evaluation and bounded in depth.

cel-python parses CEL with a Lark grammar that keeps every precedence level: ``true`` alone is nine
nested nodes (``expr > conditionalor > ... > primary > literal``), and its evaluator recurses about six
Python frames per node. ``compact`` drops the levels that only hand a value up and balances ``&&`` and
``||`` chains, which changes no value (CEL's logical operators are associative, errors included);
``check_depth`` then bounds what is left so that evaluation stays within Python's default recursion limit.
The tree is changed in place and walked without recursion.
"""

from __future__ import annotations

from typing import Any

import lark

Node = lark.Tree[Any]
"""A node of cel-python's parse tree."""


class CheckError(ValueError):
    """A refusal: ``kind`` (syntax, undeclared, unsupported, type, depth, cost), the reason and where."""

    def __init__(self, kind: str, reason: str, line: int | None = None, column: int | None = None) -> None:
        where = f" at line {line}, column {column}" if line is not None else ""
        super().__init__(f"{reason}{where}")
        self.kind = kind
        self.reason = reason
        self.line = line
        self.column = column


MAX_TREE_DEPTH = 120
"""The deepest (compacted) parse tree kubecell evaluates: cel-python's evaluator recurses about 6 Python
frames a level, so this stays within Python's default recursion limit (1,000) with room for the caller."""


def at(node: Node | lark.Token) -> tuple[int | None, int | None]:
    """Where a node starts in the expression (line, column), when the parser recorded it."""
    if isinstance(node, lark.Token):
        return node.line, node.column
    meta = node.meta
    return (getattr(meta, "line", None), getattr(meta, "column", None))


_PASS_THROUGH = frozenset({"expr", "conditionalor", "conditionaland", "relation", "addition", "multiplication",
                           "unary", "member"})


def _bottom(node: Node) -> Node:
    """The first node under a chain of one-child grammar levels (``expr > conditionalor > ... > member``) and
    parentheses that does something: each level only hands its child's value up."""
    while True:
        kids = node.children
        if len(kids) == 1 and isinstance(kids[0], lark.Tree) and (
                node.data in _PASS_THROUGH or (node.data == "primary" and kids[0].data == "paren_expr")):
            node = kids[0].children[0] if kids[0].data == "paren_expr" else kids[0]
        elif node.data == "paren_expr":
            node = kids[0]
        else:
            return node


def _balanced(node: Node) -> Node:
    """A chain ``a || b || c ...`` (or ``&&``) regrouped as a balanced tree: the same value, since CEL's
    logical operators are associative (errors included), at a logarithmic depth instead of a linear one."""
    operands: list[Node] = []
    left = node
    while left.data == node.data and len(left.children) == 2:
        operands.append(left.children[1])
        left = left.children[0]
    operands.append(_bottom(left))
    operands.reverse()

    def build(part: list[Node]) -> Node:
        if len(part) == 1:
            return part[0]
        middle = len(part) // 2
        return lark.Tree(node.data, [build(part[:middle]), build(part[middle:])], node.meta)
    return build(operands)


def compact(tree: Node) -> Node:
    """``tree`` without its pass-through levels and with logical chains balanced (changed in place, without
    recursion): cel-python evaluates it to the same value with about a tenth of the recursion, and the
    recursion is what bounds how deep a selector may nest."""
    def shaped(node: Node) -> Node:
        node = _bottom(node)
        if node.data in ("conditionalor", "conditionaland") and len(node.children) == 2:
            return _balanced(node)
        return node
    root = shaped(tree)
    stack = [root]
    while stack:
        node = stack.pop()
        for i, child in enumerate(node.children):
            if isinstance(child, lark.Tree):
                node.children[i] = child = shaped(child)
                stack.append(child)
    return root


def check_depth(tree: Node) -> None:
    """Refuse a parse tree deeper than ``MAX_TREE_DEPTH`` (walked without recursion)."""
    stack: list[tuple[Node, int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_TREE_DEPTH:
            line, column = at(node)
            raise CheckError("depth", f"nested too deeply (kubecell evaluates at most {MAX_TREE_DEPTH} levels "
                             "of its parse tree: about 40 nested calls or lists, 60 '+' in a row)", line, column)
        stack.extend((child, depth + 1) for child in node.children if isinstance(child, lark.Tree))


def ident_name(tree: Node) -> str | None:
    """The name when ``tree`` is nothing but an identifier (a macro's variable, a namespace)."""
    node: Node | lark.Token = tree
    while isinstance(node, lark.Tree) and len(node.children) == 1:
        if node.data == "ident":
            child = node.children[0]
            return str(child) if isinstance(child, lark.Token) else None
        node = node.children[0]
    return None


def unwrap(tree: Node) -> Node:
    """The node under a chain of one-child nodes (``primary > literal`` gives the literal)."""
    node = tree
    while len(node.children) == 1 and isinstance(node.children[0], lark.Tree) and node.data != "member_dot":
        node = node.children[0]
    return node
