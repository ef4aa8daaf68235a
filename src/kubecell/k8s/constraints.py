"""Which nodes a pod may use, judged as kube-scheduler's TaintToleration and NodeAffinity filters judge it.

A pod that says where it may run (``spec.nodeSelector``, required node affinity) must never be placed
elsewhere, and a node tainted ``NoSchedule``/``NoExecute`` takes only pods that tolerate the taint (GKE
and AKS taint every GPU node ``nvidia.com/gpu``). This module answers both questions on plain dicts with
the API's field names, the way the rest of ``kubecell.k8s`` reads objects, and knows nothing of the
allocation book or the engine:

.. code-block:: python

    pod = {"metadata": {"namespace": "ml", "name": "train-0"},
           "spec": {"nodeSelector": {"pool": "a100"},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}}
    nodes = {"n1": {"metadata": {"name": "n1", "labels": {"pool": "a100"}},
                    "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}},
             "n2": {"metadata": {"name": "n2", "labels": {"pool": "v100"}}}}
    allowed, reasons = allowed_nodes(pod, nodes)
    # allowed == frozenset({"n1"})
    # reasons == Counter({"node(s) didn't match Pod's node affinity/selector": 1})
    unavailable_message(len(nodes), reasons)   # when allowed is empty: "0/2 nodes are available: ..."

Semantics follow kube-scheduler v1.37 (``pkg/scheduler/framework/plugins/{tainttoleration,nodeaffinity}``
and ``k8s.io/component-helpers/scheduling/corev1``): taints are checked before affinity and a node
reports only the first filter it fails, as the default plugin order does; only ``NoSchedule`` and
``NoExecute`` taints filter (``PreferNoSchedule`` only scores); a ``nodeSelector`` and the required
node selector terms must both hold; terms are ORed, the expressions and fields of one term ANDed; an
empty term, and a required affinity with no terms, match no node; preferred affinity is ignored.

Where kubecell deliberately differs, it is stricter about malformed specs: kube-scheduler treats a term
it cannot parse as matching nothing (and ignores an unknown toleration operator), kubecell raises
:class:`ConstraintError` naming the pod and the field, so the user learns why the pod stays pending.
The API server rejects all of these at admission, so the difference shows only on hand-made objects.
The reasons are simpler too: a node outside a ``metadata.name In`` list counts as
``NODE_AFFINITY_MISMATCH``, where kube-scheduler's PreFilter reports such nodes as "didn't satisfy
plugin(s) [NodeAffinity]"; and an untolerated taint is named (see :func:`untolerated_taint_reason`).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubecell.core.errors import InvalidInputError

NODE_AFFINITY_MISMATCH = "node(s) didn't match Pod's node affinity/selector"
"""NodeAffinity's ``ErrReasonPod``: a nodeSelector or required node affinity the node does not satisfy."""

BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
"""Taint effects that keep a pod off a node unless tolerated (``helper.DoNotScheduleTaintsFilterFunc``)."""

TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
FIELD_OPERATORS = ("In", "NotIn")
TOLERATION_OPERATORS = ("Equal", "Exists", "Lt", "Gt")
NODE_NAME_FIELD = "metadata.name"
_NO_LABELS: Mapping[str, str] = {}

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


def untolerated_taint_reason(key: str, value: str) -> str:
    """TaintToleration's reason for a node with a taint the pod does not tolerate.

    kube-scheduler up to v1.33 named the first such taint (``{key: value}``) and later versions say only
    ``node(s) had untolerated taint(s)``; kubecell keeps the taint, which tells a user what to tolerate."""
    return f"node(s) had untolerated taint {{{key}: {value}}}"


def unavailable_message(total: int, reasons: Mapping[str, int]) -> str:
    """kube-scheduler's FitError text: ``0/5 nodes are available: 2 node(s) ..., 3 node(s) ....``

    Each reason is prefixed by its node count, and the strings are sorted as ``FitError.Error`` sorts them."""
    parts = sorted(f"{count} {reason}" for reason, count in reasons.items() if count)
    text = f"0/{total} nodes are available:"
    return f"{text} {', '.join(parts)}." if parts else text


def has_node_constraints(pod: Mapping[str, Any]) -> bool:
    """Whether the pod itself restricts its nodes: a non-empty nodeSelector or a required node affinity
    (even one without terms, which matches no node). Tolerations only lift restrictions, so they do not count."""
    spec = pod.get("spec") or {}
    if spec.get("nodeSelector"):
        return True
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    return node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") is not None


def tainted_nodes(nodes: Mapping[str, Mapping[str, Any]]) -> dict[str, Sequence[Mapping[str, Any]]]:
    """The ``spec.taints`` of every node in ``nodes`` with at least one ``NoSchedule``/``NoExecute`` taint;
    nodes with none are absent. Only these nodes can keep a pod without label constraints away."""
    found: dict[str, Sequence[Mapping[str, Any]]] = {}
    for name, node in nodes.items():
        spec = node.get("spec")
        taints = spec.get("taints") if spec else None
        if taints and any(t.get("effect") in BLOCKING_EFFECTS for t in taints):
            found[name] = taints
    return found


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


