"""A VirtualCluster whose edit was refused keeps its older guarantee across a scheduler restart, on the testbed.

The API keeps only a VC's newest spec, so the spec in force of a VC whose edit kubecell refused lived only in the
scheduler's memory: a restarted scheduler (or a new leader) dropped that VC's guarantee. The leader now keeps the
set in force in the ConfigMap ``kubecell-system/kubecell-accepted-cluster`` (key ``virtualclusters.json``), which
only its ServiceAccount writes, and a new instance recalls it. A VC the operator deletes leaves the set at once
and never comes back from it; a snapshot kubecell did not write is logged and ignored. The tenants ConfigMap's text
last accepted is kept beside them (key ``tenants.json``), so an invalid edit of the ConfigMap keeps it across a
restart too.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from functools import partial

import pytest

from kubecell.kube import virtualclusters as vcs
from kubecell.kube.accepted import CONFIGMAP, TENANTS_KEY, VC_KEY, decode_tenants, decode_virtualclusters
from kubecell.kube.rest import ApiError, Kube
from kubecell.scheduler.options import SchedulerOptions
from kubecell.testbed.control_plane import ControlPlaneState
from tests.cluster_fixtures import RunningScheduler
from tests.kube.test_virtualclusters import accepted, put, record_vc
from tests.scheduler.test_scheduler import bound, make_pod
from tests.scheduler.test_tenant_source import MALFORMED, TENANTS, configmap, tenant_names, warnings_on_configmap
from tests.support import wait_for

SYSTEM = "kubecell-system"
SNAPSHOT = f"/api/v1/namespaces/{SYSTEM}/configmaps/{CONFIGMAP}"


@pytest.fixture
def system_namespace(kube: Kube) -> Iterator[str]:
    """kubecell's own namespace, as an installed cluster has it; no snapshot of an earlier test before or after."""
    with contextlib.suppress(ApiError):
        kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM}})
    with contextlib.suppress(ApiError):
        kube.delete(SNAPSHOT)
    yield SYSTEM
    with contextlib.suppress(ApiError):
        kube.delete(SNAPSHOT)


def recorded(kube: Kube) -> dict[str, int]:
    """The VirtualClusters the snapshot holds in force: name -> the generation accepted."""
    try:
        text = (kube.get(SNAPSHOT).get("data") or {}).get(VC_KEY)
    except ApiError:
        return {}
    return {vc.name: vc.generation for vc in decode_virtualclusters(text)} if text else {}


def guarantees(running: RunningScheduler) -> dict[str, int] | None:
    engine = running.scheduler.engine
    return {vc.name: vc.guaranteed_gpus for vc in engine.session.tenants.vcs} if engine is not None else None


def test_a_restarted_scheduler_keeps_the_older_guarantee_of_a_refused_edit(
        testbed: ControlPlaneState, kube: Kube, namespace: str, crd: None, system_namespace: str,
        start_scheduler: type[RunningScheduler]) -> None:
    put(kube, "a", gpus=8)
    put(kube, "b", gpus=16)
    put(kube, "c", gpus=8)
    first = start_scheduler(testbed)
    for name in ("a", "b", "c"):
        wait_for(f"{name} accepted", partial(accepted, kube, name))
    put(kube, "b", gpus=510)                         # fits the 512 GPUs alone, not beside a's and c's 16
    wait_for("b's edit refused", lambda: accepted(kube, "b", "False"))
    assert guarantees(first) == {"a": 8, "b": 16, "c": 8}
    assert wait_for("the set in force recorded", lambda: recorded(kube) == {"a": 1, "b": 1, "c": 1})
    first.close()

    restarted = start_scheduler(testbed)             # a restart, or a new leader: nothing in memory
    assert wait_for("the restarted engine", lambda: guarantees(restarted)) == {"a": 8, "b": 16, "c": 8}, \
        "b's older guarantee in force (before: b dropped, its 16 GPUs guaranteed to nobody)"
    make_pod(kube, namespace, "b-8", {"nvidia.com/gpu": "8"}, {"kubecell.io/vc": "b"})
    wait_for("b's pod placed within its older guarantee", lambda: bound(kube, namespace, "b-8"))
    assert record_vc(kube, namespace, "b-8") == ("b", "guaranteed")
    condition = vcs.current_condition(kube.get(f"{vcs.PATH}/b")) or {}
    assert (condition.get("reason"), condition.get("observedGeneration")) == ("Infeasible", 2), "still refused"

    kube.delete(f"{vcs.PATH}/c")                     # the operator's decision, while b's edit is still refused
    wait_for("c out of the set in force at once", lambda: guarantees(restarted) == {"a": 8, "b": 16})
    wait_for("c out of the snapshot", lambda: recorded(kube) == {"a": 1, "b": 1})
    restarted.close()
    again = start_scheduler(testbed)
    assert wait_for("the engine after a second restart", lambda: guarantees(again)) == {"a": 8, "b": 16}


