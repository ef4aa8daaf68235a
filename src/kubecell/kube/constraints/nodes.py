"""Judging nodes for a pod whose constraints :mod:`kubecell.kube.constraints.spec` has read, and remembering
the answer.

This is the half of :mod:`kubecell.kube.constraints` that looks at nodes: :class:`PodConstraints` applies
the compiled tests to one node (:meth:`~PodConstraints.mismatch`) or to the whole node set
(:meth:`~PodConstraints.evaluate`, the loop that runs for every node of the cluster), the reasons are
worded as kube-scheduler words them, and :class:`ConstraintCache` keeps one answer per constraint
signature and node generation so that the members of a gang cost one evaluation.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from kubecell.kube.constraints.spec import _Term, _Toleration, read_constraints

NODE_AFFINITY_MISMATCH = "node(s) didn't match Pod's node affinity/selector"
"""NodeAffinity's ``ErrReasonPod``: a nodeSelector or required node affinity the node does not satisfy."""

BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
"""Taint effects that keep a pod off a node unless tolerated (``helper.DoNotScheduleTaintsFilterFunc``)."""

_NO_LABELS: Mapping[str, str] = {}

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
"""The taint of a cordoned node (``spec.unschedulable``), tolerated by pods that may still land there."""
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
"""The taint the node lifecycle controller puts on a node whose Ready condition is not True."""
UNSCHEDULABLE_REASON = "node(s) were unschedulable"
"""NodeUnschedulable's reason (``ErrReasonUnschedulable``)."""


def _not_ready(node: Mapping[str, Any]) -> bool:
    """A node that reports conditions, none of them Ready=True (a dict without conditions, as tests and
    hand-made objects have, is judged by its taints alone)."""
    conditions = (node.get("status") or {}).get("conditions") or ()
    if not conditions:
        return False
    return not any(isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True"
                   for c in conditions)


def node_taints(node: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    """A node's ``spec.taints`` as the scheduler judges them: a cordoned node (``spec.unschedulable``) also
    carries ``node.kubernetes.io/unschedulable:NoSchedule`` (kube-scheduler's NodeUnschedulable filter, which
    a pod passes by tolerating that taint), and a node that is not Ready ``node.kubernetes.io/not-ready:
    NoSchedule`` (what the node lifecycle controller adds; kubecell adds it itself, so a cluster without that
    controller never gets pods on a dead node). A taint already present is not added twice. Allocation-wise
    the scheduler also keeps both kinds of node out of the engine's free capacity; these taints are what
    tells a waiting pod why, in kube-scheduler's words."""
    spec = node.get("spec") or {}
    taints = spec.get("taints") or ()
    extra = []
    keys = {t.get("key") for t in taints if isinstance(t, Mapping)}
    if spec.get("unschedulable") and UNSCHEDULABLE_TAINT not in keys:
        extra.append({"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"})
    if _not_ready(node) and NOT_READY_TAINT not in keys:
        extra.append({"key": NOT_READY_TAINT, "effect": "NoSchedule"})
    return [*taints, *extra] if extra else taints


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


def tainted_nodes(nodes: Mapping[str, Mapping[str, Any]]) -> dict[str, Sequence[Mapping[str, Any]]]:
    """The ``spec.taints`` of every node in ``nodes`` with at least one ``NoSchedule``/``NoExecute`` taint;
    nodes with none are absent. Only these nodes can keep a pod without label constraints away."""
    found: dict[str, Sequence[Mapping[str, Any]]] = {}
    for name, node in nodes.items():
        taints = node_taints(node)
        if taints and any(t.get("effect") in BLOCKING_EFFECTS for t in taints):
            found[name] = taints
    return found


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
        selector, terms, tolerations = read_constraints(pod)
        return cls(selector, terms, tolerations)

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
                    UNSCHEDULABLE_REASON if key == UNSCHEDULABLE_TAINT else untolerated_taint_reason(key, value)
            if reason:
                return reason
        return None

    def mismatch(self, name: str, node: Mapping[str, Any]) -> str | None:
        """Why the pod may not use this node (taints first, as in kube-scheduler's plugin order), else None."""
        taints = node_taints(node)
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
            taints = node_taints(node)
            if taints:
                reason = taint_reason(taints)
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