class PodConstraints:
    """A pod's nodeSelector, required node affinity and tolerations, validated and compiled once so that
    testing thousands of nodes costs a few dict lookups each. Build with :meth:`of`."""

    __slots__ = ("_tolerated", "selector", "terms", "tolerations")

    def __init__(self, selector: Mapping[str, str], terms: tuple[_Term, ...] | None,
                 tolerations: tuple[_Toleration, ...]) -> None:
        self.selector = dict(selector)
        self.terms = terms            # None: no required affinity; (): a required affinity no node matches
        self.tolerations = tolerations
        self._tolerated: dict[tuple[Any, Any, str], str] = {}   # (key, value, effect) -> reason, "" if tolerated

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> PodConstraints:
        """Read and validate the pod's constraints; ConstraintError names the first bad field."""
        reader = _Reader(pod)
        spec = reader.mapping(pod.get("spec"), "spec")
        selector = reader.mapping(spec.get("nodeSelector"), "spec.nodeSelector")
        for key, value in selector.items():
            reader.string(value, f"spec.nodeSelector.{key}")
        affinity = reader.mapping(spec.get("affinity"), "spec.affinity")
        node_affinity = reader.mapping(affinity.get("nodeAffinity"), "spec.affinity.nodeAffinity")
        required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
        terms = None if required is None else cls._terms(reader, reader.mapping(required, _REQUIRED))
        tolerations = tuple(_Toleration(reader, raw, f"spec.tolerations[{i}]")
                            for i, raw in enumerate(reader.sequence(spec.get("tolerations"), "spec.tolerations")))
        return cls(selector, terms, tolerations)

    @staticmethod
    def _terms(reader: _Reader, required: Mapping[str, Any]) -> tuple[_Term, ...]:
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

    @property
    def has_label_constraints(self) -> bool:
        """Whether a nodeSelector or a required node affinity applies (only taints matter otherwise)."""
        return bool(self.selector) or self.terms is not None

    def labels_match(self, name: str, labels: Mapping[str, Any]) -> bool:
        """NodeAffinity's filter: the nodeSelector and (when present) one of the required terms."""
        for key, value in self.selector.items():
            if labels.get(key) != value:
                return False
        terms = self.terms
        if terms is None:
            return True
        return any(term.matches(name, labels) for term in terms)

    def tolerates(self, key: str, value: str, effect: str) -> bool:
        """Whether some toleration of the pod tolerates the taint."""
        return any(t.tolerates(key, value, effect) for t in self.tolerations)

    def taint_reason(self, taints: Sequence[Mapping[str, Any]]) -> str | None:
        """The reason naming the first ``NoSchedule``/``NoExecute`` taint of ``taints`` (a node's
        ``spec.taints``, whose order decides which taint is named) not tolerated, else None. Memoised per
        distinct taint: a cluster has few, and a pod is tested against thousands of nodes."""
        memo = self._tolerated
        for taint in taints:
            effect = taint.get("effect")
            if effect not in BLOCKING_EFFECTS:
                continue
            signature = (taint.get("key"), taint.get("value"), effect)
            reason = memo.get(signature)
            if reason is None:
                key, value = str(signature[0] or ""), str(signature[1] or "")
                reason = memo[signature] = "" if self.tolerates(key, value, effect) else \
                    untolerated_taint_reason(key, value)
            if reason:
                return reason
        return None

    def mismatch(self, name: str, node: Mapping[str, Any]) -> str | None:
        """Why the pod may not use this node (taints first, as in kube-scheduler's plugin order), else None."""
        spec = node.get("spec")
        taints = spec.get("taints") if spec else None
        if taints:
            reason = self.taint_reason(taints)
            if reason:
                return reason
        if self.has_label_constraints:
            meta = node.get("metadata")
            labels = (meta.get("labels") if meta else None) or _NO_LABELS
            if not self.labels_match(name, labels):
                return NODE_AFFINITY_MISMATCH
        return None

    def evaluate(self, nodes: Mapping[str, Mapping[str, Any]],
                 tainted: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
                 ) -> tuple[frozenset[str] | None, Counter[str]]:
        """:func:`allowed_nodes` for compiled constraints; ``tainted`` is :func:`tainted_nodes` of ``nodes``
        when the caller already has it (otherwise it is found here when needed)."""
        reasons: Counter[str] = Counter()
        taint_reason = self.taint_reason
        if not self.has_label_constraints:
            # Only taints can exclude a node, and only tainted nodes need a look.
            excluded = set()
            for name, taints in (tainted_nodes(nodes) if tainted is None else tainted).items():
                reason = taint_reason(taints)
                if reason:
                    excluded.add(name)
                    reasons[reason] += 1
            if not excluded:
                return None, reasons
            return frozenset(nodes.keys() - excluded), reasons
        # The loop of mismatch(), inlined: this runs for every node of the cluster.
        selector = tuple(self.selector.items())
        terms = self.terms
        allowed = []
        for name, node in nodes.items():
            spec = node.get("spec")
            node_taints = spec.get("taints") if spec else None
            if node_taints:
                reason = taint_reason(node_taints)
                if reason:
                    reasons[reason] += 1
                    continue
            meta = node.get("metadata")
            labels = (meta.get("labels") if meta else None) or _NO_LABELS
            for key, value in selector:
                if labels.get(key) != value:
                    break
            else:
                if terms is None:
                    allowed.append(name)
                    continue
                for term in terms:
                    if term.matches(name, labels):
                        allowed.append(name)
                        break
                else:
                    reasons[NODE_AFFINITY_MISMATCH] += 1
                continue
            reasons[NODE_AFFINITY_MISMATCH] += 1
        return frozenset(allowed), reasons


