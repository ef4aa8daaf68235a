"""Tables for kubecell.kube.constraints: nodeSelector, required node affinity and taints, as kube-scheduler.

Pure tests: no API server. The folder's conftest only starts the testbed for tests that ask for its
fixtures (``testbed``, ``kube``, ``namespace``, ``start_scheduler``); ``_no_cluster`` below fails any test
here that would.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

from kubecell.core.errors import KubecellError
from kubecell.kube.constraints import (
    NODE_AFFINITY_MISMATCH,
    ConstraintCache,
    ConstraintError,
    allowed_nodes,
    constraint_signature,
    has_node_constraints,
    node_mismatch,
    unavailable_message,
    untolerated_taint_reason,
)

CLUSTER_FIXTURES = {"testbed", "kube", "namespace", "start_scheduler"}


@pytest.fixture(autouse=True)
def _no_cluster(request: pytest.FixtureRequest) -> None:
    """These tests must stay pure: none may pull in the session's Kubernetes testbed."""
    used = CLUSTER_FIXTURES & set(request.fixturenames)
    assert not used, f"{request.node.name} uses cluster fixtures {sorted(used)}"


GPU_TAINT = untolerated_taint_reason("nvidia.com/gpu", "present")
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def node(name: str, labels: dict[str, str] | None = None, taints: list[dict[str, Any]] | None = None,
         ) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": name, "labels": labels or {}}, "spec": {}}
    if taints is not None:
        obj["spec"]["taints"] = taints
    return obj


def pod(*, selector: dict[str, str] | None = None, terms: list[dict[str, Any]] | None = None,
        tolerations: list[dict[str, Any]] | None = None, required: Any = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x"}]}
    if selector is not None:
        spec["nodeSelector"] = selector
    if terms is not None:
        required = {"nodeSelectorTerms": terms}
    if required is not None:
        spec["affinity"] = {"nodeAffinity": {REQUIRED: required}}
    if tolerations is not None:
        spec["tolerations"] = tolerations
    return {"metadata": {"namespace": "ml", "name": "train-0"}, "spec": spec}


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)}


