"""YAML read with bounds: whatever the text, PyYAML ends in a ``yaml.YAMLError``, quickly.

PyYAML's safe loader is safe from code execution, not from text written to hurt whoever reads it. Other
readers' text reaches kubecell through it (the tenant ConfigMap, HiveD's pod annotation), and on such text
the safe loader itself fails in ways no caller expects:

* **nesting**: it composes and constructs recursively, so a few thousand ``[`` raise ``RecursionError``;
  and its scanner checks every open ``[`` on each token, so refusing them only once composed costs time
  quadratic in the nesting (up to 1,024 levels);
* **aliases**: ``*name`` repeats a node without repeating its text, so nine anchors of nine aliases each
  ("billion laughs") make a structure of 9^9 values from a few hundred characters, which hangs whoever walks
  it; an alias inside the node it names (``&a [*a]``) makes a structure that contains itself;
* **numbers**: Python's ``int`` refuses decimal text beyond 4,300 digits (``ValueError``);
* **dates**: ``2026-02-31`` matches YAML's timestamp pattern and ``datetime`` raises ``ValueError``;
* **explicit tags** on text they do not fit: ``!!int ''`` raises ``IndexError``, ``!!bool x`` ``KeyError``,
  ``!!timestamp x`` ``AttributeError``.

:class:`BoundedLoader` is the safe loader with each of these refused where it is, as a :class:`YamlRefused`
(a ``yaml.MarkedYAMLError``, so it carries the line and column and every caller that handles YAML errors
handles it): nesting beyond ``max_depth`` levels, a document of more than ``max_nodes`` nodes once its aliases
are expanded (each alias counts as the nodes it repeats; or, with ``aliases = False``, any alias), an alias
inside the node it names, integers of more than ``max_number_chars`` characters (checked before Python
converts them), dates that do not exist, and any value its tag's constructor cannot read. Expanded size and
depth are computed while composing, from each anchored node's size and height, so refusing a bomb costs the
text's length, never the expansion's.

The text's length is bounded by each caller before parsing (PyYAML's pure-Python parser reads roughly 100
KiB a second): the callers know their own sources' sizes, and their errors say which limit applies.
Subclasses set the limits as class attributes (``yaml.load`` takes a loader class).
"""

from __future__ import annotations

from typing import Any, ClassVar

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

_INT_TAG = "tag:yaml.org,2002:int"
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
_YAML_TAG_PREFIX = "tag:yaml.org,2002:"

_Mark = Any
"""A position in the text (``yaml.Mark``; the stubs also type events' marks as libyaml's, or None)."""


class YamlRefused(yaml.MarkedYAMLError):
    """What a bounded loader does not read (deep nesting, an alias bomb or loop, an integer of thousands of
    digits, a date that does not exist, a value its tag cannot hold), with where it is and what it accepts."""

    def __init__(self, problem: str, mark: _Mark, accepted: str) -> None:
        super().__init__(problem=problem, problem_mark=mark)
        self.accepted = accepted


def _tag(node: Node) -> str:
    """A tag as YAML writes it short (``!!int``), for messages."""
    tag = str(node.tag)
    return f"!!{tag.removeprefix(_YAML_TAG_PREFIX)}" if tag.startswith(_YAML_TAG_PREFIX) else tag


class BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with the bounds of the module docstring (defaults suit hand-written files)."""

    max_depth: ClassVar[int] = 32
    """The deepest nesting read (a scalar at the top is 1 level; each list or mapping adds one)."""
    max_nodes: ClassVar[int] = 65_536
    """The most nodes (scalars, lists and mappings, keys included) in a document with its aliases expanded."""
    max_number_chars: ClassVar[int] = 100
    """The longest integer converted, in characters."""
    aliases: ClassVar[bool] = True
    """Whether aliases are read at all (within ``max_nodes`` and ``max_depth`` once expanded)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0
        self.nodes = 0
        self._shapes: dict[int, tuple[int, int]] = {}
        """Size (nodes) and height (levels) of every node composed so far, by id, aliases expanded."""

    # -- composing: depth, aliases, size ------------------------------------------------------------------

    def _count(self, nodes: int, mark: _Mark, what: str) -> None:
        self.nodes += nodes
        if self.nodes > self.max_nodes:
            raise YamlRefused(f"holds more than {self.max_nodes} values{what}", mark,
                              f"at most {self.max_nodes} values (scalars, lists and mappings, keys included; an "
                              "alias counts as every value it repeats)")

    def _refused_depth(self, mark: _Mark, what: str = "") -> YamlRefused:
        return YamlRefused(f"nests deeper than {self.max_depth} levels{what}", mark,
                           f"at most {self.max_depth} levels of nested lists and mappings")

    def _alias(self) -> None:
        """Check the alias about to be composed: allowed at all, not inside its own node, and within the
        bounds once expanded where it stands."""
        event: yaml.AliasEvent = self.peek_event()  # type: ignore[no-untyped-call]
        if not self.aliases:
            raise YamlRefused(f"uses the YAML alias *{event.anchor}, which kubecell does not read here",
                              event.start_mark, "plain YAML without anchors and aliases")
        target = self.anchors.get(event.anchor)
        if target is None:
            return  # PyYAML's "found undefined alias"
        shape = self._shapes.get(id(target))
        if shape is None:  # anchored, not yet composed: the alias stands inside the node it names
            raise YamlRefused(f"uses the YAML alias *{event.anchor} inside the node &{event.anchor} it names "
                              "(a value that contains itself)", event.start_mark,
                              "aliases of nodes that are complete where the alias stands")
        size, height = shape
        if self.depth + height > self.max_depth:
            raise self._refused_depth(event.start_mark, f" once the alias *{event.anchor} is expanded")
        self._count(size, event.start_mark, f" once its aliases are expanded (at the alias *{event.anchor})")

    def fetch_flow_collection_start(self, TokenClass: Any) -> None:  # noqa: N803 (PyYAML's name)
        """Refuse a ``[`` or ``{`` nested deeper than ``max_depth`` as the scanner meets it. Composing would
        refuse it too, but later: each ``[`` may start a key, so the scanner reads ahead up to 1,024 characters
        to see whether a ``:`` follows, and checks every open level's key on each token it reads. Unchecked,
        a 16 KiB annotation of ``[`` took 0.3 s to refuse; this way, the first levels beyond the bound."""
        if self.flow_level >= self.max_depth:
            raise self._refused_depth(self.get_mark())
        super().fetch_flow_collection_start(TokenClass)

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(yaml.AliasEvent):
            self._alias()
            return super().compose_node(parent, index)
        mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
        self.depth += 1
        try:
            if self.depth > self.max_depth:
                raise self._refused_depth(mark)
            self._count(1, mark, "")
            node = super().compose_node(parent, index)
        finally:
            self.depth -= 1
        if node is not None:
            self._shapes[id(node)] = self._shape(node)
        return node

    def _shape(self, node: Node) -> tuple[int, int]:
        """Size and height of a node just composed, from its children's (each composed, or an alias's target)."""
        if isinstance(node, MappingNode):
            children = [child for pair in node.value for child in pair]
        elif isinstance(node, SequenceNode):
            children = list(node.value)
        else:
            return 1, 1
        shapes = [self._shapes.get(id(child), (1, 1)) for child in children]
        return 1 + sum(size for size, _ in shapes), 1 + max((height for _, height in shapes), default=0)

    # -- constructing: numbers, dates, whatever a tag's constructor raises -----------------------------------

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        """PyYAML's, with what a constructor raises other than a YAML error told as a ``YamlRefused`` at the
        node (the innermost node that failed, since children are constructed through here too)."""
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, TypeError, LookupError, AttributeError, ArithmeticError) as error:
            raise YamlRefused(f"has a value that {_tag(node)} cannot hold ({type(error).__name__}: "
                              f"{str(error)[:80]})", node.start_mark,
                              f"a value of the form {_tag(node)} describes") from None


def _scalar(node: Node) -> ScalarNode:
    if not isinstance(node, ScalarNode):  # the resolver gives int and timestamp tags to scalars only
        raise YamlRefused("has a number or date that is not a scalar", node.start_mark,
                          "!!int and !!timestamp on plain text only")
    return node


def _bounded_int(loader: BoundedLoader, node: Node) -> Any:
    """YAML's int, its text checked for length before Python converts it."""
    scalar = _scalar(node)
    chars = len(str(scalar.value))
    if chars > loader.max_number_chars:
        raise YamlRefused(f"has a number of {chars} characters, more than any field holds", node.start_mark,
                          f"integers of at most {loader.max_number_chars} characters")
    return loader.construct_yaml_int(scalar)


def _checked_timestamp(loader: BoundedLoader, node: Node) -> Any:
    """YAML's timestamp; a date that does not exist (``2026-02-31``) is a YAML error, not a ``ValueError``."""
    scalar = _scalar(node)
    if loader.timestamp_regexp.match(str(scalar.value)) is None:  # an explicit !!timestamp on other text
        raise YamlRefused("has a !!timestamp that is not a date", node.start_mark,
                          "a date such as 2026-02-28, optionally with a time")
    try:
        return loader.construct_yaml_timestamp(scalar)
    except ValueError as error:
        raise YamlRefused(f"has a date that does not exist ({error})", node.start_mark,
                          "a date that exists, such as 2026-02-28") from None


BoundedLoader.add_constructor(_INT_TAG, _bounded_int)
BoundedLoader.add_constructor(_TIMESTAMP_TAG, _checked_timestamp)