def node_mismatch(pod: Mapping[str, Any], node: Mapping[str, Any]) -> str | None:
    """None when the pod may run on the node as far as taints, nodeSelector and required node affinity go,
    else kube-scheduler's reason (``NODE_AFFINITY_MISMATCH`` or :func:`untolerated_taint_reason`).

    Raises ConstraintError when the pod's constraints are malformed."""
    name = str((node.get("metadata") or {}).get("name") or "")
    return PodConstraints.of(pod).mismatch(name, node)


def allowed_nodes(pod: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any]],
                  ) -> tuple[frozenset[str] | None, Counter[str]]:
    """The names of the nodes (``nodes`` is keyed by node name) the pod may use, and how many nodes each
    reason excluded.

    The names are None when nothing restricts the pod: it has no nodeSelector and no required node affinity,
    and it tolerates every ``NoSchedule``/``NoExecute`` taint in ``nodes`` (trivially so when no node has
    one); the counter is then empty. Otherwise the names are a frozenset (possibly empty, possibly all nodes)
    and the counter adds up to the nodes outside it; :func:`unavailable_message` words it when it is empty.

    Raises ConstraintError when the pod's constraints are malformed."""
    return PodConstraints.of(pod).evaluate(nodes)


def constraint_signature(pod: Mapping[str, Any]) -> str:
    """A canonical JSON string of everything that decides :func:`allowed_nodes` for a pod: its nodeSelector,
    its required node affinity and its tolerations (without ``tolerationSeconds``, which only eviction reads).
    Pods with equal signatures are allowed the same nodes."""
    spec = pod.get("spec") or {}
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    tolerations = spec.get("tolerations") or []
    if isinstance(tolerations, list):
        tolerations = [{k: v for k, v in t.items() if k != "tolerationSeconds"} if isinstance(t, Mapping) else t
                       for t in tolerations]
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    return json.dumps([spec.get("nodeSelector") or {}, required, tolerations],
                      sort_keys=True, separators=(",", ":"), default=repr)


class ConstraintCache:
    """:func:`allowed_nodes` remembered per constraint signature, for one generation of the node set.

    Invalidation rule: the caller owns an integer ``generation`` and increments it whenever the node set
    it passes may answer differently: a node added or removed, or a node's labels, taints or name changed
    (incrementing on every Node event is correct, if less effective). Every call passes the current value;
    a call with a generation other than the previous call's empties the cache first. Within one generation
    the caller must pass the same nodes. Gang members and replicas share a signature
    (:func:`constraint_signature`), so a job's pods cost one evaluation; the tainted nodes are also found
    once per generation, which keeps the answer for a pod without a nodeSelector or affinity cheap.

    At most ``max_entries`` signatures are kept (the oldest goes first). Pods whose constraints are
    malformed raise ConstraintError on every call and are not remembered. Not thread-safe.
    """

    def __init__(self, max_entries: int = 1024) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}")
        self.max_entries = max_entries
        self.hits = 0
        self.misses = 0
        self._generation: int | None = None
        self._tainted: dict[str, Sequence[Mapping[str, Any]]] | None = None
        self._entries: dict[str, tuple[frozenset[str] | None, Counter[str]]] = {}

    def allowed_nodes(self, pod: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any]], generation: int,
                      ) -> tuple[frozenset[str] | None, Counter[str]]:
        """:func:`allowed_nodes`, from the cache when a pod with the same signature was asked this generation.
        The counter returned is the caller's own copy."""
        if generation != self._generation:
            self._generation = generation
            self._tainted = None
            self._entries.clear()
        signature = constraint_signature(pod)
        entry = self._entries.get(signature)
        if entry is None:
            self.misses += 1
            constraints = PodConstraints.of(pod)
            if self._tainted is None and not constraints.has_label_constraints:
                self._tainted = tainted_nodes(nodes)
            entry = constraints.evaluate(nodes, self._tainted)
            if len(self._entries) >= self.max_entries:
                del self._entries[next(iter(self._entries))]
            self._entries[signature] = entry
        else:
            self.hits += 1
        return entry[0], Counter(entry[1])
