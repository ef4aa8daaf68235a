"""The tenants ConfigMap text last accepted, kept in the API (``kubecell.kube.accepted``, key ``tenants.json``) and
recalled by a restarted scheduler (``TenantMemory.recalled``), without a cluster.

A running scheduler keeps the text it last accepted from the ConfigMap ``kubecell-tenants`` when an edit of it is
refused; that text lived only in its memory, so after a restart (or a change of leader) the same invalid edit
fell back to the whole-cluster default and every tenant lost its guarantee. These tests say what the snapshot
holds, what it refuses to read (logged, never raised), which text a restart puts in force, and that a recalled
text is judged against the cluster like any other.
"""

from __future__ import annotations

import json
import logging

import pytest

from kubecell.core.errors import InvalidInputError
from kubecell.kube.accepted import (
    CONFIGMAP,
    KEY,
    MAX_BYTES,
    TENANTS_KEY,
    TENANTS_SCHEMA,
    VC_KEY,
    AcceptedVc,
    decode_tenants,
    encode,
    encode_tenants,
)
from kubecell.kube.tenant_source import TenantChoice, TenantInputs, TenantMemory, choose_tenants
from kubecell.scheduler.cluster import Mirror
from tests.kube.test_accepted_virtualclusters import NAMESPACE, NODES, PATH, SNAPSHOT, ApiStub, cluster, tenant_sources

SOURCE = f"configmap {NAMESPACE}/kubecell-tenants key tenants.yaml"
GOOD = "virtualClusters:\n  a: {gpus: 8}\n  b: {gpus: 16}\n"
INFEASIBLE = "virtualClusters:\n  a: {gpus: 8}\n  b: {gpus: 30}\n"     # 38 of the 32 GPUs
MALFORMED = "virtualClusters:\n  a: {gpus: 8\n  b: [\n"                 # not YAML
ELSEWHERE = "virtualClusters:\n  a: {pinnedCells: [n7]}\n"              # a node the cluster does not have


def choose(text: str | None, memory: TenantMemory) -> TenantChoice:
    return choose_tenants(NODES, TenantInputs([], text, list, source=SOURCE), memory)


def guarantees(choice: TenantChoice) -> dict[str, int]:
    assert choice.tenants is not None
    return {vc.name: vc.guaranteed_gpus for vc in choice.tenants.vcs}


# ------------------------------------------------------------------ the snapshot's text
def test_a_tenants_snapshot_reads_back_as_written() -> None:
    text = encode_tenants(SOURCE, GOOD + "# ünïcode\n")
    assert text.isascii(), "its length is its size in bytes"
    assert json.loads(text)["schema"] == TENANTS_SCHEMA
    assert decode_tenants(text) == (SOURCE, GOOD + "# ünïcode\n")


def wrapped(**fields: object) -> str:
    return json.dumps({"schema": TENANTS_SCHEMA, "source": SOURCE, "text": GOOD, **fields})


@pytest.mark.parametrize("text", [
    "", "{", "[]", "null", "7", GOOD, "[" * 100_000,                              # not JSON, or nested too deep
    json.dumps({"schema": "kubecell.io/accepted-virtualclusters/v1", "source": SOURCE, "text": GOOD}),
    json.dumps({"source": SOURCE, "text": GOOD}), wrapped(schema=["x"]), wrapped(extra=1),
    wrapped(text=7), wrapped(text=None), wrapped(text=""), wrapped(text=["a"]),
    wrapped(source=7), wrapped(source="s" * 5000),
    wrapped(text="x" * MAX_BYTES),                                                # more than kubecell writes
])
def test_a_tenants_snapshot_kubecell_did_not_write_is_refused_with_the_configmap_named(text: str) -> None:
    with pytest.raises(InvalidInputError, match=f"{CONFIGMAP}: {TENANTS_KEY}") as refused:
        decode_tenants(text)
    assert len(str(refused.value)) < 1000, "the message never repeats what it refuses"


# ------------------------------------------------------------------ which text a restart puts in force
def test_a_restart_recalls_the_text_last_accepted_when_the_current_one_is_refused() -> None:
    """The defect: without the snapshot, a restart knew no earlier text, and the invalid edit put the whole-cluster
    default in force (every tenant lost its guarantee) where a running scheduler kept a's and b's."""
    running = TenantMemory()
    assert guarantees(choose(GOOD, running)) == {"a": 8, "b": 16}
    assert guarantees(choose(INFEASIBLE, running)) == {"a": 8, "b": 16}, "a running scheduler keeps them"
    assert choose(INFEASIBLE, TenantMemory.recalled([], None)[0]).kind == "default", "a restart without snapshot"
    memory, problems = TenantMemory.recalled([], None, GOOD)
    assert (memory.configmap_text, problems) == (GOOD, ())
    choice = choose(INFEASIBLE, memory)
    assert (choice.kind, guarantees(choice)) == ("configmap", {"a": 8, "b": 16})
    assert "last accepted from it stay in force" in (choice.configmap_refused or "")
    assert memory.configmap_text == GOOD, "still the text to fall back on"


