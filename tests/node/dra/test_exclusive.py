"""A device one prepared claim holds is not given to another by the node: the plugin is the last thing between
an allocation and a container, and whoever can write a claim's allocation (a second scheduler for the driver,
a bug, an account with ``resourceclaims/status``) gave a running job's GPU to a second pod, which shared it in
silence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("grpc", reason="tests/node needs the `node` extra: pip install -e '.[dev,node]' (grpcio)")

from kubecell.node.dra import cdi
from kubecell.node.dra.checkpoint import ClaimRef, PreparedClaim
from kubecell.node.dra.exclusive import Holding, conflicts
from tests.node.dra.test_cdi import Node, add_claim, result

SHARE = {"compute": "250", "memory": "10Gi"}


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def refused(node: Node, ref: ClaimRef) -> str:
    answer = node.preparer.prepare([ref])[ref.uid]
    assert isinstance(answer, str), f"{ref.name} was prepared on a device another claim holds"
    return answer


def test_a_gpu_held_whole_is_not_given_to_a_second_claim_until_the_first_is_unprepared(node: Node) -> None:
    first = add_claim(node.fake, "training", "uid-1", [result("gpu-0")])
    node.prepared(first)
    second = add_claim(node.fake, "forged", "uid-2", [result("gpu-1"), result("gpu-0")])
    error = refused(node, second)
    assert "gpu-0" in error
    assert "ns/training (uid-1)" in error, "the message names the claim that holds it"
    assert not cdi.spec_path(node.directory / "cdi", "uid-2").exists()
    assert set(node.preparer.checkpoint.claims) == {"uid-1"}, "nothing of the refused claim is kept"
    assert node.preparer.unprepare([first]) == {"uid-1": ""}
    assert isinstance(node.preparer.prepare([second])["uid-2"], PreparedClaim), "the kubelet's retry succeeds"


def test_a_claim_prepared_again_is_not_refused_by_itself(node: Node) -> None:
    ref = add_claim(node.fake, "training", "uid-1", [result("gpu-0")])
    assert node.prepared(ref) == node.prepared(ref)


def test_shares_with_their_own_ids_share_and_a_share_id_is_one_claims(node: Node) -> None:
    a = add_claim(node.fake, "a", "uid-a", [result("gpu-2", share="s-1", consumed=SHARE)])
    b = add_claim(node.fake, "b", "uid-b", [result("gpu-2", share="s-2", consumed=SHARE)])
    node.prepared(a)
    node.prepared(b)
    again = add_claim(node.fake, "again", "uid-c", [result("gpu-2", share="s-1", consumed=SHARE)])
    assert "s-1" in refused(node, again)
    whole = add_claim(node.fake, "whole", "uid-d", [result("gpu-2")])
    assert "gpu-2" in refused(node, whole)
    full = add_claim(node.fake, "full", "uid-e", [result("gpu-2", share="s-9", consumed={"compute": "1000"})])
    assert "whole" in refused(node, full), "a share of all the compute is the whole GPU"


def test_a_share_of_a_gpu_held_whole_is_refused(node: Node) -> None:
    node.prepared(add_claim(node.fake, "whole", "uid-w", [result("gpu-3")]))
    share = add_claim(node.fake, "share", "uid-s", [result("gpu-3", share="s-1", consumed=SHARE)])
    assert "held whole" in refused(node, share)


def test_a_checkpoint_written_before_holdings_were_kept_still_holds(node: Node) -> None:
    """An agent upgraded over a checkpoint without ``gpuUUID``/``exclusive``: its claims still hold their GPUs
    (a device without a share ID whole)."""
    node.prepared(add_claim(node.fake, "old", "uid-old", [result("gpu-4")]))
    path = node.directory / "plugin" / "checkpoint.json"
    raw = json.loads(path.read_text())
    for device in raw["claims"]["uid-old"]["devices"]:
        assert device.pop("gpuUUID") == node.uuid(4)
        assert device.pop("exclusive") is True
    path.write_text(json.dumps(raw))
    node.restart()
    assert "ns/old" in refused(node, add_claim(node.fake, "new", "uid-new", [result("gpu-4")]))


def test_a_mig_instance_and_its_gpu_are_never_held_by_two_claims() -> None:
    """The node publishes a GPU in MIG mode as instances only; a claim prepared on the GPU before its layout
    changed still holds it, and no instance of it is given beside it (nor the GPU beside an instance)."""
    whole = Holding("gpu-1", "GPU-1", mig=False, share_id=None, exclusive=True)
    share = Holding("gpu-1", "GPU-1", mig=False, share_id="s", exclusive=False)
    instance = Holding("gpu-1-mig-0", "GPU-1", mig=True, share_id=None, exclusive=True)
    other = Holding("gpu-1-mig-4", "GPU-1", mig=True, share_id=None, exclusive=True)
    elsewhere = Holding("gpu-2", "GPU-2", mig=False, share_id=None, exclusive=True)
    assert conflicts(instance, whole)
    assert conflicts(share, instance)
    assert conflicts(whole, instance)
    assert not conflicts(instance, other), "two instances of one GPU are two devices"
    assert not conflicts(elsewhere, whole)


def test_shares_that_would_take_more_than_the_gpu_are_refused(node: Node) -> None:
    """Two allocations of 600 milli-GPU each on one GPU, each with its own share ID: each alone is a share, both
    together oversubscribe the GPU, and MPS would hold each to its own 60 %."""
    node.prepared(add_claim(node.fake, "a", "uid-a", [result("gpu-2", share="s-1", consumed={"compute": "600"})]))
    over = add_claim(node.fake, "b", "uid-b", [result("gpu-2", share="s-2", consumed={"compute": "600"})])
    error = refused(node, over)
    assert "1200 milli-GPU" in error
    assert "ns/a (uid-a)" in error
    fits = add_claim(node.fake, "c", "uid-c", [result("gpu-2", share="s-3", consumed={"compute": "400"})])
    assert isinstance(node.preparer.prepare([fits])["uid-c"], PreparedClaim), "what is left of the GPU fits"


def test_shares_that_would_take_more_than_the_gpus_memory_are_refused(node: Node) -> None:
    assert node.inventory is not None
    memory = node.inventory.gpus[2].memory_mib
    half = f"{memory // 2 + 1024}Mi"
    node.prepared(add_claim(node.fake, "a", "uid-a", [result("gpu-2", share="s-1",
                                                             consumed={"compute": "100", "memory": half})]))
    over = add_claim(node.fake, "b", "uid-b", [result("gpu-2", share="s-2",
                                                      consumed={"compute": "100", "memory": half})])
    assert f"more than its {memory} MiB" in refused(node, over)


def test_a_kept_share_without_its_capacities_counts_as_none(node: Node) -> None:
    """A checkpoint written before consumed capacities were kept: its shares hold their share IDs, not their
    size (nothing to refuse on), and the checkpoint read is not an error."""
    node.prepared(add_claim(node.fake, "a", "uid-a", [result("gpu-2", share="s-1", consumed={"compute": "600"})]))
    path = node.directory / "plugin" / "checkpoint.json"
    raw = json.loads(path.read_text())
    (device,) = raw["claims"]["uid-a"]["devices"]
    assert (device.pop("milli"), device.pop("memoryMiB")) == (600, 0)
    path.write_text(json.dumps(raw))
    node.restart()
    again = add_claim(node.fake, "b", "uid-b", [result("gpu-2", share="s-2", consumed={"compute": "600"})])
    assert isinstance(node.preparer.prepare([again])["uid-b"], PreparedClaim)
    same = add_claim(node.fake, "c", "uid-c", [result("gpu-2", share="s-1", consumed={"compute": "100"})])
    assert "s-1" in refused(node, same)


def test_one_claims_shares_that_come_to_more_than_the_gpu_are_refused(node: Node) -> None:
    """Two shares of 600 milli-GPU on one GPU in a single claim were one grant capped at the whole GPU: a pod
    told it holds all of a GPU that no scheduler gave it whole."""
    both = add_claim(node.fake, "both", "uid-both", [result("gpu-3", share="a", consumed={"compute": "600"}),
                                                     result("gpu-3", share="b", consumed={"compute": "600"})])
    error = refused(node, both)
    assert "the shares asked (1200 milli-GPU) come to 1200 milli-GPU, more than the GPU" in error
    assert "unprepared" not in error, "no other claim to wait for: the kubelet's retry cannot help"