def term(*expressions: dict[str, Any], fields: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {"matchExpressions": list(expressions)}
    if fields is not None:
        result["matchFields"] = fields
    return result


def taint(key: str, effect: str, value: str = "") -> dict[str, Any]:
    return {"key": key, "value": value, "effect": effect} if value else {"key": key, "effect": effect}


# --- node affinity operators -------------------------------------------------------------------------

LABELS = {"pool": "a100", "gpus": "8", "rack": "r1", "bad-number": "eight"}

OPERATOR_CASES = [
    # (expression, matches a node with LABELS)
    (expr("pool", "In", "a100"), True),
    (expr("pool", "In", "v100", "a100"), True),
    (expr("pool", "In", "v100"), False),
    (expr("zone", "In", "z1"), False),                 # a missing label never matches In
    (expr("pool", "NotIn", "v100"), True),
    (expr("pool", "NotIn", "a100", "v100"), False),
    (expr("zone", "NotIn", "z1"), True),               # a missing label matches NotIn
    (expr("pool", "Exists"), True),
    (expr("zone", "Exists"), False),
    (expr("pool", "DoesNotExist"), False),
    (expr("zone", "DoesNotExist"), True),
    (expr("gpus", "Gt", "7"), True),
    (expr("gpus", "Gt", "8"), False),
    (expr("gpus", "Lt", "9"), True),
    (expr("gpus", "Lt", "8"), False),
    (expr("gpus", "Gt", "0007"), True),                # integer comparison, not string comparison
    (expr("gpus", "Lt", "10"), True),                  # "8" < "10" as integers, not as strings
    (expr("zone", "Gt", "1"), False),                  # a missing label never matches Gt/Lt
    (expr("bad-number", "Gt", "1"), False),            # an unparseable label value does not match
    (expr("bad-number", "Lt", "1"), False),
]


@pytest.mark.parametrize(("expression", "matches"), OPERATOR_CASES,
                         ids=[f"{e['key']}-{e['operator']}-{'-'.join(e['values'])}" for e, _ in OPERATOR_CASES])
def test_operator(expression: dict[str, Any], matches: bool) -> None:
    result = node_mismatch(pod(terms=[term(expression)]), node("n1", LABELS))
    assert result == (None if matches else NODE_AFFINITY_MISMATCH)


@pytest.mark.parametrize(("label", "operator", "bound", "matches"), [
    ("-3", "Lt", "0", True),               # negative label values parse (Go's ParseInt takes a sign)
    ("+5", "Gt", "4", True),
    ("9223372036854775807", "Gt", "9223372036854775806", True),
    ("9223372036854775808", "Gt", "1", False),      # beyond int64: unparseable, so no match
    (" 5", "Gt", "1", False),                       # Go does not strip spaces
    ("5_0", "Gt", "1", False),                      # nor accept Python's digit separators
    ("٥", "Gt", "1", False),                        # nor non-ASCII digits
])
def test_gt_lt_parse_node_labels_as_go_int64(label: str, operator: str, bound: str, matches: bool) -> None:
    result = node_mismatch(pod(terms=[term(expr("n", operator, bound))]), node("n1", {"n": label}))
    assert result == (None if matches else NODE_AFFINITY_MISMATCH)


def test_expressions_of_one_term_are_anded_and_terms_ored() -> None:
    both = term(expr("pool", "In", "a100"), expr("rack", "In", "r2"))
    assert node_mismatch(pod(terms=[both]), node("n1", LABELS)) == NODE_AFFINITY_MISMATCH
    either = [term(expr("pool", "In", "v100")), term(expr("rack", "In", "r1"))]
    assert node_mismatch(pod(terms=either), node("n1", LABELS)) is None
    neither = [term(expr("pool", "In", "v100")), term(expr("rack", "In", "r9"))]
    assert node_mismatch(pod(terms=neither), node("n1", LABELS)) == NODE_AFFINITY_MISMATCH


@pytest.mark.parametrize(("fields", "name", "matches"), [
    ([{"key": "metadata.name", "operator": "In", "values": ["n1"]}], "n1", True),
    ([{"key": "metadata.name", "operator": "In", "values": ["n1"]}], "n2", False),
    ([{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}], "n1", False),
    ([{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}], "n2", True),
])
def test_match_fields_on_node_name(fields: list[dict[str, Any]], name: str, matches: bool) -> None:
    result = node_mismatch(pod(terms=[term(fields=fields)]), node(name, LABELS))
    assert result == (None if matches else NODE_AFFINITY_MISMATCH)


def test_match_fields_and_expressions_of_one_term_are_anded() -> None:
    pinned = term(expr("pool", "In", "a100"), fields=[{"key": "metadata.name", "operator": "In", "values": ["n1"]}])
    assert node_mismatch(pod(terms=[pinned]), node("n1", LABELS)) is None
    assert node_mismatch(pod(terms=[pinned]), node("n2", LABELS)) == NODE_AFFINITY_MISMATCH
    assert node_mismatch(pod(terms=[pinned]), node("n1", {"pool": "v100"})) == NODE_AFFINITY_MISMATCH


@pytest.mark.parametrize(("required", "case"), [
    ({"nodeSelectorTerms": []}, "no terms"),
    ({}, "no nodeSelectorTerms field"),
    ({"nodeSelectorTerms": [{}]}, "one empty term"),
    ({"nodeSelectorTerms": [{"matchExpressions": [], "matchFields": []}]}, "one term with empty lists"),
])
def test_required_affinity_without_a_usable_term_matches_no_node(required: dict[str, Any], case: str) -> None:
    # component-helpers nodeaffinity: "nil or empty term matches no objects", and no terms match nothing.
    assert node_mismatch(pod(required=required), node("n1", LABELS)) == NODE_AFFINITY_MISMATCH, case


def test_an_empty_term_does_not_spoil_a_matching_one() -> None:
    terms = [{}, term(expr("pool", "In", "a100"))]
    assert node_mismatch(pod(terms=terms), node("n1", LABELS)) is None


def test_preferred_affinity_is_ignored() -> None:
    soft = pod()
    soft["spec"]["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "preference": term(expr("pool", "In", "v100"))}]}}
    assert node_mismatch(soft, node("n1", LABELS)) is None
    assert not has_node_constraints(soft)
    assert allowed_nodes(soft, {"n1": node("n1", LABELS)}) == (None, Counter())


# --- nodeSelector ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("selector", "matches"), [
    ({"pool": "a100"}, True),
    ({"pool": "a100", "rack": "r1"}, True),
    ({"pool": "a100", "rack": "r2"}, False),          # every label must be equal
    ({"zone": "z1"}, False),
    ({"zone": ""}, False),                            # an empty value still needs the label
    ({"pool": "A100"}, False),                        # values are compared exactly
    ({}, True),
])
def test_node_selector(selector: dict[str, str], matches: bool) -> None:
    result = node_mismatch(pod(selector=selector), node("n1", LABELS))
    assert result == (None if matches else NODE_AFFINITY_MISMATCH)


