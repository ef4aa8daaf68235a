"""The tenant ConfigMap on the testbed: an invalid edit keeps the tenants last accepted from it in force
(as a refused set of VirtualClusters keeps the accepted set), and says what is wrong in a Warning Event on
the ConfigMap; without a configuration ever accepted, the whole-cluster default runs."""

from __future__ import annotations

import json
from typing import Any

from kubecell.kube.names import ANNOTATION_ALLOCATION, ANNOTATION_VC
from kubecell.kube.rest import Kube
from kubecell.scheduler.options import SchedulerOptions
from kubecell.testbed.control_plane import ControlPlaneState
from tests.cluster_fixtures import RunningScheduler
from tests.scheduler.test_scheduler import bound, get_pod, make_pod
from tests.support import wait_for

TENANTS = """\
virtualClusters:
  a:
    cells: {P40x8/node: 1}
  b:
    cells: {P40x8/node: 1}
"""
MALFORMED = "virtualClusters:\n  a: {cells: {P40x8/node: 1}\n  b: [\n"   # an unclosed mapping: not YAML


def configmap(kube: Kube, namespace: str, text: str) -> None:
    """Create the tenant ConfigMap ``tenants``, or replace its data."""
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    if any(c["metadata"]["name"] == "tenants" for c in kube.get(path)["items"]):
        kube.patch(f"{path}/tenants", {"data": {"tenants.yaml": text}}, kind="merge")
    else:
        kube.create(path, {"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": "tenants", "namespace": namespace}, "data": {"tenants.yaml": text}})


def warnings_on_configmap(kube: Kube, namespace: str) -> list[dict[str, Any]]:
    return [e for e in kube.get(f"/api/v1/namespaces/{namespace}/events")["items"]
            if e["involvedObject"].get("kind") == "ConfigMap" and e["involvedObject"]["name"] == "tenants"
            and e["type"] == "Warning"]


def record_vc(kube: Kube, namespace: str, name: str) -> str:
    return str(json.loads(get_pod(kube, namespace, name)["metadata"]["annotations"][ANNOTATION_ALLOCATION])["vc"])


def waiting_message(kube: Kube, namespace: str, name: str) -> str:
    conditions = get_pod(kube, namespace, name)["status"].get("conditions") or []
    return next((c.get("message", "") for c in conditions if c["type"] == "PodScheduled"), "")


def tenant_names(running: RunningScheduler) -> list[str] | None:
    engine = running.scheduler.engine
    return sorted(engine.session.tenants.names) if engine is not None else None


def test_an_invalid_configmap_keeps_the_tenants_last_accepted_and_warns_on_the_configmap(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    configmap(kube, namespace, TENANTS)
    running = start_scheduler(testbed, SchedulerOptions(tenants_namespace=namespace, tenants_configmap="tenants"))
    wait_for("VCs a and b in force", lambda: tenant_names(running) == ["a", "b"])
    make_pod(kube, namespace, "before", {"nvidia.com/gpu": "1"}, {ANNOTATION_VC: "a"})
    wait_for("a pod of VC a placed", lambda: bound(kube, namespace, "before"))
    assert record_vc(kube, namespace, "before") == "a"
    assert warnings_on_configmap(kube, namespace) == []

    configmap(kube, namespace, MALFORMED)
    (event,) = wait_for("a Warning Event on the ConfigMap", lambda: warnings_on_configmap(kube, namespace))
    assert event["reason"] == "InvalidTenants"
    assert f"configmap {namespace}/tenants key tenants.yaml" in event["message"]   # where: the object and key
    assert "the tenants last accepted from it stay in force" in event["message"]
    assert event["involvedObject"]["uid"] == kube.get(f"/api/v1/namespaces/{namespace}/configmaps/tenants")[
        "metadata"]["uid"]
    # the rebuild reads the text before its new engine exists: wait for both, not the text alone
    wait_for("the scheduler rebuilt on the edit, keeping VCs a and b (not the whole-cluster default)",
             lambda: running.scheduler.tenant_sources.tenants_text == MALFORMED and tenant_names(running) == ["a", "b"])

    make_pod(kube, namespace, "after", {"nvidia.com/gpu": "1"}, {ANNOTATION_VC: "a"})
    make_pod(kube, namespace, "nobody", {"nvidia.com/gpu": "1"}, {ANNOTATION_VC: "default"})
    wait_for("a pod of VC a still placed by the old tenants", lambda: bound(kube, namespace, "after"))
    assert record_vc(kube, namespace, "after") == "a"
    wait_for("the default VC unknown to the tenants in force",
             lambda: "unknown virtual cluster 'default' (known: a, b)" in waiting_message(kube, namespace, "nobody"))
    assert len(warnings_on_configmap(kube, namespace)) == 1         # one refusal, one Event

    configmap(kube, namespace, TENANTS.replace("  b:\n", "  c:\n"))  # repaired (and changed): accepted
    wait_for("the repaired tenants in force", lambda: tenant_names(running) == ["a", "c"])


def test_an_invalid_configmap_with_nothing_accepted_before_runs_the_whole_cluster_default(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    configmap(kube, namespace, MALFORMED)
    running = start_scheduler(testbed, SchedulerOptions(tenants_namespace=namespace, tenants_configmap="tenants"))
    wait_for("the whole-cluster default in force", lambda: tenant_names(running) == ["default"])
    (event,) = wait_for("a Warning Event on the ConfigMap", lambda: warnings_on_configmap(kube, namespace))
    assert "none was accepted before; using the whole-cluster default" in event["message"]
    make_pod(kube, namespace, "anyone", {"nvidia.com/gpu": "1"})
    wait_for("a pod placed in the default VC", lambda: bound(kube, namespace, "anyone"))
    assert record_vc(kube, namespace, "anyone") == "default"
