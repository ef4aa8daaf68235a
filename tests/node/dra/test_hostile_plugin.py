"""The node's DRA kubelet plugin under claims, allocations and node failures it does not expect (a hostile
review).

Each test fails on the code before its fix: a plugin killed while writing a CDI spec left a ``.partial-*.json``
in the CDI directory, which runtimes read as a spec, so the claim's devices were defined twice and dropped
(the pod never started); an unprepare whose checkpoint write failed forgot the claim, so the retry succeeded
without releasing its MPS daemon; one claim's unexpected error (a negative consumed memory) failed every
claim of the call with "internal error"; a device named twice in one allocation doubled the memory the
container is told it has; and a prepare waiting on a slow API server held the lock every other prepare,
unprepare and the MPS housekeeping wait on."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("grpc", reason="tests/node needs the `node` extra: pip install -e '.[dev,node]' (grpcio)")

from kubecell.node.dra import cdi
from kubecell.node.dra.checkpoint import ClaimRef, PreparedClaim
from kubecell.node.dra.prepared import Allocated, request_record
from kubecell.node.dra.slices import all_devices
from tests.node.dra.test_cdi import Node, add_claim, result
from tests.node.dra.test_slices import FakeKube

CDI_SPEC_SUFFIXES = (".json", ".yaml")
"""What the CDI library's ``scanSpecDirs`` reads as a spec (``filepath.Ext``), hidden files included."""


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def test_a_spec_being_written_is_never_a_file_a_runtime_reads_as_a_spec(node: Node,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed between writing the temporary file and renaming it, the plugin left a complete spec under a
    ``.json`` name: the runtime's CDI cache loads it next to the real one, sees each device twice at one
    priority and drops both ("unresolvable CDI devices")."""
    renamed: list[str] = []
    real_replace = os.replace

    def replace(src: Any, dst: Any) -> None:
        renamed.append(Path(src).name)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    ref = add_claim(node.fake, "c", "uid-c", [result("gpu-0")])
    node.prepared(ref)
    assert len(renamed) == 2, "the spec and the checkpoint"
    for name in renamed:
        assert Path(name).suffix not in CDI_SPEC_SUFFIXES, f"{name} is read as a CDI spec while it exists"


def test_what_a_killed_plugin_left_half_written_is_removed_at_start(node: Node) -> None:
    ref = add_claim(node.fake, "c", "uid-c", [result("gpu-0")])
    node.prepared(ref)
    spec = cdi.read_spec(node.directory / "cdi", ref.uid)
    cdi_dir, plugin_dir = node.directory / "cdi", node.directory / "plugin"
    left = [cdi_dir / f"{cdi.PARTIAL_PREFIX}x1y2{cdi.PARTIAL_SUFFIX}", plugin_dir / f"{cdi.PARTIAL_PREFIX}z"
            f"{cdi.PARTIAL_SUFFIX}", cdi_dir / ".partial-abc123.json"]  # the last: the name before the fix
    for path in left:
        path.write_text(json.dumps(spec))
    foreign = [cdi_dir / ".partial-other.json", cdi_dir / "vendor.com-x.json", cdi_dir / "notes.tmp"]
    for path in foreign:
        path.write_text(json.dumps({"cdiVersion": "0.6.0", "kind": "vendor.com/x", "devices": []}))
    node.restart()
    for path in left:
        assert not path.exists(), f"{path.name} left behind"
    for path in foreign:
        assert path.exists(), f"{path.name} is not ours"
    assert node.prepared(ref).ref == ref, "the claim is still prepared"
    assert cdi.read_spec(cdi_dir, ref.uid) == spec


def test_an_unprepare_that_cannot_save_keeps_the_claim_and_the_retry_releases_its_mps_daemon(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(tmp_path, modes=("accounting", "mps"))
    ref = add_claim(node.fake, "share", "uid-share", [result("gpu-2", share="s", consumed={"compute": "250"})])
    node.prepared(ref)
    checkpoint = node.preparer.checkpoint
    real_save = checkpoint.save

    def full_disk() -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint, "save", full_disk)
    answer = node.preparer.unprepare([ref])[ref.uid]
    assert "No space left" in answer
    assert node.preparer.mps_holders() == {node.uuid(2): {ref.uid}}, "still held: the kubelet will retry"
    assert node.released == []
    monkeypatch.setattr(checkpoint, "save", real_save)
    assert node.preparer.unprepare([ref]) == {ref.uid: ""}
    assert node.released == [(node.uuid(2), ref.uid)]
    assert node.preparer.mps_holders() == {}
    assert json.loads((tmp_path / "plugin" / "checkpoint.json").read_text())["claims"] == {}


def test_a_bad_consumed_capacity_is_that_claims_error_and_its_call_mates_are_prepared(node: Node) -> None:
    good = add_claim(node.fake, "good", "uid-good", [result("gpu-0")])
    bad = add_claim(node.fake, "bad", "uid-bad", [result("gpu-1", share="s", consumed={"compute": "250",
                                                                                      "memory": "-5Gi"})])
    answers = node.preparer.prepare([good, bad])
    assert isinstance(answers[good.uid], PreparedClaim)
    error = answers[bad.uid]
    assert isinstance(error, str)
    assert "consumed memory '-5Gi'" in error
    assert cdi.read_spec(node.directory / "cdi", bad.uid) is None
    assert set(node.preparer.checkpoint.claims) == {good.uid}


def test_an_unexpected_error_fails_only_its_claim(tmp_path: Path) -> None:
    node = Node(tmp_path, modes=("accounting", "mps"))

    def broken(record: Any) -> None:
        raise RuntimeError("the MPS control daemon's pipe is a directory")

    node.preparer.acquire = broken
    good = add_claim(node.fake, "good", "uid-good", [result("gpu-0")])
    bad = add_claim(node.fake, "bad", "uid-bad", [result("gpu-1", share="s", consumed={"compute": "250"})])
    answers = node.preparer.prepare([good, bad])
    assert isinstance(answers[good.uid], PreparedClaim)
    assert answers[bad.uid] == "internal error: RuntimeError: the MPS control daemon's pipe is a directory"
    assert cdi.read_spec(node.directory / "cdi", bad.uid) is None
    assert set(node.preparer.checkpoint.claims) == {good.uid}


@pytest.mark.parametrize("results", [
    [result("gpu-0"), result("gpu-0")],
    [result("gpu-0"), result("gpu-0", "other")],
    [result("gpu-3", share="s", consumed={"compute": "250"}), result("gpu-3", share="s", consumed={"compute": "250"})],
    [result("gpu-0", share="a"), result("gpu-0", share="b")],
    [result("gpu-0", "one", share="a"), result("gpu-0", "two", share="b")],
    [result("gpu-0", share=share, consumed={"compute": "1000"}) for share in ("a", "b")],
    [result("gpu-0", share="a"), result("gpu-0", share="b", consumed={"compute": "250"})],
    [result("gpu-0"), result("gpu-0", share="b", consumed={"compute": "250"})],
], ids=["one request", "two requests", "one share", "whole under two share IDs",
        "whole under two share IDs, two requests", "all the compute twice", "whole beside a share",
        "whole without a share ID beside a share"])
def test_a_device_named_twice_in_an_allocation_is_refused(node: Node, results: list[dict[str, Any]]) -> None:
    """Only a scheduler bug (or a hand-written status) names a device twice; taken as written it doubled the
    memory budget the container is told (``KUBECELL_GPU_MEMORY_MIB``: 80 GiB of a 40 GiB GPU). Keyed on
    (device, share ID), the check let a GPU named whole under two share IDs through: each result was read as
    the whole GPU and the container told it had twice its memory. A device is named more than once only as
    shares of it, each a part (``test_two_shares_of_one_gpu_in_one_claim_are_still_one_grant_of_the_sum``)."""
    ref = add_claim(node.fake, "twice", "uid-twice", results)
    answer = node.preparer.prepare([ref])[ref.uid]
    assert isinstance(answer, str)
    assert "more than once" in answer
    assert cdi.read_spec(node.directory / "cdi", ref.uid) is None


def test_two_shares_of_one_gpu_in_one_claim_are_still_one_grant_of_the_sum(node: Node) -> None:
    ref = add_claim(node.fake, "two", "uid-two", [result("gpu-3", share="a", consumed={"compute": "250"}),
                                                  result("gpu-3", share="b", consumed={"compute": "250"})])
    node.prepared(ref)
    assert node.env(ref, "gpu", "gpu-3")["KUBECELL_GPU_MILLI"] == "500"


def test_a_mig_instance_named_under_two_share_ids_is_refused(tmp_path: Path) -> None:
    node = Node(tmp_path, "a100-mig-1g")
    ref = add_claim(node.fake, "mig", "uid-mig", [result("gpu-0-mig-0", "mig", share="a"),
                                                  result("gpu-0-mig-0", "mig", share="b")])
    answer = node.preparer.prepare([ref])[ref.uid]
    assert isinstance(answer, str)
    assert "more than once" in answer
    assert cdi.read_spec(node.directory / "cdi", ref.uid) is None


def test_shares_merged_into_one_grant_never_take_more_memory_than_the_gpu(node: Node) -> None:
    """The prepare refuses shares whose memory comes to more than the GPU (:mod:`.exclusive`); the record built
    from them caps the sum too, so that no path tells a container of more memory than its GPU has."""
    assert node.inventory is not None
    table = {device.name: device for device in all_devices(node.inventory)}
    gpu = table["gpu-3"]
    half = f"{gpu.memory_mib // 2 + 100}Mi"
    members = [Allocated("gpu", gpu, share, {"compute": "250", "memory": half}) for share in ("a", "b")]
    record = request_record(ClaimRef("ns", "uid", "c"), "n1", members, ("accounting",))
    assert [(g.milli, g.memory_mib) for g in record.gpus] == [(500, gpu.memory_mib)]


class SlowKube(FakeKube):
    """An API server that answers one claim only when told (a blackholed connection, a slow server)."""

    def __init__(self, slow: str) -> None:
        super().__init__()
        self.slow = slow
        self.asked = threading.Event()
        self.answer = threading.Event()

    def get(self, path: str, **query: Any) -> dict[str, Any]:
        if path.endswith(f"/{self.slow}"):
            self.asked.set()
            assert self.answer.wait(30)
        return super().get(path, **query)


def slowed(node: Node) -> SlowKube:
    """``node`` restarted on an API server whose claim reads wait until the test answers them."""
    fake = SlowKube("slow")
    fake.objects = node.fake.objects
    node.fake = fake
    node.restart()
    return fake


@contextmanager
def preparing(node: Node, fake: SlowKube, ref: ClaimRef) -> Iterator[dict[str, Any]]:
    """A prepare of ``ref`` on another thread, waiting for its claim's GET for the block; its answers after."""
    answers: dict[str, Any] = {}
    waiting = threading.Thread(target=lambda: answers.update(node.preparer.prepare([ref])))
    waiting.start()
    try:
        assert fake.asked.wait(10)
        yield answers
    finally:
        fake.answer.set()
        waiting.join(30)


def test_a_slow_api_server_does_not_hold_up_other_claims_unprepare_or_the_mps_housekeeping(node: Node) -> None:
    fake = slowed(node)
    done = add_claim(fake, "done", "uid-done", [result("gpu-0")])
    node.prepared(done)
    slow = add_claim(fake, "slow", "uid-slow", [result("gpu-1")])
    other = add_claim(fake, "other", "uid-other", [result("gpu-2")])
    with preparing(node, fake, slow) as answers:
        started = time.monotonic()
        assert node.preparer.unprepare([done]) == {done.uid: ""}
        assert node.preparer.mps_holders() == {}
        assert isinstance(node.preparer.prepare([other])[other.uid], PreparedClaim)
        assert time.monotonic() - started < 5, "waited on the slow claim's GET"
    assert isinstance(answers[slow.uid], PreparedClaim)
    assert set(node.preparer.checkpoint.claims) == {slow.uid, other.uid}


def test_concurrent_prepares_of_one_claim_prepare_it_once(tmp_path: Path) -> None:
    node = Node(tmp_path, modes=("accounting", "mps"))
    ref = add_claim(node.fake, "c", "uid-c", [result("gpu-4", share="s", consumed={"compute": "500"})])
    answers: list[Any] = []
    threads = [threading.Thread(target=lambda: answers.append(node.preparer.prepare([ref])[ref.uid]))
               for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(answers) == 8
    assert all(isinstance(a, PreparedClaim) for a in answers)
    assert all(a == answers[0] for a in answers)
    assert node.acquired == [(node.uuid(4), ref.uid)], "one MPS hold"
    assert list(node.preparer.checkpoint.claims) == [ref.uid]


def test_a_claim_replaced_under_its_name_is_not_prepared_for_the_old_uid_nor_answered_from_it(node: Node) -> None:
    old = add_claim(node.fake, "c", "uid-old", [result("gpu-0")])
    node.prepared(old)
    new = add_claim(node.fake, "c", "uid-new", [result("gpu-1")])
    assert isinstance(node.preparer.prepare([new])[new.uid], PreparedClaim)
    stale = ClaimRef("ns", "uid-gone", "c")
    answer = node.preparer.prepare([stale])[stale.uid]
    assert isinstance(answer, str)
    assert "has UID uid-new" in answer
    assert node.prepared(old).devices[0].device == "gpu-0", "the old UID's prepared answer, from the checkpoint"
    assert node.preparer.unprepare([old]) == {old.uid: ""}
    assert cdi.read_spec(node.directory / "cdi", new.uid) is not None, "the new claim's spec stays"


def test_an_unprepare_while_the_claim_is_read_wins_over_that_prepare(node: Node) -> None:
    """The kubelet gave up on a prepare (its call timed out) and unprepares the claim while the plugin still
    waits for the API server: the late prepare must not leave a spec and a checkpoint entry nobody removes."""
    fake = slowed(node)
    slow = add_claim(fake, "slow", "uid-slow", [result("gpu-1")])
    with preparing(node, fake, slow) as answers:
        assert node.preparer.unprepare([slow]) == {slow.uid: ""}
    assert "was unprepared while it was being prepared" in str(answers[slow.uid])
    assert cdi.read_spec(node.directory / "cdi", slow.uid) is None
    assert node.preparer.checkpoint.claims == {}
    assert isinstance(node.preparer.prepare([slow])[slow.uid], PreparedClaim), "a later prepare is not refused"


def test_a_failed_prepare_again_of_a_prepared_claim_keeps_what_it_held(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A prepared claim whose CDI spec went (``/var/run/cdi`` cleaned under a running pod) is prepared again
    when the kubelet asks. When that fails half-way (the spec cannot be written), the claim dropped out of the
    preparer's checkpoint and its MPS daemon was released: its pod's share stayed in use, yet a second claim
    was prepared on that GPU whole, and the next save forgot the claim for good (no unprepare, no sweep)."""
    node = Node(tmp_path, modes=("accounting", "mps"))
    share = add_claim(node.fake, "share", "uid-share", [result("gpu-2", share="s", consumed={"compute": "250"})])
    before = node.prepared(share)
    cdi.remove_spec(tmp_path / "cdi", share.uid)

    def full_disk(directory: Path, claim_uid: str, spec: dict[str, Any]) -> Path:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(cdi, "write_spec", full_disk)
        assert "No space left" in str(node.preparer.prepare([share])[share.uid])
    assert node.preparer.checkpoint.claims.get(share.uid) == before, "still prepared as before"
    assert node.preparer.mps_holders() == {node.uuid(2): {share.uid}}
    assert node.released == [], "its MPS daemon is still held"
    whole = add_claim(node.fake, "whole", "uid-whole", [result("gpu-2")])
    answer = node.preparer.prepare([whole])[whole.uid]
    assert isinstance(answer, str)
    assert "uid-share" in answer, answer
    assert node.prepared(share) == before, "the retry prepares it again"