def test_node_selector_and_affinity_must_both_hold() -> None:
    nodes = {"both": node("both", {"pool": "a100", "rack": "r1"}),
             "selector-only": node("selector-only", {"pool": "a100", "rack": "r2"}),
             "affinity-only": node("affinity-only", {"pool": "v100", "rack": "r1"})}
    constrained = pod(selector={"pool": "a100"}, terms=[term(expr("rack", "In", "r1"))])
    allowed, reasons = allowed_nodes(constrained, nodes)
    assert allowed == frozenset({"both"})
    assert reasons == Counter({NODE_AFFINITY_MISMATCH: 2})


def test_node_without_labels() -> None:
    bare = {"metadata": {"name": "n1"}}
    assert node_mismatch(pod(selector={"pool": "a100"}), bare) == NODE_AFFINITY_MISMATCH
    assert node_mismatch(pod(terms=[term(expr("pool", "DoesNotExist"))]), bare) is None


# --- taints and tolerations --------------------------------------------------------------------------

GPU_NODE = node("gpu", {"pool": "a100"}, [taint("nvidia.com/gpu", "NoSchedule", "present")])

TOLERATION_CASES = [
    # (tolerations, tolerated)
    ([], False),
    ([{"key": "nvidia.com/gpu", "operator": "Exists"}], True),
    ([{"key": "nvidia.com/gpu", "operator": "Exists", "value": "other"}], True),     # Exists ignores the value
    ([{"key": "nvidia.com/gpu", "operator": "Equal", "value": "present"}], True),
    ([{"key": "nvidia.com/gpu", "value": "present"}], True),                          # the default operator is Equal
    ([{"key": "nvidia.com/gpu", "operator": "Equal", "value": "absent"}], False),
    ([{"key": "nvidia.com/gpu", "operator": "Equal"}], False),                        # "" != "present"
    ([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}], True),
    ([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}], False),
    ([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "PreferNoSchedule"}], False),
    ([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": ""}], True),          # no effect: all effects
    ([{"operator": "Exists"}], True),                                                 # no key + Exists: everything
    ([{"key": "", "operator": "Exists", "effect": "NoSchedule"}], True),
    ([{"key": "", "operator": "Exists", "effect": "NoExecute"}], False),
    ([{"key": "other", "operator": "Exists"}], False),
    ([{"key": "other", "operator": "Exists"}, {"key": "nvidia.com/gpu", "operator": "Exists"}], True),
    ([{"key": "nvidia.com/gpu", "operator": "Exists", "tolerationSeconds": 30}], True),
    ([{"key": "nvidia.com/gpu", "operator": "Gt", "value": "1"}], False),             # comparison gate off
]


@pytest.mark.parametrize(("tolerations", "tolerated"), TOLERATION_CASES,
                         ids=[str(i) for i in range(len(TOLERATION_CASES))])
def test_toleration(tolerations: list[dict[str, Any]], tolerated: bool) -> None:
    result = node_mismatch(pod(tolerations=tolerations), GPU_NODE)
    assert result == (None if tolerated else "node(s) had untolerated taint {nvidia.com/gpu: present}")


@pytest.mark.parametrize("operator", ["Lt", "Gt"])
def test_comparison_tolerations_tolerate_nothing_with_the_alpha_gate_off(operator: str) -> None:
    # TaintTolerationComparisonOperators is alpha and off by default in v1.37: ToleratesTaint returns false.
    numbered = node("n", taints=[taint("gpu-generation", "NoSchedule", "8")])
    for value in ("8", "9", "7"):
        tolerations = [{"key": "gpu-generation", "operator": operator, "value": value}]
        assert node_mismatch(pod(tolerations=tolerations), numbered) == untolerated_taint_reason("gpu-generation", "8")


def test_no_execute_taints_filter_and_prefer_no_schedule_is_ignored() -> None:
    soft = node("soft", taints=[taint("spot", "PreferNoSchedule", "true")])
    hard = node("hard", taints=[taint("maintenance", "NoExecute")])
    assert node_mismatch(pod(), soft) is None
    assert node_mismatch(pod(), hard) == "node(s) had untolerated taint {maintenance: }"
    assert allowed_nodes(pod(), {"soft": soft}) == (None, Counter())


def test_reason_names_the_first_untolerated_taint_in_node_order() -> None:
    twice = node("n", taints=[taint("a", "NoSchedule", "1"), taint("b", "NoExecute", "2")])
    assert node_mismatch(pod(), twice) == untolerated_taint_reason("a", "1")
    tolerates_a = [{"key": "a", "operator": "Exists"}]
    assert node_mismatch(pod(tolerations=tolerates_a), twice) == untolerated_taint_reason("b", "2")
    tolerates_both = [*tolerates_a, {"key": "b", "value": "2"}]
    assert node_mismatch(pod(tolerations=tolerates_both), twice) is None


def test_taints_are_reported_before_affinity() -> None:
    # TaintToleration precedes NodeAffinity in the default plugin order, and a node reports its first failure.
    assert node_mismatch(pod(selector={"pool": "v100"}), GPU_NODE) == GPU_TAINT
    gpu = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert node_mismatch(pod(selector={"pool": "v100"}, tolerations=gpu), GPU_NODE) == NODE_AFFINITY_MISMATCH


# --- allowed_nodes -----------------------------------------------------------------------------------

def cluster() -> dict[str, dict[str, Any]]:
    gpu = [taint("nvidia.com/gpu", "NoSchedule", "present")]
    return {"a1": node("a1", {"pool": "a100"}, gpu), "a2": node("a2", {"pool": "a100"}, gpu),
            "v1": node("v1", {"pool": "v100"}, gpu), "cpu": node("cpu", {"pool": "cpu"}),
            "soft": node("soft", {"pool": "cpu"}, [taint("spot", "PreferNoSchedule")])}


def test_fast_path_returns_none_without_constraints_or_taints() -> None:
    untainted = {name: n for name, n in cluster().items() if name in ("cpu", "soft")}
    assert allowed_nodes(pod(), untainted) == (None, Counter())
    assert allowed_nodes(pod(selector={}), untainted) == (None, Counter())
    assert allowed_nodes(pod(), {}) == (None, Counter())


def test_none_when_every_taint_is_tolerated() -> None:
    allowed, reasons = allowed_nodes(pod(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}]), cluster())
    assert allowed is None
    assert reasons == Counter()


