"""Reading a pod's node constraints: its nodeSelector, required node affinity and tolerations, validated
field by field and compiled into small tests.

This is the half of :mod:`kubecell.kube.constraints` that looks only at the pod. Every malformed field
raises :class:`ConstraintError` naming the pod and the exact field, once, when the pod is read; what comes
out (the selector, the :class:`_Term` list, the :class:`_Toleration` list) can then be applied to
thousands of nodes without checking anything again, which :mod:`kubecell.kube.constraints.nodes` does.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubecell.core.errors import InvalidInputError

TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
FIELD_OPERATORS = ("In", "NotIn")
TOLERATION_OPERATORS = ("Equal", "Exists", "Lt", "Gt")
NODE_NAME_FIELD = "metadata.name"

_REQUIRED = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
_INT64 = re.compile(r"[+-]?[0-9]+")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")

LabelTest = Callable[[Mapping[str, Any]], bool]
NameTest = Callable[[str], bool]


class ConstraintError(InvalidInputError):
    """A pod's nodeSelector, node affinity or tolerations that cannot be evaluated (an unknown operator,
    a malformed term, a value of the wrong kind). ``location`` names the pod, ``field`` the exact field."""


def has_node_constraints(pod: Mapping[str, Any]) -> bool:
    """Whether the pod itself restricts its nodes: a non-empty nodeSelector or a required node affinity
    (even one without terms, which matches no node). Tolerations only lift restrictions, so they do not count."""
    spec = pod.get("spec") or {}
    if spec.get("nodeSelector"):
        return True
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    return node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") is not None


def _pod_location(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    name = meta.get("name") or meta.get("generateName") or "<unnamed>"
    namespace = meta.get("namespace")
    return f"pod {namespace}/{name}" if namespace else f"pod {name}"


def _parse_int64(text: str) -> int | None:
    """Go's ``strconv.ParseInt(text, 10, 64)``: ASCII digits with an optional sign, within int64, else None."""
    if not _INT64.fullmatch(text):
        return None
    number = int(text)
    return number if _INT64_MIN <= number <= _INT64_MAX else None


def _label_key_problem(key: str) -> str | None:
    """Why ``key`` is not a label key (``content.IsLabelKey``: optional DNS-subdomain prefix and '/'), else None."""
    parts = key.split("/")
    if len(parts) > 2:
        return "has more than one '/'"
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix:
            return "has an empty prefix before '/'"
        if len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix):
            return "has a prefix that is not a lowercase DNS subdomain of at most 253 characters"
    name = parts[-1]
    if not name:
        return "has an empty name part"
    if len(name) > 63:
        return "has a name part longer than 63 characters"
    if not _LABEL_NAME.fullmatch(name):
        return ("has a name part that is not alphanumeric characters, '-', '_' or '.' starting and ending "
                "with an alphanumeric character")
    return None


def _label_value_ok(value: str) -> bool:
    """``content.IsLabelValue``: empty, or at most 63 characters of ``[-A-Za-z0-9_.]`` with alphanumeric ends."""
    return not value or (len(value) <= 63 and _LABEL_NAME.fullmatch(value) is not None)


class _Reader:
    """Reads one pod's constraint fields, raising ConstraintError with the pod and the field path."""

    def __init__(self, pod: Mapping[str, Any]) -> None:
        self.location = _pod_location(pod)

    def fail(self, field: str, message: str, accepted: str | None = None) -> ConstraintError:
        return ConstraintError(message, location=self.location, field=field, accepted=accepted)

    def mapping(self, value: Any, field: str) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise self.fail(field, f"expected an object, got {type(value).__name__} {value!r}")
        return value

    def sequence(self, value: Any, field: str) -> Sequence[Any]:
        if value is None:
            return ()
        if isinstance(value, str | bytes) or not isinstance(value, Sequence):
            raise self.fail(field, f"expected a list, got {type(value).__name__} {value!r}")
        return value

    def string(self, value: Any, field: str) -> str:
        if value is None:
            return ""
        if not isinstance(value, str):
            raise self.fail(field, f"expected a string, got {type(value).__name__} {value!r}")
        return value

    def strings(self, value: Any, field: str) -> tuple[str, ...]:
        return tuple(self.string(item, f"{field}[{i}]") for i, item in enumerate(self.sequence(value, field)))


