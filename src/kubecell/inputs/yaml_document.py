"""A YAML file read once, that can say where any key sits: the one reader of every YAML input.

Cluster descriptions, tenant configurations and conformance scenarios are hand-written YAML, and a
mistake in one must stop with ``file:line: key.path``, what is wrong and what is accepted. Two things
PyYAML does not do are done here for all of them:

* **Duplicate keys are rejected** at any depth, naming both lines. YAML's loaders keep the last value,
  so a virtual cluster written twice would silently lose its first guarantee, and a node group with two
  ``count`` keys would silently change size.
* **Every key path has a line.** The file is composed once into a node tree (which keeps the marks),
  the data is constructed from that same tree, and ``where(path)`` looks a path up in it. A *section*
  (``doc.section("cluster")``) is the same document seen from a key down, so a loader written for a
  whole file reports the right lines and the full key path when its input is embedded in another file.

Validation errors from pydantic are told through ``kubecell.core.validation`` (``doc.invalid``), the one
formatter the core uses too, so no loader leaks pydantic internals.

Not every text is hand-written by someone careful: the scheduler reads the tenant ConfigMap from the API, and
``kubecell inspect`` shows it, so the text may be written to hurt its reader. Whatever it is, a
``YamlDocument`` is built or an ``InvalidInputError`` raised, quickly: the text is at most
``MAX_YAML_CHARS`` characters, and it is read by ``kubecell.inputs.bounded_yaml.BoundedLoader`` (nesting,
alias expansion, integer length and dates bounded; see that module for why each).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from kubecell.core.errors import InvalidInputError
from kubecell.core.validation import KeyPath, explain_validation_error, key_path
from kubecell.inputs.bounded_yaml import BoundedLoader, YamlRefused

_MERGE_TAG = "tag:yaml.org,2002:merge"

MAX_YAML_CHARS = 128 * 1024
"""The longest YAML text read. The largest hand-written input kubecell ships is 3 KiB, and a tenant file of
3,000 virtual clusters fits. PyYAML's pure-Python parser reads 128 KiB in 0.05 s (comments, long strings) to
2 s (46,000 values nested 30 deep, the worst shape measured; a 3,000-VC tenant file takes 0.5 s): about the
most a scheduler rebuild should spend on the tenant ConfigMap, whose API limit (1 MiB) would cost 15 s."""
MAX_YAML_DEPTH = BoundedLoader.max_depth
"""The deepest nesting read: 32 levels (kubecell's inputs use at most 8; its Kubernetes manifests, 15)."""
MAX_YAML_NODES = BoundedLoader.max_nodes
"""The most values in a document with its aliases expanded: 65,536, about what ``MAX_YAML_CHARS`` can write
without aliases, so anchors and merge keys stay usable but never make a document larger than the text could."""
MAX_YAML_NUMBER_CHARS = BoundedLoader.max_number_chars
"""The longest integer converted: 100 characters hold an int64 in every notation YAML has (the longest, binary
with an underscore every four digits, is 82); every amount kubecell reads is below 2^63."""


class _DuplicateKey(Exception):  # noqa: N818 - internal signal, turned into an InvalidInputError
    def __init__(self, parts: list[str | int], key: str, mark: yaml.Mark, first: yaml.Mark) -> None:
        super().__init__(key)
        self.parts = parts
        self.key = key
        self.line = mark.line + 1
        # "line 4, column 9" only when both are on one line (a flow mapping such as {count: 4, count: 5})
        self.first = f"line {first.line + 1}" + (f", column {first.column + 1}" if first.line == mark.line else "")


class StrictLoader(BoundedLoader):
    """PyYAML's safe loader, bounded (``BoundedLoader``), that refuses a mapping with the same key twice
    (merge keys ``<<`` aside: overriding a merged value is what they are for)."""

    def compose_document(self) -> yaml.Node | None:
        node: yaml.Node | None = super().compose_document()
        if node is not None:
            self._reject_duplicate_keys(node)
        return node

    def _key(self, node: yaml.Node) -> object:
        """A key as its value (``1`` and ``0x1`` are the same key), or its text when it is not hashable.

        A key the bounded loader refuses (a date that does not exist) is refused here, where it is first
        constructed; one PyYAML cannot construct is left for the document's construction to report."""
        deep = self.deep_construct
        try:
            value = self.construct_object(node, deep=True)
            hash(value)
        except YamlRefused:
            raise
        except (yaml.YAMLError, TypeError):
            # construct_object leaves its bookkeeping as it was when it failed: the document is constructed
            # later, and must not see this key as a recursive node
            self.recursive_objects.clear()
            return ("text", node.value if isinstance(node, yaml.ScalarNode) else id(node))
        finally:
            self.deep_construct = deep
        return value

    def _reject_duplicate_keys(self, root: yaml.Node) -> None:
        """Walk the tree in file order (depth first), each node once (aliases share nodes)."""
        seen_nodes: set[int] = set()
        stack: list[tuple[yaml.Node, list[str | int]]] = [(root, [])]
        while stack:
            node, parts = stack.pop()
            if id(node) in seen_nodes:  # an alias of a node already checked (or a recursive one)
                continue
            seen_nodes.add(id(node))
            children: list[tuple[yaml.Node, list[str | int]]] = []
            if isinstance(node, yaml.MappingNode):
                first: dict[object, yaml.Node] = {}
                for key_node, value_node in node.value:
                    if key_node.tag == _MERGE_TAG:
                        children.append((value_node, parts))
                        continue
                    key = self._key(key_node)
                    text = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else str(key)
                    if key in first:
                        raise _DuplicateKey([*parts, text], text, key_node.start_mark, first[key].start_mark)
                    first[key] = key_node
                    children.append((value_node, [*parts, text]))
            elif isinstance(node, yaml.SequenceNode):
                children = [(child, [*parts, index]) for index, child in enumerate(node.value)]
            stack.extend(reversed(children))


def yaml_line(root: yaml.Node | None, parts: KeyPath) -> int | None:
    """The 1-based line of the deepest node of ``parts`` present in a composed YAML tree."""
    node = root
    line = None if node is None else node.start_mark.line + 1
    for part in parts:
        child: yaml.Node | None = None
        if isinstance(node, yaml.MappingNode):
            # the last key of that name: constructing the data put the pairs of merge keys (<<) first in
            # the mapping, and a key of the mapping's own, written after them, is the one whose value counts
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                    child = value
                    line = key.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            child = node.value[part]
            line = child.start_mark.line + 1
        if child is None:
            break
        node = child
    return line


class YamlDocument:
    """A parsed YAML file (or a section of one): its data, and the line of any key path in it."""

    path: Path
    data: Any
    root: yaml.Node | None
    prefix: tuple[str | int, ...]
    """Key path of this section in the file (empty for the whole file)."""

    def __init__(self, path: str | Path, text: str) -> None:
        self.path = Path(path)
        self.prefix = ()
        if len(text) > MAX_YAML_CHARS:
            raise InvalidInputError(f"is {len(text)} characters long", location=str(self.path),
                                    accepted=f"YAML of at most {MAX_YAML_CHARS} characters")
        loader: StrictLoader | None = None
        try:
            loader = StrictLoader(text)  # PyYAML's reader refuses characters YAML does not allow here
            self.root = loader.get_single_node()
            self.data = None if self.root is None else loader.construct_document(self.root)
        except _DuplicateKey as duplicate:
            raise InvalidInputError(
                f"duplicate key {duplicate.key!r} (first defined at {duplicate.first})",
                location=f"{self.path}:{duplicate.line}: {key_path(duplicate.parts)}",
                accepted="each key once in a mapping") from None
        except YamlRefused as refused:
            raise InvalidInputError(str(refused.problem), location=self._at(refused.problem_mark),
                                    accepted=refused.accepted) from None
        except yaml.reader.ReaderError as error:  # a character YAML does not allow: no mark, a position
            line = text.count("\n", 0, error.position) + 1
            raise InvalidInputError(f"not valid YAML: {str(error).splitlines()[0]}",
                                    location=f"{self.path}:{line}") from None
        except yaml.YAMLError as error:
            problem = getattr(error, "problem", None) or str(error).splitlines()[0]
            raise InvalidInputError(f"not valid YAML: {problem}",
                                    location=self._at(getattr(error, "problem_mark", None))) from None
        except (ValueError, RecursionError) as error:  # a backstop: the loader's bounds come first
            raise InvalidInputError(f"could not be read as YAML ({type(error).__name__})", location=str(self.path),
                                    accepted=f"YAML nested at most {MAX_YAML_DEPTH} levels, of at most "
                                    f"{MAX_YAML_NODES} values with aliases expanded") from None
        finally:
            if loader is not None:
                loader.dispose()

    def _at(self, mark: yaml.Mark | None) -> str:
        return f"{self.path}:{mark.line + 1}" if mark is not None else str(self.path)

    @classmethod
    def read(cls, path: str | Path) -> YamlDocument:
        """Read and parse a UTF-8 YAML file; every way of not being one is an ``InvalidInputError``."""
        path = Path(path)
        if path.is_dir():
            raise InvalidInputError("is a directory, expected a YAML file", location=str(path))
        if not path.exists():
            raise InvalidInputError("file not found", location=str(path))
        try:
            with path.open(encoding="utf-8") as file:  # never more than one character past the bound
                text = file.read(MAX_YAML_CHARS + 1)
        except UnicodeDecodeError:
            raise InvalidInputError("not a UTF-8 text file", location=str(path),
                                    accepted="a YAML text file encoded as UTF-8") from None
        except OSError as error:
            raise InvalidInputError(f"cannot read file: {error.strerror}", location=str(path)) from None
        if len(text) > MAX_YAML_CHARS:
            raise InvalidInputError(f"is more than {MAX_YAML_CHARS} characters long", location=str(path),
                                    accepted=f"YAML of at most {MAX_YAML_CHARS} characters")
        return cls(path, text)

    def section(self, *parts: str | int) -> YamlDocument:
        """The document seen from ``parts`` down: its data is the value there (``None`` when absent), and
        its locations carry the file's lines and the full key path."""
        view = object.__new__(YamlDocument)
        view.path, view.root, view.prefix = self.path, self.root, (*self.prefix, *parts)
        data = self.data
        for part in parts:
            if isinstance(data, Mapping):
                data = data.get(part)
            elif isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data):
                data = data[part]
            else:
                data = None
        view.data = data
        return view

    def line(self, parts: KeyPath = ()) -> int | None:
        """The line of ``parts`` (or of the deepest part of it present in the file)."""
        return yaml_line(self.root, (*self.prefix, *parts))

    def where(self, parts: KeyPath = ()) -> str:
        """``file:line: key.path`` (the line of the deepest part of the path that exists)."""
        full = (*self.prefix, *parts)
        line = yaml_line(self.root, full)
        head = f"{self.path}:{line}" if line is not None else str(self.path)
        return f"{head}: {key_path(full)}" if full else head

    def invalid(self, error: ValidationError, *, accepted: Mapping[str, str] | None = None,
                keys: Callable[[Sequence[str | int]], str] | str = "") -> InvalidInputError:
        """A pydantic error about this document's data, told with file, line, key path and what is
        accepted (see ``kubecell.core.validation.explain_validation_error``)."""
        return explain_validation_error(error, self.data, self.where, accepted=accepted, keys=keys)