def test_a_selector_matching_every_node_still_returns_the_set() -> None:
    nodes = {"cpu": node("cpu", {"pool": "cpu"})}
    assert allowed_nodes(pod(selector={"pool": "cpu"}), nodes) == (frozenset({"cpu"}), Counter())


def test_taints_alone_exclude_the_untolerated_nodes() -> None:
    allowed, reasons = allowed_nodes(pod(), cluster())
    assert allowed == frozenset({"cpu", "soft"})
    assert reasons == Counter({GPU_TAINT: 3})


def test_reason_counts_and_message() -> None:
    gpu_pod = pod(selector={"pool": "h100"}, tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}])
    allowed, reasons = allowed_nodes(gpu_pod, cluster())
    assert allowed == frozenset()
    assert reasons == Counter({NODE_AFFINITY_MISMATCH: 5})
    plain = pod(selector={"pool": "a100"})
    allowed, reasons = allowed_nodes(plain, cluster())
    assert allowed == frozenset()
    assert reasons == Counter({GPU_TAINT: 3, NODE_AFFINITY_MISMATCH: 2})
    assert unavailable_message(5, reasons) == (
        "0/5 nodes are available: 2 node(s) didn't match Pod's node affinity/selector, "
        "3 node(s) had untolerated taint {nvidia.com/gpu: present}.")