def test_a_recalled_text_gives_way_to_a_current_text_that_is_accepted() -> None:
    memory, _ = TenantMemory.recalled([], None, INFEASIBLE.replace("30", "8"))
    choice = choose(GOOD, memory)
    assert (choice.kind, guarantees(choice), choice.warnings) == ("configmap", {"a": 8, "b": 16}, ())
    assert memory.configmap_text == GOOD


def test_a_recalled_text_is_judged_against_the_cluster_like_any_other() -> None:
    """The snapshot may be older than the cluster, or hold anything: a recalled text that does not fit (or is no
    tenants text at all) is never put in force; the default is, and nothing is recorded as in force."""
    for recalled in (ELSEWHERE, MALFORMED):
        memory, _ = TenantMemory.recalled([], None, recalled)
        choice = choose(INFEASIBLE, memory)
        assert choice.kind == "default", recalled
        assert "no longer fit the cluster" in (choice.configmap_refused or "")
        assert memory.configmap_text is None


def test_a_recalled_text_is_not_the_changed_text_judged_on_lost_nodes() -> None:
    """Unchanged tenants that no longer fit are judged on the cluster as accepted (ghosts of lost nodes); a text
    that differs from the recalled one is an edit, and must fit the real cluster."""
    edit = INFEASIBLE.replace("30", "24")                                       # all 32 GPUs of the accepted cluster
    shrunk = NODES[:2]                                                          # n2 and n3 lost: 16 GPUs left
    unknowing = choose_tenants(shrunk, TenantInputs([], edit, lambda: NODES, source=SOURCE), TenantMemory())
    assert guarantees(unknowing) == {"a": 8, "b": 24}, "without the text recalled, the edit passed as unchanged"
    memory, _ = TenantMemory.recalled([], None, GOOD)
    choice = choose_tenants(shrunk, TenantInputs([], edit, lambda: NODES, source=SOURCE), memory)
    assert choice.configmap_refused is not None, "the edit does not fit the 16 GPUs there are"
    assert guarantees(choice) == {"a": 8, "b": 16}
    assert choice.ghosts, "the text recalled fits the cluster as accepted"


def test_with_virtualclusters_in_force_the_recalled_text_waits_as_a_running_schedulers_would() -> None:
    a = {"metadata": {"name": "a", "generation": 1, "uid": "uid-a"}, "spec": {"gpus": 8}}
    memory, _ = TenantMemory.recalled([a], [AcceptedVc.of(a)], GOOD)
    assert choose_tenants(NODES, TenantInputs([a], INFEASIBLE, list), memory).kind == "virtualclusters"
    assert memory.configmap_text == GOOD
    assert guarantees(choose(INFEASIBLE, memory)) == {"a": 8, "b": 16}, "the VirtualClusters deleted"


# ------------------------------------------------------------------ in the API, against a stand-in
def test_the_text_in_force_is_written_only_when_it_changes_and_taken_out_when_none_is() -> None:
    api = ApiStub()
    first = cluster(api)
    first.record(NODES)
    first.record_virtualclusters(SNAPSHOT)
    first.record_tenants(SOURCE, GOOD)
    first.record_tenants(SOURCE, GOOD)
    assert len(api.writes) == 3, "the ConfigMap made with the nodes, the VirtualClusters and the text patched in once"
    assert decode_tenants(api.data()[TENANTS_KEY]) == (SOURCE, GOOD)
    assert cluster(api).load_tenants(SOURCE) == GOOD, "what a restarted scheduler reads"
    assert cluster(api).load_tenants("configmap other/tenants key tenants.yaml") is None, \
        "a text of another ConfigMap (the scheduler's flags changed) is not this one's"
    first.record_tenants(SOURCE, None)
    assert TENANTS_KEY not in api.data(), "no text in force: the key is taken out, the others stay"
    assert {KEY, VC_KEY} <= set(api.data())
    assert cluster(api).load_tenants(SOURCE) is None
    first.record_tenants(SOURCE, None)
    assert len(api.writes) == 4