def _label_test(reader: _Reader, expression: Any, field: str) -> LabelTest:
    """One ``matchExpressions`` entry as a test of a node's labels (``labels.Requirement.Matches``)."""
    expression = reader.mapping(expression, field)
    key = reader.string(expression.get("key"), f"{field}.key")
    problem = _label_key_problem(key)
    if problem:
        raise reader.fail(f"{field}.key", f"{key!r} is not a valid label key: it {problem}",
                          accepted="'name' or 'prefix/name', e.g. 'nvidia.com/gpu.product'")
    operator = reader.string(expression.get("operator"), f"{field}.operator")
    if operator not in SELECTOR_OPERATORS:
        raise reader.fail(f"{field}.operator", f"unsupported operator {operator!r}",
                          accepted=", ".join(SELECTOR_OPERATORS))
    values = reader.strings(expression.get("values"), f"{field}.values")
    for i, value in enumerate(values):
        if not _label_value_ok(value):
            raise reader.fail(f"{field}.values[{i}]", f"{value!r} is not a valid label value",
                              accepted="'' or up to 63 of [-A-Za-z0-9_.] starting and ending alphanumeric")
    if operator in ("In", "NotIn"):
        if not values:
            raise reader.fail(f"{field}.values", f"operator {operator} needs at least one value")
        allowed = frozenset(values)
        if operator == "In":
            return lambda labels: labels.get(key) in allowed
        return lambda labels: labels.get(key) not in allowed   # a node without the label matches NotIn
    if operator in ("Exists", "DoesNotExist"):
        if values:
            raise reader.fail(f"{field}.values", f"operator {operator} takes no values, got {list(values)}")
        if operator == "Exists":
            return lambda labels: key in labels
        return lambda labels: key not in labels
    if operator in ("Gt", "Lt"):
        bound = _parse_int64(values[0]) if len(values) == 1 else None
        if bound is None:
            raise reader.fail(f"{field}.values", f"operator {operator} needs exactly one integer value, "
                              f"got {list(values)}", accepted="one decimal integer, e.g. ['4']")

        greater = operator == "Gt"
        seen: dict[Any, bool] = {}      # label value -> result: nodes repeat a few values ("8" GPUs)

        def compare(labels: Mapping[str, Any]) -> bool:
            text = labels.get(key)
            result = seen.get(text)
            if result is None:
                number = _parse_int64(text) if isinstance(text, str) else None   # unparseable: no match
                result = seen[text] = number is not None and (number > bound if greater else number < bound)
            return result

        return compare
    raise AssertionError(f"operator {operator!r} passed the check above but has no test")


def _name_test(reader: _Reader, requirement: Any, field: str) -> NameTest:
    """One ``matchFields`` entry as a test of the node's name (the only field a node selector may name)."""
    requirement = reader.mapping(requirement, field)
    key = reader.string(requirement.get("key"), f"{field}.key")
    if key != NODE_NAME_FIELD:
        raise reader.fail(f"{field}.key", f"unsupported field {key!r}", accepted=NODE_NAME_FIELD)
    operator = reader.string(requirement.get("operator"), f"{field}.operator")
    if operator not in FIELD_OPERATORS:
        raise reader.fail(f"{field}.operator", f"unsupported operator {operator!r} for matchFields",
                          accepted=", ".join(FIELD_OPERATORS))
    values = reader.strings(requirement.get("values"), f"{field}.values")
    if len(values) != 1:
        raise reader.fail(f"{field}.values", f"matchFields needs exactly one value, got {list(values)}")
    wanted = values[0]
    if operator == "In":
        return lambda name: name == wanted
    return lambda name: name != wanted


class _Term:
    """One node selector term: every label test and every name test must hold."""

    __slots__ = ("labels", "names")

    def __init__(self, labels: tuple[LabelTest, ...], names: tuple[NameTest, ...]) -> None:
        self.labels = labels
        self.names = names

    def matches(self, name: str, labels: Mapping[str, Any]) -> bool:
        for test in self.labels:
            if not test(labels):
                return False
        if self.names and name:     # upstream skips the fields of a node without a name; real nodes have one
            for name_test in self.names:
                if not name_test(name):
                    return False
        return True