def test_matching_pod_gets_exactly_its_nodes() -> None:
    gpu = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    allowed, reasons = allowed_nodes(pod(terms=[term(expr("pool", "In", "a100", "v100"))], tolerations=gpu),
                                     cluster())
    assert allowed == frozenset({"a1", "a2", "v1"})
    assert reasons == Counter({NODE_AFFINITY_MISMATCH: 2})


def test_has_node_constraints() -> None:
    assert not has_node_constraints(pod())
    assert not has_node_constraints(pod(selector={}, tolerations=[{"operator": "Exists"}]))
    assert has_node_constraints(pod(selector={"pool": "a100"}))
    assert has_node_constraints(pod(terms=[term(expr("pool", "Exists"))]))
    assert has_node_constraints(pod(required={"nodeSelectorTerms": []}))


# --- malformed pods ----------------------------------------------------------------------------------

TERM0 = f"spec.affinity.nodeAffinity.{REQUIRED}.nodeSelectorTerms[0]"

MALFORMED_CASES = [
    # (pod, field named in the error, words in the message)
    (pod(terms=[term(expr("pool", "Equals", "a100"))]), f"{TERM0}.matchExpressions[0].operator",
     "unsupported operator 'Equals' (accepted: In, NotIn, Exists, DoesNotExist, Gt, Lt)"),
    (pod(terms=[term(expr("pool", "In"))]), f"{TERM0}.matchExpressions[0].values", "at least one value"),
    (pod(terms=[term(expr("pool", "Exists", "a100"))]), f"{TERM0}.matchExpressions[0].values", "takes no values"),
    (pod(terms=[term(expr("gpus", "Gt", "4", "5"))]), f"{TERM0}.matchExpressions[0].values",
     "exactly one integer value"),
    (pod(terms=[term(expr("gpus", "Lt", "many"))]), f"{TERM0}.matchExpressions[0].values",
     "exactly one integer value"),
    (pod(terms=[term(expr("gpus", "Gt", "99999999999999999999"))]), f"{TERM0}.matchExpressions[0].values",
     "exactly one integer value"),
    (pod(terms=[term(expr("bad key!", "Exists"))]), f"{TERM0}.matchExpressions[0].key", "not a valid label key"),
    (pod(terms=[term(expr("Example.com/x", "Exists"))]), f"{TERM0}.matchExpressions[0].key", "prefix"),
    (pod(terms=[term(expr("", "Exists"))]), f"{TERM0}.matchExpressions[0].key", "empty name part"),
    (pod(terms=[term(expr("pool", "In", "not valid"))]), f"{TERM0}.matchExpressions[0].values[0]",
     "not a valid label value"),
    (pod(terms=[term(fields=[{"key": "metadata.namespace", "operator": "In", "values": ["x"]}])]),
     f"{TERM0}.matchFields[0].key", "unsupported field 'metadata.namespace' (accepted: metadata.name)"),
    (pod(terms=[term(fields=[{"key": "metadata.name", "operator": "Exists"}])]),
     f"{TERM0}.matchFields[0].operator", "(accepted: In, NotIn)"),
    (pod(terms=[term(fields=[{"key": "metadata.name", "operator": "In", "values": ["a", "b"]}])]),
     f"{TERM0}.matchFields[0].values", "exactly one value"),
    (pod(required={"nodeSelectorTerms": {"matchExpressions": []}}),
     f"spec.affinity.nodeAffinity.{REQUIRED}.nodeSelectorTerms", "expected a list"),
    (pod(required={"nodeSelectorTerms": ["pool=a100"]}), TERM0, "expected an object"),
    (pod(selector={"pool": 100}), "spec.nodeSelector.pool", "expected a string"),  # type: ignore[dict-item]
    (pod(tolerations=[{"key": "gpu", "operator": "Equals"}]), "spec.tolerations[0].operator",
     "unsupported operator 'Equals' (accepted: Equal, Exists, Lt, Gt)"),
    (pod(tolerations=[{"operator": "Exists"}, {"key": "", "value": "x"}]), "spec.tolerations[1].operator",
     "without a key must use operator Exists"),
    (pod(tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedul"}]), "spec.tolerations[0].effect",
     "unknown taint effect 'NoSchedul'"),
]


@pytest.mark.parametrize(("bad", "field", "words"), MALFORMED_CASES, ids=[c[1] for c in MALFORMED_CASES])
def test_malformed_pod_raises_constraint_error(bad: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(ConstraintError) as raised:
        allowed_nodes(bad, {"n1": node("n1", LABELS)})
    assert raised.value.field == field
    assert raised.value.location == "pod ml/train-0"
    assert words in str(raised.value)
    assert str(raised.value).startswith(f"pod ml/train-0: field '{field}': ")
    assert isinstance(raised.value, KubecellError)
    with pytest.raises(ConstraintError):
        node_mismatch(bad, node("n1", LABELS))


def test_malformed_term_raises_even_when_another_term_matches() -> None:
    # kube-scheduler would skip the bad term and match the good one; kubecell tells the user instead.
    terms = [term(expr("pool", "In", "a100")), term(expr("pool", "Like", "a*"))]
    with pytest.raises(ConstraintError, match=r"nodeSelectorTerms\[1\]\.matchExpressions\[0\]\.operator"):
        allowed_nodes(pod(terms=terms), {"n1": node("n1", LABELS)})


# --- the cache ---------------------------------------------------------------------------------------

def test_signature_ignores_key_order_and_toleration_seconds() -> None:
    first = pod(selector={"a": "1", "b": "2"}, tolerations=[{"key": "k", "operator": "Exists", "tolerationSeconds": 5}])
    second = pod(selector={"b": "2", "a": "1"}, tolerations=[{"operator": "Exists", "key": "k"}])
    assert constraint_signature(first) == constraint_signature(second)
    assert constraint_signature(pod()) != constraint_signature(pod(required={"nodeSelectorTerms": []}))
    assert constraint_signature(pod(selector={"a": "1"})) != constraint_signature(pod(selector={"a": "2"}))


def test_cache_hits_within_a_generation_and_is_emptied_by_a_new_one() -> None:
    cache = ConstraintCache()
    nodes = cluster()
    a100 = pod(selector={"pool": "a100"}, tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}])
    first = cache.allowed_nodes(a100, nodes, generation=1)
    assert first == (frozenset({"a1", "a2"}), Counter({NODE_AFFINITY_MISMATCH: 3}))
    first[1].clear()                                   # the caller's copy; the cached counts are untouched
    assert cache.allowed_nodes(a100, nodes, generation=1) == (frozenset({"a1", "a2"}),
                                                               Counter({NODE_AFFINITY_MISMATCH: 3}))
    assert (cache.hits, cache.misses) == (1, 1)
    nodes["a3"] = node("a3", {"pool": "a100"})
    assert cache.allowed_nodes(a100, nodes, generation=1)[0] == frozenset({"a1", "a2"})   # stale by contract
    assert cache.allowed_nodes(a100, nodes, generation=2)[0] == frozenset({"a1", "a2", "a3"})
    assert (cache.hits, cache.misses) == (2, 2)


