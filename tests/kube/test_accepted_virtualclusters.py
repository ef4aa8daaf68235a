"""The VirtualCluster set in force, kept in the API (``kubecell.kube.accepted``, key ``virtualclusters.json``) and
recalled by a restarted scheduler (``TenantMemory.recalled``), without a cluster.

The API keeps only a VirtualCluster's newest spec: a VC whose edit was refused kept its older guarantee only in the
scheduler's memory, and lost it at a restart or a change of leader. These tests say what the snapshot holds, what
it refuses to read (logged, never raised), which set a restart puts in force, and that a deleted VC never comes
back from it.
"""

from __future__ import annotations

import copy
import json
import logging
from typing import Any

import pytest

from kubecell.core.errors import InvalidInputError
from kubecell.kube import virtualclusters as vcs
from kubecell.kube.accepted import (
    CONFIGMAP,
    KEY,
    MAX_BYTES,
    VC_KEY,
    VC_SCHEMA,
    AcceptedCluster,
    AcceptedVc,
    decode,
    decode_virtualclusters,
    encode,
    encode_virtualclusters,
)
from kubecell.kube.actions import Actions
from kubecell.kube.rest import ApiError, Kube
from kubecell.kube.tenant_source import TenantInputs, TenantMemory, choose_tenants
from kubecell.scheduler.cluster import Mirror
from kubecell.scheduler.tenants import TenantSources
from tests.core.support import make_nodes

NAMESPACE = "kubecell-system"
PATH = f"/api/v1/namespaces/{NAMESPACE}/configmaps/{CONFIGMAP}"


def vc(name: str, generation: int = 1, uid: str = "", status: str | None = None, **spec: Any) -> dict[str, Any]:
    """A VirtualCluster as the API returns it; ``status``: its Accepted condition at this generation."""
    obj: dict[str, Any] = {"apiVersion": "kubecell.io/v1alpha1", "kind": "VirtualCluster",
                           "metadata": {"name": name, "generation": generation, "uid": uid or f"uid-{name}"},
                           "spec": spec}
    if status is not None:
        obj["status"] = {"conditions": [{"type": "Accepted", "status": status, "observedGeneration": generation}]}
    return obj


def edited(obj: dict[str, Any], status: str | None = None, **spec: Any) -> dict[str, Any]:
    """``obj`` with a new spec: the next generation, its condition (if any) at that generation."""
    meta = obj["metadata"]
    return vc(meta["name"], meta["generation"] + 1, meta["uid"], status, **spec)


A, B = vc("a", gpus=8, status="True"), vc("b", gpus=16, status="True")
B_REFUSED = edited(B, "False", gpus=30)      # fits the 32 GPUs alone, not beside a's 8
SNAPSHOT = [AcceptedVc.of(A), AcceptedVc.of(B)]
NODES = make_nodes(4, racks_of=2)            # 32 V100M32 GPUs


def in_force(objects: list[dict[str, Any]], memory: TenantMemory) -> dict[str, int]:
    choice = choose_tenants(NODES, TenantInputs(objects, None, list), memory)
    assert choice.tenants is not None
    return {tenant.name: tenant.guaranteed_gpus for tenant in choice.tenants.vcs}


# ------------------------------------------------------------------ the snapshot's text
def test_a_vc_snapshot_reads_back_as_written() -> None:
    text = encode_virtualclusters(reversed(SNAPSHOT))
    assert text.isascii(), "its length is its size in bytes"
    assert json.loads(text)["schema"] == VC_SCHEMA
    assert [row["name"] for row in json.loads(text)["virtualClusters"]] == ["a", "b"]
    assert decode_virtualclusters(text) == SNAPSHOT


def row(**fields: Any) -> dict[str, Any]:
    return {"name": "a", "uid": "uid-a", "generation": 1, "spec": {"gpus": 8}, **fields}


def snapshot(*rows: Any, **top: Any) -> str:
    return json.dumps({"schema": VC_SCHEMA, "virtualClusters": list(rows), **top})


