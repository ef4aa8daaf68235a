"""The ElasticJob sizer's holds as the scheduler's ConfigMap keeps them (``kubecell.kube.kept_holds``): a hold
reads back as written, a value that fails a check is none (and is taken out), and on the real API server the
ConfigMap is made at the first hold, each key written alone, and what ran out taken out when read back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from kubecell.kube.elasticjobs import ElasticRef
from kubecell.kube.kept_holds import CONFIGMAP, HoldStore, KeptHold, decode, encode, entry_key
from kubecell.kube.rest import ApiError, Kube
from kubecell.testbed.control_plane import ControlPlaneState
from tests.cluster_fixtures import fresh_namespace

BERT = ElasticRef("team-a", "bert", "0c5b2d6e-1f2a-4c1e-9d53-6a3f2b1c0d9e")
KEPT = KeptHold(BERT, "move", "A100", 3, 2, 1_796_090_400.0)


def test_a_kept_hold_reads_back_as_it_was_written() -> None:
    assert entry_key(BERT) == "team-a.bert"
    assert decode(entry_key(BERT), encode(KEPT)) == KEPT
    later = decode("team-a.bert", encode(KeptHold(BERT, "raise", "cpu", 2, 1, 1_796_090_400.25)))
    assert later is not None
    assert later.until == 1_796_090_401.0, "whole seconds, never earlier"
    zone = json.dumps({**json.loads(encode(KEPT)), "until": "2026-12-01T03:00:00+01:00"})
    assert decode("team-a.bert", zone) == KEPT, "2026-12-01T02:00:00Z, whatever the zone it is written in"


def edited(**fields: Any) -> str:
    return json.dumps({**json.loads(encode(KEPT)), **fields})


@pytest.mark.parametrize(("key", "text"), [
    ("team-a.bert", edited(kind="steal")),
    ("team-a.bert", edited(gpuModel="A100,V100")),
    ("team-a.bert", edited(gpuModel="A" * 64)),
    ("team-a.bert", edited(replicas=0)),
    ("team-a.bert", edited(replicas=True)),
    ("team-a.bert", edited(replicas=2.0)),
    ("team-a.bert", edited(replicas=4097)),
    ("team-a.bert", edited(memberGpus=0)),
    ("team-a.bert", edited(uid="../x")),
    ("team-a.bert", edited(until=1_796_090_400)),
    ("team-a.bert", edited(until="tomorrow")),
    ("team-a.bert", edited(until="2026-12-01T03:00:00")),  # no zone: hours off wherever it is read
    ("team-a.bert", edited(until=None)),
    ("team-a.bert", encode(KEPT) + " " * 512),
    ("team-a.bert", "[]"),
    ("team-a.bert", "{"),
    ("team-a.bert", 7),
    ("team-a", encode(KEPT)),
    ("team-a.Bert", encode(KEPT)),
    ("../x.bert", encode(KEPT)),
])
def test_a_kept_hold_is_read_defensively(key: str, text: Any) -> None:
    assert decode(key, text) is None
    assert decode("team-a.bert", encode(KEPT)) is not None


@pytest.fixture
def store(kube: Kube) -> Iterator[HoldStore]:
    with fresh_namespace(kube) as namespace:
        yield HoldStore(kube, namespace)


def test_the_configmap_is_made_at_the_first_hold_and_each_key_written_alone(
        store: HoldStore, testbed: ControlPlaneState, caplog: pytest.LogCaptureFixture) -> None:
    assert store.read() == {}, "no ConfigMap yet: nothing kept"
    assert store.restore(0.0) == []
    store.keep(BERT, None)  # an end before any hold: nothing to make, nothing to tell
    with pytest.raises(ApiError):
        store.kube.get(store.path)
    assert "cannot keep" not in caplog.text
    gpt = ElasticRef("team-b", "gpt", "uid-gpt")
    store.keep(BERT, KEPT)
    store.keep(gpt, KeptHold(gpt, "raise", "V100M32", 4, 1, KEPT.until - 3600))
    assert sorted(store.read()) == ["team-a.bert", "team-b.gpt"]
    store.keep(BERT, None)
    assert sorted(store.read()) == ["team-b.gpt"], "an ended hold is taken out, the others stay"
    store.keep(BERT, KEPT)
    store.kube.patch(store.path, {"data": {"team-c.llama": "not a hold"}})
    assert store.restore(KEPT.until - 60) == [KEPT], "gpt's ran out an hour before"
    assert sorted(store.read()) == ["team-a.bert"], "what ran out or fails a check is taken out"
    assert store.kube.get(store.path)["metadata"]["name"] == CONFIGMAP


def test_a_write_the_api_refuses_is_logged_not_raised(kube: Kube, testbed: ControlPlaneState,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    store = HoldStore(kube, "no-such-namespace")
    store.keep(BERT, KEPT)
    assert "cannot keep the sizer's holds" in caplog.text