def test_cache_refinds_taints_in_a_new_generation() -> None:
    cache = ConstraintCache()
    nodes = {"n1": node("n1")}
    assert cache.allowed_nodes(pod(), nodes, generation=1) == (None, Counter())
    nodes["n1"] = node("n1", taints=[taint("nvidia.com/gpu", "NoSchedule", "present")])
    assert cache.allowed_nodes(pod(), nodes, generation=2) == (frozenset(), Counter({GPU_TAINT: 1}))


def test_cache_keeps_at_most_max_entries() -> None:
    cache = ConstraintCache(max_entries=2)
    nodes = cluster()
    for pool in ("a100", "v100", "cpu"):
        cache.allowed_nodes(pod(selector={"pool": pool}), nodes, generation=1)
    cache.allowed_nodes(pod(selector={"pool": "a100"}), nodes, generation=1)   # the oldest was dropped
    assert (cache.hits, cache.misses) == (0, 4)
    cache.allowed_nodes(pod(selector={"pool": "cpu"}), nodes, generation=1)
    assert cache.hits == 1


def test_cache_does_not_remember_malformed_pods() -> None:
    cache = ConstraintCache()
    bad = pod(terms=[term(expr("pool", "Equals", "x"))])
    for _ in range(2):
        with pytest.raises(ConstraintError):
            cache.allowed_nodes(bad, cluster(), generation=1)
    assert cache.hits == 0