def test_a_snapshot_kubecell_did_not_write_is_logged_and_ignored(
        testbed: ControlPlaneState, kube: Kube, namespace: str, crd: None, system_namespace: str,
        start_scheduler: type[RunningScheduler], caplog: pytest.LogCaptureFixture) -> None:
    """Nested deeper than Python's stack (``json.loads`` raises RecursionError): an error in the log, the rule
    without a snapshot (the objects accepted as they are) in force, and a sound snapshot written over it."""
    put(kube, "a", gpus=8)
    put(kube, "b", gpus=16)
    first = start_scheduler(testbed)
    for name in ("a", "b"):
        wait_for(f"{name} accepted", partial(accepted, kube, name))
    put(kube, "b", gpus=510)
    wait_for("b's edit refused", lambda: accepted(kube, "b", "False"))
    wait_for("the set in force recorded", lambda: recorded(kube) == {"a": 1, "b": 1})
    first.close()
    kube.patch(SNAPSHOT, {"data": {VC_KEY: "[" * 200_000}}, kind="merge")

    with caplog.at_level(logging.ERROR, "kubecell.scheduler"):
        restarted = start_scheduler(testbed)
        assert wait_for("the restarted engine", lambda: guarantees(restarted)) == {"a": 8}
    told = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and VC_KEY in r.getMessage()]
    assert len(told) == 1, told
    assert "Not a snapshot kubecell wrote" in told[0]
    assert len(told[0]) < 1000
    make_pod(kube, namespace, "a-8", {"nvidia.com/gpu": "8"}, {"kubecell.io/vc": "a"})
    wait_for("a's pod placed", lambda: bound(kube, namespace, "a-8"))
    wait_for("a sound snapshot written over it", lambda: recorded(kube) == {"a": 1})


def test_a_restarted_scheduler_keeps_the_configmap_tenants_last_accepted_after_an_invalid_edit(
        testbed: ControlPlaneState, kube: Kube, namespace: str, start_scheduler: type[RunningScheduler]) -> None:
    """The tenants ConfigMap edited into something that is not YAML: the running scheduler keeps VCs a and b, and
    so does a restarted one (before, it knew no earlier text: the whole-cluster default, every tenant's guarantee
    lost). The snapshot sits in the tenants' namespace, as the scheduler's ConfigMaps do."""
    options = SchedulerOptions(tenants_namespace=namespace, tenants_configmap="tenants")
    snapshot = f"/api/v1/namespaces/{namespace}/configmaps/{CONFIGMAP}"

    def recorded_text() -> str | None:
        try:
            text = (kube.get(snapshot).get("data") or {}).get(TENANTS_KEY)
        except ApiError:
            return None
        return decode_tenants(text)[1] if text else None

    configmap(kube, namespace, TENANTS)
    first = start_scheduler(testbed, options)
    wait_for("VCs a and b in force", lambda: tenant_names(first) == ["a", "b"])
    wait_for("the text in force recorded", lambda: recorded_text() == TENANTS)
    configmap(kube, namespace, MALFORMED)
    wait_for("the edit refused", lambda: first.scheduler.tenant_sources.tenants_text == MALFORMED
             and tenant_names(first) == ["a", "b"])
    assert recorded_text() == TENANTS, "the text in force, not the edit"
    first.close()

    restarted = start_scheduler(testbed, options)
    assert wait_for("the restarted engine", lambda: tenant_names(restarted)) == ["a", "b"], \
        "the text last accepted in force (before: the whole-cluster default)"
    told = wait_for("the refusal told", lambda: [e for e in warnings_on_configmap(kube, namespace)
                                                 if "stay in force" in e["message"]])
    assert all(e["reason"] == "InvalidTenants" for e in told)
    make_pod(kube, namespace, "a-1", {"nvidia.com/gpu": "1"}, {"kubecell.io/vc": "a"})
    wait_for("a's pod placed", lambda: bound(kube, namespace, "a-1"))
    assert record_vc(kube, namespace, "a-1") == ("a", "guaranteed")
