"""Hostile YAML through the one reader and the tenant parser: whatever the text, ``YamlDocument`` and
``kubecell.inputs.tenants.parse_tenants`` return or raise ``InvalidInputError``, never anything else, and
quickly.

The scheduler reads the tenant ConfigMap from the API through exactly these two and catches
``InvalidInputError`` alone (so does ``kubecell inspect``): any other exception, or a read that takes
seconds, would stop the scheduler's rebuild on a ConfigMap edit. The text is built from what makes PyYAML
fail or hang: nesting, alias bombs and loops, huge integers, dates that do not exist, explicit tags on text
they cannot read, random YAML punctuation, and all of these inside an otherwise valid tenant file.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubecell.core.errors import InvalidInputError
from kubecell.core.topology import CellForest
from kubecell.inputs.bounded_yaml import BoundedLoader, YamlRefused
from kubecell.inputs.cluster import parse_cluster
from kubecell.inputs.tenants import parse_tenants
from kubecell.inputs.yaml_document import YamlDocument
from tests.support import RACKED_CLUSTER

HOSTILE = settings(max_examples=300, deadline=timedelta(seconds=2), derandomize=True,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                          HealthCheck.large_base_example])
"""Bounded so the file runs in a few seconds on two cores; ``derandomize`` makes every run try the same
examples. The deadline is each example's budget: milliseconds are typical, and a reader that converts a
5,000-digit number or walks an alias bomb takes seconds or forever."""

FOREST = CellForest(parse_cluster(YamlDocument("cluster.yaml", RACKED_CLUSTER)))
SOURCE = "configmap kubecell-system/kubecell-tenants key tenants.yaml"
MAX_MESSAGE = 4000
"""Messages quote values cut short, so none comes near this, whatever the input."""

# ---------------------------------------------------------------------------------------------- strategies

PUNCTUATION = "[]{}:,-?&*!|>'\"#%@`<=~. \n\t"
NOISE = st.text(alphabet=PUNCTUATION + "01239abexyzTZ_+", max_size=120)
"""Random YAML: mostly punctuation that opens, closes, anchors, aliases and tags."""

HUGE_INTEGER = st.builds(lambda sign, prefix, digits: f"{sign}{prefix}{digits}", st.sampled_from(["", "-", "+"]),
                         st.sampled_from(["", "0x", "0o", "0b", "0"]), st.integers(101, 6000).map(lambda n: "1" * n))
DATE = st.builds(lambda y, m, d: f"{y:04}-{m:02}-{d:02}", st.integers(0, 9999), st.integers(0, 99),
                 st.integers(0, 99))
TIMESTAMP = st.builds(lambda date, h, mi, s, tz: f"{date}T{h:02}:{mi:02}:{s:02}{tz}", DATE, st.integers(0, 99),
                      st.integers(0, 99), st.integers(0, 99),
                      st.sampled_from(["", "Z", "+99:00", "-24:00", "+23:59", ".123456789"]))
TAGGED = st.builds(lambda tag, value: f"!!{tag} {value}",
                   st.sampled_from(["int", "float", "bool", "null", "timestamp", "binary", "str", "set", "omap",
                                    "pairs", "merge", "value", "seq", "map", "python/object:os.system"]),
                   st.sampled_from(["''", "x", "-", "0b", "0x", "0o9", "1:", ".", "=", "[1]", "{a: 1}", "[[1]]",
                                    "[{a: 1, b: 2}]", "===", "1:2:3", "1e999", "2026-02-31", "~"]))
SCALAR = st.one_of(HUGE_INTEGER, DATE, TIMESTAMP, TAGGED, st.integers().map(str), NOISE)


def nested(depth: int, kind: str) -> str:
    opening, closing = {"list": ("[", "]"), "map": ("{a: ", "}"), "unclosed": ("[", ""),
                        "mixed": ("[{b: ", "}]")}[kind]
    return opening * depth + "1" + closing * depth


def bomb(levels: int, fanout: int, anchor_only_last: bool) -> str:
    lines = [f"l0: &l0 [{', '.join(['lol'] * fanout)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * fanout)}]" for i in range(1, levels + 1)]
    if anchor_only_last:
        lines.append(f"virtualClusters: {{vc: {{gpus: *l{levels}}}}}")
    return "\n".join(lines) + "\n"


def merges(levels: int, fanout: int) -> str:
    """Merge keys over aliases, each level merging the one before ``fanout`` times."""
    lines = ["m0: &m0 {a: 1, b: 2}"]
    lines += [f"m{i}: &m{i} {{<<: [{', '.join([f'*m{i - 1}'] * fanout)}], k{i}: {i}}}" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


LOOPS = st.sampled_from(["&a [*a]", "&a {b: *a}", "&a {b: [c, {d: *a}]}", "a: &a\n  b: *a\n", "&a [1, [2, *a]]",
                         "virtualClusters: &v\n  vc: {gpus: 8, x: *v}\n", "*a", "&a [1]\n---\n*a", "a: &a 1\nb: &a 2",
                         "? &k [*k]\n: 1\n", "&a\n<<: *a\n"])
DOCUMENT = st.one_of(
    st.builds(nested, st.integers(0, 3000), st.sampled_from(["list", "map", "unclosed", "mixed"])),
    st.integers(0, 150).map(lambda n: "".join(" " * i + "a:\n" for i in range(n)) + " " * n + "1\n"),
    st.builds(bomb, st.integers(1, 12), st.integers(1, 12), st.booleans()),
    st.builds(merges, st.integers(1, 10), st.integers(1, 10)),
    LOOPS,
    NOISE,
    st.lists(st.one_of(NOISE, SCALAR, LOOPS), max_size=6).map("\n".join),
)

FIELDS = ("gpus", "weight", "borrowLimitGpus", "cells", "priority")


def tenants_around(value: str, field: str, as_key: bool) -> str:
    """A tenant file that is valid but for ``value`` at one place (a VC's field, or a VC's name)."""
    if as_key:
        return f"virtualClusters:\n  vision:\n    gpus: 8\n  {value}:\n    gpus: 8\n"
    return f"virtualClusters:\n  vision:\n    gpus: 8\n  speech:\n    {field}: {value}\n"


TENANTS = st.builds(tenants_around, st.one_of(SCALAR, DOCUMENT.filter(lambda text: "\n" not in text)),
                    st.sampled_from(FIELDS), st.booleans())


def read(text: str) -> None:
    """Parse ``text`` as the scheduler parses the tenant ConfigMap; any error but ``InvalidInputError`` fails."""
    try:
        parse_tenants(YamlDocument(SOURCE, text), FOREST)
    except InvalidInputError as error:
        message = str(error)
        assert message.startswith(SOURCE), message
        assert len(message) < MAX_MESSAGE


# ---------------------------------------------------------------------------------------------- properties


@HOSTILE
@given(DOCUMENT)
def test_hostile_documents_raise_only_invalid_input_quickly(text: str) -> None:
    read(text)


@HOSTILE
@given(TENANTS)
def test_hostile_values_inside_a_tenant_file_raise_only_invalid_input_quickly(text: str) -> None:
    read(text)


@pytest.mark.parametrize(("words", "text"), [
    ("nests deeper than", nested(3000, "list")),
    ("once its aliases are expanded", bomb(9, 9, True)),
    ("inside the node &a it names", "&a [*a]"),
    ("has a number of 5000 characters", tenants_around("1" * 5000, "gpus", False)),
    ("has a date that does not exist", tenants_around("2026-02-31", "weight", True)),
    ("!!int cannot hold", tenants_around("!!int ''", "gpus", False)),
])
def test_the_strategies_reach_each_refusal(words: str, text: str) -> None:
    """The properties are only as strong as what they throw: each bound is hit by an example of its kind."""
    with pytest.raises(InvalidInputError, match=re.escape(words)):
        parse_tenants(YamlDocument(SOURCE, text), FOREST)


@pytest.mark.parametrize("kind", ["list", "map", "mixed", "unclosed"])
def test_deep_flow_nesting_is_refused_where_it_crosses_the_bound(kind: str) -> None:
    """Refusing deep nesting costs the bound, not the text: the scanner stops at the first level beyond it. (It
    used to read on: each ``[`` may start a key, so it looked ahead for a ``:`` while checking every open level
    on each token, and a pod's 16 KiB annotation of ``[`` cost the scheduler 0.3 s to refuse.)"""
    text = nested(8000, kind)
    loader = BoundedLoader(text)
    with pytest.raises(YamlRefused, match="nests deeper than 32 levels") as refused:
        loader.get_single_data()
    beyond = nested(BoundedLoader.max_depth + 1, kind).index("1")  # the openings up to one level beyond the bound
    assert loader.index <= beyond, f"the scanner read {loader.index} characters of {len(text)}"
    assert refused.value.problem_mark is not None
    assert refused.value.problem_mark.column < beyond
