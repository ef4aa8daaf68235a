"""Which nodes a pod may use, judged as kube-scheduler's TaintToleration and NodeAffinity filters judge it.

A pod that says where it may run (``spec.nodeSelector``, required node affinity) must never be placed
elsewhere, and a node tainted ``NoSchedule``/``NoExecute`` takes only pods that tolerate the taint (GKE
and AKS taint every GPU node ``nvidia.com/gpu``). This module answers both questions on plain dicts with
the API's field names, the way the rest of ``kubecell.kube`` reads objects, and knows nothing of the
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

Modules: ``spec`` reads and validates a pod's constraints once (``ConstraintError`` comes from there),
``nodes`` judges nodes with them, words the reasons and caches the answers (``ConstraintCache``).
"""

from kubecell.kube.constraints.nodes import (
    BLOCKING_EFFECTS,
    NODE_AFFINITY_MISMATCH,
    NOT_READY_TAINT,
    UNSCHEDULABLE_REASON,
    UNSCHEDULABLE_TAINT,
    ConstraintCache,
    PodConstraints,
    allowed_nodes,
    constraint_signature,
    node_mismatch,
    node_taints,
    tainted_nodes,
    unavailable_message,
    untolerated_taint_reason,
)
from kubecell.kube.constraints.spec import (
    FIELD_OPERATORS,
    NODE_NAME_FIELD,
    SELECTOR_OPERATORS,
    TAINT_EFFECTS,
    TOLERATION_OPERATORS,
    ConstraintError,
    LabelTest,
    NameTest,
    has_node_constraints,
)

__all__ = [
    "BLOCKING_EFFECTS",
    "FIELD_OPERATORS",
    "NODE_AFFINITY_MISMATCH",
    "NODE_NAME_FIELD",
    "NOT_READY_TAINT",
    "SELECTOR_OPERATORS",
    "TAINT_EFFECTS",
    "TOLERATION_OPERATORS",
    "UNSCHEDULABLE_REASON",
    "UNSCHEDULABLE_TAINT",
    "ConstraintCache",
    "ConstraintError",
    "LabelTest",
    "NameTest",
    "PodConstraints",
    "allowed_nodes",
    "constraint_signature",
    "has_node_constraints",
    "node_mismatch",
    "node_taints",
    "tainted_nodes",
    "unavailable_message",
    "untolerated_taint_reason",
]