# --- cost --------------------------------------------------------------------------------------------

def big_cluster(count: int = 5000) -> dict[str, dict[str, Any]]:
    nodes = {}
    for i in range(count):
        labels = {"kubernetes.io/hostname": f"node-{i}", "pool": ("a100", "v100", "h100")[i % 3],
                  "topology.kubernetes.io/zone": f"z{i % 4}", "nvidia.com/gpu.count": "8"}
        taints = [taint("nvidia.com/gpu", "NoSchedule", "present")] if i % 2 else None
        nodes[f"node-{i}"] = node(f"node-{i}", labels, taints)
    return nodes


def best_of(repeat: int, call: Any) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def test_five_thousand_nodes_take_milliseconds() -> None:
    nodes = big_cluster()
    not_ready = {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                 "tolerationSeconds": 300}
    gpu: list[dict[str, Any]] = [{"key": "nvidia.com/gpu", "operator": "Exists"}, not_ready]
    selector_pod = pod(selector={"pool": "a100"}, tolerations=gpu)
    affinity_pod = pod(terms=[term(expr("pool", "In", "a100", "h100"), expr("nvidia.com/gpu.count", "Gt", "4"))],
                       tolerations=gpu)
    allowed, reasons = allowed_nodes(selector_pod, nodes)
    assert allowed is not None
    assert len(allowed) == 1667
    assert reasons == Counter({NODE_AFFINITY_MISMATCH: 3333})
    allowed, _ = allowed_nodes(affinity_pod, nodes)
    assert allowed is not None
    assert len(allowed) == 3333
    # Generous bounds (a loaded CI machine), still far below what a per-node re-parse of the pod would cost.
    assert best_of(5, lambda: allowed_nodes(selector_pod, nodes)) < 0.05
    assert best_of(5, lambda: allowed_nodes(affinity_pod, nodes)) < 0.1
    assert best_of(5, lambda: allowed_nodes(pod(tolerations=gpu), nodes)) < 0.05