def test_a_text_too_large_beside_the_others_takes_the_snapshot_out(caplog: pytest.LogCaptureFixture) -> None:
    """The three keys together stay under ``MAX_BYTES``; a text that would not fit is not kept (never an older
    text recalled instead), told once."""
    api = ApiStub()
    kept = cluster(api)
    kept.record(NODES)
    kept.record_tenants(SOURCE, GOOD)
    huge = GOOD + "#" * (MAX_BYTES - len(api.data()[KEY]) - 50)
    with caplog.at_level(logging.ERROR, "kubecell.scheduler"):
        kept.record_tenants(SOURCE, huge)
        kept.record_tenants(SOURCE, huge)
    assert TENANTS_KEY not in api.data()
    assert [r.levelno for r in caplog.records] == [logging.ERROR], "told once, not at every rebuild"
    assert "does not fit the ConfigMap" in caplog.records[0].getMessage()
    assert sum(len(text) for text in api.data().values()) <= MAX_BYTES
    kept.record_tenants(SOURCE, GOOD)
    assert decode_tenants(api.data()[TENANTS_KEY]) == (SOURCE, GOOD)


def test_the_nodes_and_virtualclusters_count_the_text_in_their_budget() -> None:
    api = ApiStub()
    kept = cluster(api)
    kept.record_tenants(SOURCE, GOOD + "#" * (MAX_BYTES - 10 - len(encode_tenants(SOURCE, GOOD))))
    assert TENANTS_KEY in api.data()
    kept.record(NODES)
    kept.record_virtualclusters(SNAPSHOT)
    assert set(api.data()) == {TENANTS_KEY}, "neither fits beside the text"


def test_a_new_scheduler_keeps_the_configmap_tenants_last_accepted_after_an_invalid_edit() -> None:
    """The scheduler's side end to end, against the stand-in: GOOD accepted, an invalid edit refused, a new instance
    (a restart or a new leader) against the same API keeps a's and b's guarantees, and tells the refusal."""
    api = ApiStub()
    tenants = {"metadata": {"name": "kubecell-tenants", "namespace": NAMESPACE, "uid": "uid-cm"},
               "data": {"tenants.yaml": GOOD}}
    first = tenant_sources(api)
    assert guarantees(first.in_force(Mirror(tenants=tenants), NODES)) == {"a": 8, "b": 16}
    assert decode_tenants(api.data()[TENANTS_KEY]) == (SOURCE, GOOD)
    edited = {**tenants, "data": {"tenants.yaml": INFEASIBLE}}
    assert guarantees(first.in_force(Mirror(tenants=edited), NODES)) == {"a": 8, "b": 16}
    assert decode_tenants(api.data()[TENANTS_KEY]) == (SOURCE, GOOD), "the text in force, not the edit"
    restarted = tenant_sources(api)
    choice = restarted.in_force(Mirror(tenants=edited), NODES)
    assert (choice.kind, guarantees(choice)) == ("configmap", {"a": 8, "b": 16})
    told = [body for path, body in api.writes if path.endswith("/events")]
    assert told
    assert all("the tenants last accepted from it stay in force" in body["message"] for body in told)


@pytest.mark.parametrize("text", ["garbage", "[" * 50_000, json.dumps({"schema": "other", "text": GOOD}),
                                  wrapped(text="x" * (MAX_BYTES + 1))])
def test_a_tenants_snapshot_kubecell_did_not_write_is_logged_and_ignored(
        caplog: pytest.LogCaptureFixture, text: str) -> None:
    """Garbage, nested too deep, another schema, more than kubecell writes: one error in the log naming the
    ConfigMap and key, the rule without a snapshot (an invalid edit: the whole-cluster default), the other keys
    still read, and the key taken out (no text in force) or written over by the next text accepted."""
    api = ApiStub()
    api.configmaps[PATH] = {"data": {KEY: encode(NODES), TENANTS_KEY: text}}
    tenants = {"metadata": {"name": "kubecell-tenants", "namespace": NAMESPACE}, "data": {"tenants.yaml": INFEASIBLE}}
    sources = tenant_sources(api)
    with caplog.at_level(logging.ERROR, "kubecell.scheduler"):
        choice = sources.in_force(Mirror(tenants=tenants), NODES)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors
    assert f"{CONFIGMAP}: {TENANTS_KEY}" in errors[0]
    assert "Not a snapshot kubecell wrote" in errors[0]
    assert len(errors[0]) < 1000
    assert choice.kind == "default"
    assert len(sources.accepted.load()) == 4
    assert TENANTS_KEY not in api.data()
    sources.in_force(Mirror(tenants={**tenants, "data": {"tenants.yaml": GOOD}}), NODES)
    assert decode_tenants(api.data()[TENANTS_KEY]) == (SOURCE, GOOD)