class _Toleration:
    """One toleration, read once (``v1.Toleration.ToleratesTaint`` with the comparison-operator gate off)."""

    __slots__ = ("effect", "exists", "key", "never", "value")

    def __init__(self, reader: _Reader, raw: Any, field: str) -> None:
        raw = reader.mapping(raw, field)
        self.key = reader.string(raw.get("key"), f"{field}.key")
        self.value = reader.string(raw.get("value"), f"{field}.value")
        self.effect = reader.string(raw.get("effect"), f"{field}.effect")
        operator = reader.string(raw.get("operator"), f"{field}.operator") or "Equal"
        if operator not in TOLERATION_OPERATORS:
            raise reader.fail(f"{field}.operator", f"unsupported operator {operator!r}",
                              accepted=", ".join(TOLERATION_OPERATORS))
        if self.effect and self.effect not in TAINT_EFFECTS:
            raise reader.fail(f"{field}.effect", f"unknown taint effect {self.effect!r}",
                              accepted="'' (all effects), " + ", ".join(TAINT_EFFECTS))
        if not self.key and operator != "Exists":
            raise reader.fail(f"{field}.operator", f"a toleration without a key must use operator Exists, "
                              f"got {operator}", accepted="Exists (tolerates every taint), or set a key")
        self.exists = operator == "Exists"
        # Lt/Gt compare numbers only behind the alpha TaintTolerationComparisonOperators gate (off by
        # default in v1.37), and with the gate off such a toleration tolerates nothing.
        self.never = operator in ("Lt", "Gt")

    def tolerates(self, key: str, value: str, effect: str) -> bool:
        if self.never or (self.effect and self.effect != effect) or (self.key and self.key != key):
            return False
        return self.exists or self.value == value


def read_constraints(pod: Mapping[str, Any],
                     ) -> tuple[Mapping[str, Any], tuple[_Term, ...] | None, tuple[_Toleration, ...]]:
    """The pod's nodeSelector, required node selector terms (None without a required node affinity, ``()``
    for one no node matches) and tolerations, read and validated: ConstraintError names the first bad field."""
    reader = _Reader(pod)
    spec = reader.mapping(pod.get("spec"), "spec")
    selector = reader.mapping(spec.get("nodeSelector"), "spec.nodeSelector")
    for key, value in selector.items():
        reader.string(value, f"spec.nodeSelector.{key}")
    affinity = reader.mapping(spec.get("affinity"), "spec.affinity")
    node_affinity = reader.mapping(affinity.get("nodeAffinity"), "spec.affinity.nodeAffinity")
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    terms = None if required is None else _read_terms(reader, reader.mapping(required, _REQUIRED))
    tolerations = tuple(_Toleration(reader, raw, f"spec.tolerations[{i}]")
                        for i, raw in enumerate(reader.sequence(spec.get("tolerations"), "spec.tolerations")))
    return selector, terms, tolerations


def _read_terms(reader: _Reader, required: Mapping[str, Any]) -> tuple[_Term, ...]:
    terms = []
    field = f"{_REQUIRED}.nodeSelectorTerms"
    for i, raw in enumerate(reader.sequence(required.get("nodeSelectorTerms"), field)):
        term = reader.mapping(raw, f"{field}[{i}]")
        expressions = reader.sequence(term.get("matchExpressions"), f"{field}[{i}].matchExpressions")
        fields = reader.sequence(term.get("matchFields"), f"{field}[{i}].matchFields")
        labels = tuple(_label_test(reader, e, f"{field}[{i}].matchExpressions[{j}]")
                       for j, e in enumerate(expressions))
        names = tuple(_name_test(reader, f, f"{field}[{i}].matchFields[{j}]") for j, f in enumerate(fields))
        if labels or names:      # a term with neither selects no node, so it never makes a term list match
            terms.append(_Term(labels, names))
    return tuple(terms)