@pytest.mark.parametrize("text", [
    "", "{", "[]", "null", "7", '"x"', "[" * 100_000,                               # not JSON, or nested too deep
    json.dumps({"schema": "kubecell.io/accepted-cluster/v1", "virtualClusters": []}),   # another snapshot's schema
    json.dumps({"virtualClusters": []}), json.dumps({"schema": ["x"], "virtualClusters": []}),
    snapshot(extra=1), json.dumps({"schema": VC_SCHEMA, "virtualClusters": {"a": {}}}),
    snapshot(7), snapshot([]), snapshot({"name": "a"}), snapshot({**row(), "status": {}}),
    snapshot(row(name="A")), snapshot(row(name="../a")), snapshot(row(name="")), snapshot(row(name=7)),
    snapshot(row(uid="a/b")), snapshot(row(uid=None)), snapshot(row(uid="u" * 129)),
    snapshot(row(generation=-1)), snapshot(row(generation=True)), snapshot(row(generation=1.0)),
    snapshot(row(generation=2**63)), snapshot(row(generation="1")),
    snapshot(row(spec=[])), snapshot(row(spec="gpus: 8")), snapshot(row(spec=None)),
    snapshot(row(spec={"gpus": 10**30})),                                        # beyond int64
    snapshot(row(spec={"cells": {"x": [[[[[[[[[[1]]]]]]]]]]}})),                 # deeper than any spec
    snapshot(row(spec={"k" * 50_000: [[[[[[[[[[1]]]]]]]]]]})),                    # ... under a key that long
    snapshot(row(), row(uid="uid-a2")),                                          # one name twice
    snapshot(row(spec={"pinnedCells": ["n" * 100] * (MAX_BYTES // 100)})),      # more than kubecell writes
])
def test_a_vc_snapshot_kubecell_did_not_write_is_refused_with_the_configmap_named(text: str) -> None:
    with pytest.raises(InvalidInputError, match=f"{CONFIGMAP}: {VC_KEY}") as refused:
        decode_virtualclusters(text)
    assert len(str(refused.value)) < 1000, "the message never repeats what it refuses"


def test_a_node_snapshot_nested_too_deep_is_refused_not_raised() -> None:
    """``json.loads`` raised RecursionError, which no caller caught: out of the rebuild, at every rebuild."""
    with pytest.raises(InvalidInputError, match=CONFIGMAP):
        decode("[" * 100_000)


# ------------------------------------------------------------------ which set a restart puts in force
def test_a_restart_recalls_the_older_spec_of_a_refused_edit() -> None:
    """The defect: the objects hold only b's refused spec, so a restart recalled a alone, and b lost its
    guarantee (16 GPUs) to nobody."""
    before, problems = TenantMemory.recalled([A, B_REFUSED], None)
    assert sorted(before.vcs_in_force) == ["a"], "from the conditions alone, b's older spec is nowhere"
    memory, problems = TenantMemory.recalled([A, B_REFUSED], SNAPSHOT)
    assert problems == ()
    assert memory.vcs_in_force == {"a": SNAPSHOT[0], "b": SNAPSHOT[1]}
    assert in_force([A, B_REFUSED], memory) == {"a": 8, "b": 16}
    choice = choose_tenants(NODES, TenantInputs([A, B_REFUSED], None, list), memory)
    assert {v.name: v.reason for v in choice.verdicts} == {"a": "Accepted", "b": "Infeasible"}
    assert "In force: a, b (as accepted at generation 1)" in choice.warnings[0]


def test_without_a_snapshot_a_restart_recalls_the_objects_accepted_as_they_are() -> None:
    memory, problems = TenantMemory.recalled([A, B_REFUSED], None)
    assert (sorted(memory.vcs_in_force), problems) == (["a"], ())
    assert in_force([A, B_REFUSED], memory) == {"a": 8}


def test_with_a_snapshot_the_conditions_are_not_believed() -> None:
    """Whoever may write ``virtualclusters/status`` may say b's refused spec was accepted; the snapshot, which only
    the scheduler's ServiceAccount writes, says what was."""
    forged = edited(B, "True", gpus=30)
    memory, _ = TenantMemory.recalled([A, forged], SNAPSHOT)
    assert memory.vcs_in_force["b"] == SNAPSHOT[1]
    assert in_force([A, forged], memory) == {"a": 8, "b": 16}
    trusting, _ = TenantMemory.recalled([A, forged], None)
    assert choose_tenants(NODES, TenantInputs([A, forged], None, list), trusting).kind == "default", \
        "believing the forged condition loses every tenant's guarantee: the reason the snapshot comes first"


def test_a_deleted_vc_never_comes_back_from_the_snapshot() -> None:
    """Deleting a VC is the operator's decision: an entry applies only to the object it was accepted from. b
    deleted stays deleted; b deleted and created again (another uid) is a new object, judged as one."""
    c = vc("c", gpus=8, status="True")
    taken = [*SNAPSHOT, AcceptedVc.of(c)]
    memory, problems = TenantMemory.recalled([edited(A, "False", gpus=30), c], taken)
    assert (sorted(memory.vcs_in_force), problems) == (["a", "c"], ())
    again = vc("b", uid="uid-b-again", gpus=16)
    memory, _ = TenantMemory.recalled([A, again], taken)
    assert sorted(memory.vcs_in_force) == ["a"]
    assert TenantMemory.recalled([], taken)[0].vcs_in_force == {}


def test_an_entry_beyond_the_objects_generation_is_not_recalled() -> None:
    memory, problems = TenantMemory.recalled([A, B_REFUSED], [SNAPSHOT[0], AcceptedVc("b", "uid-b", 3, {"gpus": 16})])
    assert sorted(memory.vcs_in_force) == ["a"]
    assert len(problems) == 1
    assert "b at generation 3, beyond the object's (2)" in problems[0]


def test_at_the_objects_generation_the_objects_spec_is_the_one_accepted() -> None:
    """The API server moves the generation at every change of the spec, so at the same generation the object says
    what was accepted; a snapshot that differs holds a default the CRD added since (``weight: 1`` here)."""
    defaulted = vc("a", gpus=8, weight=1)
    memory, problems = TenantMemory.recalled([defaulted, B_REFUSED], SNAPSHOT)
    assert problems == ()
    assert memory.vcs_in_force["a"] == AcceptedVc.of(defaulted)
    assert memory.vcs_in_force["b"] == SNAPSHOT[1]


def test_a_recalled_set_is_judged_against_the_cluster_like_any_other() -> None:
    """The snapshot may be older than the cluster: a recalled spec that no longer fits is never put in force."""
    gone = AcceptedVc("b", "uid-b", 1, {"pinnedCells": ["n7"]})
    memory, _ = TenantMemory.recalled([A, B_REFUSED], [SNAPSHOT[0], gone])
    choice = choose_tenants(NODES, TenantInputs([A, B_REFUSED], None, list), memory)
    assert choice.kind == "default"
    assert "no longer fits the cluster" in choice.warnings[0]
    assert memory.vcs_in_force == {}, "nothing in force is recorded then"


def test_deleting_a_vc_applies_at_once_while_an_edit_is_refused() -> None:
    """The running scheduler, as a restarted one: c deleted while b's edit is refused leaves the set in force at
    once (before, the refused set kept c in force until b was repaired, and a restart would have dropped it)."""
    c = vc("c", gpus=8, status="True")
    memory = TenantMemory()
    assert in_force([A, B, c], memory) == {"a": 8, "b": 16, "c": 8}
    assert in_force([A, B_REFUSED], memory) == {"a": 8, "b": 16}
    assert sorted(memory.vcs_in_force) == ["a", "b"]


# ------------------------------------------------------------------ in the API, against a stand-in
class ApiStub:
    """The calls the tenants' side makes, against dictionaries: the ConfigMaps, the VirtualClusters' status
    patches (applied to ``objects``, as the API server would), the Events created."""

    def __init__(self) -> None:
        self.configmaps: dict[str, dict[str, Any]] = {}
        self.objects: dict[str, dict[str, Any]] = {}
        self.writes: list[tuple[str, Any]] = []
        self.refuse: ApiError | None = None

    def get(self, path: str, **_: Any) -> dict[str, Any]:
        if self.refuse is not None:
            raise self.refuse
        if path not in self.configmaps:
            raise ApiError(404, "NotFound", path)
        return copy.deepcopy(self.configmaps[path])

    def patch(self, path: str, body: Any, *, kind: str = "merge", **_: Any) -> dict[str, Any]:
        if path.endswith("/status"):
            self.writes.append((path, body))
            name = path.split("/")[-2]
            self.objects[name] = {**self.objects[name], "status": body["status"]}
            return self.objects[name]
        if path not in self.configmaps:
            raise ApiError(404, "NotFound", path)
        self.writes.append((path, body))
        data = self.configmaps[path].setdefault("data", {})
        for key, value in body["data"].items():
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value
        return self.configmaps[path]

    def create(self, path: str, body: Any, **_: Any) -> dict[str, Any]:
        self.writes.append((path, body))
        if path.endswith("/configmaps"):
            self.configmaps[f"{path}/{body['metadata']['name']}"] = copy.deepcopy(body)
        return dict(body)

    def data(self) -> dict[str, str]:
        return dict(self.configmaps.get(PATH, {}).get("data") or {})


def cluster(api: ApiStub) -> AcceptedCluster:
    return AcceptedCluster(api, NAMESPACE)  # type: ignore[arg-type]


def test_the_set_in_force_is_written_only_when_it_changes_beside_the_nodes() -> None:
    api = ApiStub()
    first = cluster(api)
    first.record(NODES)
    first.record_virtualclusters(SNAPSHOT)
    first.record_virtualclusters(list(SNAPSHOT))
    assert len(api.writes) == 2, "the ConfigMap made once with the nodes, then the VirtualClusters patched in once"
    assert len(decode(api.data()[KEY])) == 4
    assert decode_virtualclusters(api.data()[VC_KEY]) == SNAPSHOT
    assert cluster(api).load_virtualclusters() == SNAPSHOT, "what a restarted scheduler reads"
    first.record_virtualclusters([])
    assert VC_KEY not in api.data(), "no set in force: the key is taken out, the nodes stay"
    assert KEY in api.data()
    assert cluster(api).load_virtualclusters() is None


def test_a_set_too_large_for_the_configmap_takes_the_snapshot_out(caplog: pytest.LogCaptureFixture) -> None:
    """Never an older set recalled instead: without the key, a restart reads the objects' conditions."""
    api = ApiStub()
    kept = cluster(api)
    kept.record_virtualclusters(SNAPSHOT)
    huge = [AcceptedVc(f"v{i}", f"uid-{i}", 1, {"pinnedCells": [f"node-{i}-{j}" for j in range(4000)]})
            for i in range(20)]
    with caplog.at_level(logging.ERROR, "kubecell.scheduler"):
        kept.record_virtualclusters(huge)
        kept.record_virtualclusters(huge)
    assert VC_KEY not in api.data()
    assert [r.levelno for r in caplog.records] == [logging.ERROR], "told once, not at every rebuild"
    assert "do not fit the ConfigMap" in caplog.records[0].getMessage()
    assert all(len(json.dumps(body)) < 2 * MAX_BYTES for _, body in api.writes)


@pytest.mark.parametrize("text", ["garbage", json.dumps({"schema": "other"}), snapshot(row(name="../a")),
                                  "[" * 50_000, snapshot(row(spec={"pinnedCells": ["x" * 250] * 3900}))])
def test_a_snapshot_kubecell_did_not_write_is_logged_ignored_and_written_anew(
        caplog: pytest.LogCaptureFixture, text: str) -> None:
    """Garbage, another schema, a name no object has, nested too deep, more than kubecell writes: an error in the
    log naming the ConfigMap, the objects' conditions recalled instead (the rule before the snapshot), the nodes'
    snapshot beside it still read, and the set in force written over it at the first rebuild."""
    api = ApiStub()
    api.configmaps[PATH] = {"data": {KEY: encode(NODES), VC_KEY: text}}
    api.objects.update(a=A, b=B_REFUSED)
    sources = tenant_sources(api)
    mirror = Mirror(virtualclusters=dict(api.objects))
    with caplog.at_level(logging.ERROR, "kubecell.scheduler"):
        choice = sources.in_force(mirror, NODES)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert f"{CONFIGMAP}: {VC_KEY}" in errors[0]
    assert "recalled from their Accepted conditions" in errors[0]
    assert choice.tenants is not None
    assert choice.tenants.names == ["a"]
    assert len(sources.accepted.load()) == 4
    assert decode_virtualclusters(api.data()[VC_KEY]) == [AcceptedVc.of(A)]


def test_a_snapshot_that_cannot_be_read_now_is_tried_again() -> None:
    api = ApiStub()
    api.objects.update(a=A)
    api.refuse = ApiError(503, "ServiceUnavailable", "etcd")
    sources = tenant_sources(api)
    with pytest.raises(ApiError):
        sources.in_force(Mirror(virtualclusters=dict(api.objects)), NODES)
    assert not sources.recalled, "the rebuild is tried again, and the snapshot read then"
    api.refuse = ApiError(403, "Forbidden", "no")
    assert sources.in_force(Mirror(virtualclusters=dict(api.objects)), NODES).kind == "virtualclusters"


def tenant_sources(api: ApiStub) -> TenantSources:
    kube: Kube = api  # type: ignore[assignment]
    return TenantSources(kube, Actions(kube, "kubecell"), "kubecell", NAMESPACE, "kubecell-tenants", "tenants.yaml",
                         "default")


def test_a_new_scheduler_keeps_the_older_guarantee_of_a_refused_edit() -> None:
    """The scheduler's side end to end, against the stand-in: accepted, b's edit refused, a new instance (a restart
    or a new leader) against the same API keeps b's 16 GPUs in force, and its verdicts stay as they were."""
    api = ApiStub()
    api.objects.update(a=vc("a", gpus=8), b=vc("b", gpus=16))
    first = tenant_sources(api)
    assert first.in_force(Mirror(virtualclusters=dict(api.objects)), NODES).tenants.names == ["a", "b"]  # type: ignore[union-attr]
    api.objects["b"] = {**edited(api.objects["b"], gpus=30), "status": api.objects["b"]["status"]}
    choice = first.in_force(Mirror(virtualclusters=dict(api.objects)), NODES)
    assert (vcs.current_condition(api.objects["b"]) or {})["reason"] == "Infeasible"
    assert {t.name: t.guaranteed_gpus for t in choice.tenants.vcs} == {"a": 8, "b": 16}  # type: ignore[union-attr]
    written = len(api.writes)
    restarted = tenant_sources(api)
    choice = restarted.in_force(Mirror(virtualclusters=dict(api.objects)), NODES)
    assert choice.tenants is not None
    assert {t.name: t.guaranteed_gpus for t in choice.tenants.vcs} == {"a": 8, "b": 16}
    assert len(api.writes) == written, "the same verdicts, the same snapshot: nothing written again"
