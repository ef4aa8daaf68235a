"""Preparing claims: the CDI spec and its environment (the device plugin's), per-claim errors, the
checkpoint across restarts, and the plugin's two gRPC services on real Unix sockets."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest

pytest.importorskip("grpc", reason="tests/node needs the `node` extra: pip install -e '.[dev,node]' (grpcio)")
pytest.importorskip("grpc_tools", reason="tests/node needs the `node` extra: pip install -e '.[dev,node]' "
                                         "(grpcio-tools)")

import grpc  # type: ignore[import-untyped]

from kubecell.kube import dra_names as names
from kubecell.kube.inventory_schema import NodeInventory
from kubecell.kube.records import AllocationRecord, GpuGrant
from kubecell.kube.rest import ApiError, Kube
from kubecell.node import protos
from kubecell.node.dra import cdi
from kubecell.node.dra.checkpoint import Checkpoint, ClaimRef, PreparedClaim
from kubecell.node.dra.health import HealthService
from kubecell.node.dra.plugin import KubeletPlugin, PluginPaths
from kubecell.node.dra.prepared import ClaimPreparer
from kubecell.node.isolation import NodeIsolation, container_allocation
from tests.node.dra.test_slices import FakeKube, inventory_of

NODE = "n1"


def result(device: str, request: str = "gpu", *, pool: str = NODE, driver: str = names.DRIVER,
           share: str | None = None, consumed: dict[str, str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"request": request, "driver": driver, "pool": pool, "device": device}
    if share is not None:
        out["shareID"] = share
    if consumed is not None:
        out["consumedCapacity"] = consumed
    return out


def add_claim(fake: FakeKube, name: str, uid: str, results: list[dict[str, Any]] | None,
              namespace: str = "ns") -> ClaimRef:
    status = {} if results is None else {"allocation": {"devices": {"results": results}}}
    fake.add(f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}",
             {"metadata": {"namespace": namespace, "name": name, "uid": uid}, "status": status})
    return ClaimRef(namespace, uid, name)


class Node:
    """A preparer on a fake API with the inventory of a fake NVML example."""

    def __init__(self, directory: Path, example: str = "a100-nvlink", modes: tuple[str, ...] = ("accounting",),
                 unhealthy: tuple[int, ...] = ()) -> None:
        self.fake = FakeKube()
        self.directory = directory
        self.inventory: NodeInventory | None = inventory_of(example, unhealthy)
        self.modes = modes
        self.acquired: list[tuple[str, str]] = []
        self.released: list[tuple[str, str]] = []
        self.preparer = self.restart()

    def restart(self) -> ClaimPreparer:
        """A new preparer (a restarted agent) on the same checkpoint and CDI directory."""
        self.preparer = ClaimPreparer(
            cast(Kube, self.fake), NODE, cdi_dir=self.directory / "cdi",
            checkpoint=Checkpoint.load(self.directory / "plugin" / "checkpoint.json"),
            inventory=lambda: self.inventory, isolation=lambda: NodeIsolation(self.modes, self.directory / "mps"),
            acquire=lambda record: self.acquired.extend((g.uuid, record.allocation_id) for g in record.gpus),
            release=lambda uuid, holder: self.released.append((uuid, holder)))
        return self.preparer

    def prepared(self, ref: ClaimRef) -> PreparedClaim:
        answer = self.preparer.prepare([ref])[ref.uid]
        assert isinstance(answer, PreparedClaim), answer
        return answer

    def env(self, ref: ClaimRef, request: str, device: str) -> dict[str, str]:
        spec = cdi.read_spec(self.directory / "cdi", ref.uid)
        assert spec is not None
        return cdi.env_of(spec, cdi.device_name(ref.uid, request, device))

    def uuid(self, index: int) -> str:
        assert self.inventory is not None
        return self.inventory.gpus[index].uuid


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def device_plugin_env(node: Node, record_gpus: list[GpuGrant], isolation: str, allocation_id: str) -> dict[str, str]:
    """What the device plugin path gives a container for a record with these GPUs (the reference)."""
    assert node.inventory is not None
    record = AllocationRecord(allocation_id=allocation_id, pod_uid="p", attempt=0, node=NODE, gpus=record_gpus,
                              cpu_milli=0, memory_mib=0, isolation=isolation, job="ns/p", vc="v",
                              job_class="guaranteed", member=0, batch=1, scheduler="s", created_at=datetime.now(UTC))
    memory = {g.uuid: g.memory_mib for g in node.inventory.gpus}
    memory.update({m.uuid: m.memory_mib for g in node.inventory.gpus for m in g.mig_instances})
    modes = (*node.modes, "mig")
    return dict(container_allocation(record, NodeIsolation(modes, node.directory / "mps"), memory).envs)


def test_a_whole_gpu_claim_gets_the_device_plugins_environment(node: Node) -> None:
    ref = add_claim(node.fake, "whole", "uid-whole", [result("gpu-3", share="s-1",
                                                             consumed={"compute": "1k", "memory": "0"})])
    prepared = node.prepared(ref)
    (device,) = prepared.devices
    assert (device.request_names, device.pool, device.device, device.share_id) == (("gpu",), NODE, "gpu-3", "s-1")
    assert device.cdi_ids == (f"gpu.kubecell.io/claim={ref.uid}-gpu-gpu-3",)
    spec = json.loads(cdi.spec_path(node.directory / "cdi", ref.uid).read_text())
    assert spec["cdiVersion"] == "0.6.0"
    assert spec["kind"] == "gpu.kubecell.io/claim"
    assert cdi.spec_path(node.directory / "cdi", ref.uid).name == f"gpu.kubecell.io-{ref.uid}.json"
    gpu = node.inventory.gpus[3] if node.inventory else None
    assert gpu is not None
    env = node.env(ref, "gpu", "gpu-3")
    assert env == device_plugin_env(node, [GpuGrant(index=3, uuid=gpu.uuid, milli=1000, memory_mib=gpu.memory_mib)],
                                    "accounting", ref.uid)
    assert env["NVIDIA_VISIBLE_DEVICES"] == gpu.uuid
    assert env["KUBECELL_GPU_MILLI"] == "1000"


def test_a_share_gets_its_consumed_capacity_and_mps_limits_where_the_node_runs_mps(tmp_path: Path) -> None:
    for modes, isolation in ((("accounting",), "accounting"), (("accounting", "mps"), "mps")):
        node = Node(tmp_path / isolation, modes=modes)
        ref = add_claim(node.fake, "share", f"uid-{isolation}", [
            result("gpu-2", share="s", consumed={"compute": "250", "memory": "10Gi"})])
        node.prepared(ref)
        env = node.env(ref, "gpu", "gpu-2")
        assert env == device_plugin_env(node, [GpuGrant(index=2, uuid=node.uuid(2), milli=250, memory_mib=10240)],
                                        isolation, ref.uid)
        assert env["KUBECELL_GPU_MILLI"] == "250"
        assert env["KUBECELL_GPU_MEMORY_MIB"] == "10240"
        if isolation == "mps":
            assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
            assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"
            spec = cdi.read_spec(node.directory / "cdi", ref.uid)
            assert spec is not None
            assert {m["containerPath"] for m in spec["devices"][0]["containerEdits"]["mounts"]} == {
                "/var/run/kubecell-mps/pipe", "/var/run/kubecell-mps/log"}
            assert node.acquired == [(node.uuid(2), ref.uid)]
            assert node.preparer.mps_holders() == {node.uuid(2): {ref.uid}}
            assert node.preparer.unprepare([ref]) == {ref.uid: ""}
            assert node.released == [(node.uuid(2), ref.uid)]
        else:
            assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env
            assert not node.acquired


def test_a_two_gpu_request_names_both_gpus_in_every_device(node: Node) -> None:
    ref = add_claim(node.fake, "pair", "uid-pair", [result("gpu-0"), result("gpu-1"), result("gpu-5", "other")])
    prepared = node.prepared(ref)
    assert [d.device for d in prepared.devices] == ["gpu-0", "gpu-1", "gpu-5"]
    both = f"{node.uuid(0)},{node.uuid(1)}"
    assert node.env(ref, "gpu", "gpu-0")["NVIDIA_VISIBLE_DEVICES"] == both
    assert node.env(ref, "gpu", "gpu-1")["NVIDIA_VISIBLE_DEVICES"] == both
    assert node.env(ref, "other", "gpu-5")["NVIDIA_VISIBLE_DEVICES"] == node.uuid(5)


def test_a_subrequest_answers_with_its_parent_request(node: Node) -> None:
    ref = add_claim(node.fake, "first", "uid-first", [result("gpu-1", "gpu/big")])
    (device,) = node.prepared(ref).devices
    assert device.request_names == ("gpu",)
    assert device.cdi_ids == (f"gpu.kubecell.io/claim={ref.uid}-gpu-big-gpu-1",)


def test_a_mig_instance_gets_its_uuid_and_mig_isolation(tmp_path: Path) -> None:
    node = Node(tmp_path, "a100-mig-1g")
    assert node.inventory is not None
    instance = node.inventory.gpus[1].mig_instances[2]
    name = f"gpu-1-mig-{instance.start}"
    ref = add_claim(node.fake, "slice", "uid-mig", [result(name, "mig")])
    node.prepared(ref)
    env = node.env(ref, "mig", name)
    assert env["NVIDIA_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"] == instance.uuid
    assert env["KUBECELL_ISOLATION"] == "mig"
    two = add_claim(node.fake, "two", "uid-two", [result("gpu-0-mig-0", "mig"), result("gpu-0-mig-1", "mig")])
    error = node.preparer.prepare([two])[two.uid]
    assert isinstance(error, str)
    assert "one MIG instance" in error


def test_every_problem_is_that_claims_error_and_the_others_are_prepared(tmp_path: Path) -> None:
    node = Node(tmp_path, unhealthy=(6,))
    good = add_claim(node.fake, "good", "uid-good", [result("gpu-0")])
    refs = {
        "not found": ClaimRef("ns", "uid-gone", "gone"),
        "has UID uid-real": replace(add_claim(node.fake, "moved", "uid-real", [result("gpu-1")]), uid="uid-old"),
        "is not allocated": add_claim(node.fake, "pending", "uid-pending", None),
        "no device of gpu.kubecell.io": add_claim(node.fake, "other", "uid-other", [result("x", driver="x.io")]),
        "pool(s) n2": add_claim(node.fake, "far", "uid-far", [result("gpu-2", pool="n2")]),
        "has no device gpu-9": add_claim(node.fake, "unknown", "uid-unknown", [result("gpu-9")]),
        "is unhealthy": add_claim(node.fake, "broken", "uid-broken", [result("gpu-6")]),
    }
    answers = node.preparer.prepare([good, *refs.values()])
    assert isinstance(answers[good.uid], PreparedClaim)
    for words, ref in refs.items():
        answer = answers[ref.uid]
        assert isinstance(answer, str), (words, answer)
        assert words in answer, (words, answer)
        assert cdi.read_spec(node.directory / "cdi", ref.uid) is None
    assert set(node.preparer.checkpoint.claims) == {good.uid}
    node.inventory = None
    late = add_claim(node.fake, "late", "uid-late", [result("gpu-0")])
    assert "not discovered yet" in str(node.preparer.prepare([late])[late.uid])


def test_prepare_is_idempotent_and_survives_a_restart_without_the_api(node: Node) -> None:
    ref = add_claim(node.fake, "c", "uid-c", [result("gpu-4", share="s", consumed={"compute": "500"})])
    first = node.prepared(ref)
    assert node.prepared(ref) == first
    node.fake.fail = ApiError(0, "Unavailable", "connection refused")
    node.restart()
    assert node.prepared(ref) == first, "answered from the checkpoint"
    saved = json.loads((node.directory / "plugin" / "checkpoint.json").read_text())
    assert saved["version"] == 1
    assert list(saved["claims"]) == [ref.uid]
    assert node.preparer.unprepare([ref]) == {ref.uid: ""}
    assert not cdi.spec_path(node.directory / "cdi", ref.uid).exists()
    assert node.preparer.unprepare([ref, ClaimRef("ns", "never", "x")]) == {ref.uid: "", "never": ""}
    node.restart()
    assert node.preparer.checkpoint.claims == {}
    assert not [p for d in ("plugin", "cdi") for p in (node.directory / d).iterdir()
                if p.name.startswith((cdi.PARTIAL_PREFIX, ".partial-"))], "no temporary file left"


def test_a_capacity_named_with_the_drivers_domain_is_the_same_capacity(tmp_path: Path) -> None:
    """``gpu.kubecell.io/compute`` is ``compute`` (the API's two spellings of a driver's capacity; the scheduler
    reads both): before, the qualified one was not read, and a 250 milli-GPU share was prepared as a whole GPU."""
    node = Node(tmp_path)
    ref = add_claim(node.fake, "share", "uid-q", [result("gpu-2", share="s", consumed={
        f"{names.DRIVER}/compute": "250", f"{names.DRIVER}/memory": "10Gi"})])
    node.prepared(ref)
    env = node.env(ref, "gpu", "gpu-2")
    assert (env["KUBECELL_GPU_MILLI"], env["KUBECELL_GPU_MEMORY_MIB"]) == ("250", "10240")


def test_what_each_prepared_claim_takes_of_each_gpu_is_told_to_the_overuse_monitor(tmp_path: Path) -> None:
    node = Node(tmp_path)
    share = add_claim(node.fake, "share", "uid-share", [
        result("gpu-2", share="s", consumed={"compute": "250", "memory": "10Gi"})])
    whole = add_claim(node.fake, "whole", "uid-whole", [result("gpu-0"), result("gpu-1")])
    node.prepared(share)
    node.prepared(whole)
    assert node.preparer.claim_holdings() == {
        ("ns", "share"): {node.uuid(2): (250, 10240)},
        ("ns", "whole"): {node.uuid(0): (1000, 0), node.uuid(1): (1000, 0)}}


@pytest.mark.parametrize("text", [
    "{not json",
    "[" * 100_000 + "]" * 100_000,  # a RecursionError escaped, and the agent crash-looped
    json.dumps({"version": 1, "claims": {"u": {"namespace": "ns", "name": "c", "devices": [],
                                               "mpsGPUs": "GPU-abc"}}}),  # read as its characters
    json.dumps({"version": 1, "claims": {"u": {"namespace": "ns", "name": "c", "mpsGPUs": [], "devices": [{
        "requestNames": "gpu", "poolName": "p", "deviceName": "gpu-0", "cdiDeviceIDs": ["x"]}]}}}),
], ids=["not-json", "deep", "mps-string", "names-string"])
def test_a_corrupt_checkpoint_is_set_aside(tmp_path: Path, text: str) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_text(text)
    assert Checkpoint.load(path).claims == {}
    assert path.with_suffix(".corrupt").read_text() == text


def test_only_regular_files_of_the_shared_cdi_directory_are_read_and_only_their_head(tmp_path: Path) -> None:
    """The CDI directory is shared with other vendors' tools: a FIFO named like a legacy partial hung the agent at
    every start, and a huge one was read whole."""
    os.mkfifo(tmp_path / ".partial-fifo.json")
    (tmp_path / ".partial-zero.json").symlink_to("/dev/zero")
    big = tmp_path / ".partial-big.json"
    big.write_text(f'{{"kind": "{names.CDI_KIND}"}}' + " " * 2**20)
    theirs = tmp_path / ".partial-theirs.json"
    theirs.write_text('{"kind": "vendor.example/gpu"}')
    done = threading.Event()
    removed: list[Path] = []

    def remove() -> None:
        removed.extend(cdi.remove_partials(tmp_path))
        done.set()

    threading.Thread(target=remove, daemon=True).start()
    assert done.wait(10), "remove_partials blocked on a FIFO"
    assert removed == [big], "ours (by its head) goes; another vendor's, the FIFO and the link stay"
    assert theirs.exists()


# -- the gRPC services ------------------------------------------------------------------------------------


@contextlib.contextmanager
def serving(preparer: ClaimPreparer, health: HealthService | None = None) -> Iterator[KubeletPlugin]:
    """The plugin's servers on sockets in a fresh short directory (Unix socket paths are short), advertising
    ``/var/lib/kubelet/x``."""
    root = Path(tempfile.mkdtemp(prefix="kcdra", dir="/tmp"))
    paths = PluginPaths(root / "plugins" / names.DRIVER, root / "plugins_registry", Path("/var/lib/kubelet/x"))
    plugin = KubeletPlugin(preparer, paths, poll_interval=0.05, health=health)
    plugin.start()
    try:
        yield plugin
    finally:
        plugin.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def served(node: Node) -> Iterator[KubeletPlugin]:
    with serving(node.preparer) as plugin:
        yield plugin


def test_registration_and_prepare_over_grpc(node: Node, served: KubeletPlugin) -> None:
    registration, dra = protos.pluginregistration(), protos.dra()
    paths = served.paths
    assert paths.registration_socket.name == "gpu.kubecell.io-reg.sock"
    with grpc.insecure_channel(f"unix://{paths.registration_socket}") as channel:
        stub = registration.grpc.RegistrationStub(channel)
        info = stub.GetInfo(registration.pb2.InfoRequest(), timeout=10)
        assert (info.type, info.name, info.endpoint, list(info.supported_versions)) == (
            "DRAPlugin", "gpu.kubecell.io", "/var/lib/kubelet/x/dra.sock", ["v1.DRAPlugin", "v1.DRAResourceHealth"])
        stub.NotifyRegistrationStatus(registration.pb2.RegistrationStatus(plugin_registered=True), timeout=10)
    assert served.registered.is_set()
    ref = add_claim(node.fake, "c", "uid-c", [result("gpu-1", share="share-1", consumed={"compute": "250"})])
    with grpc.insecure_channel(f"unix://{paths.dra_socket}") as channel:
        stub = dra.grpc.DRAPluginStub(channel)
        claims = [dra.pb2.Claim(namespace="ns", uid=ref.uid, name="c"), dra.pb2.Claim(namespace="ns", uid="u2",
                                                                                       name="missing")]
        answer = stub.NodePrepareResources(dra.pb2.NodePrepareResourcesRequest(claims=claims), timeout=10)
        assert "not found" in answer.claims["u2"].error
        (device,) = answer.claims[ref.uid].devices
        assert (list(device.request_names), device.pool_name, device.device_name, device.share_id) == (
            ["gpu"], NODE, "gpu-1", "share-1")
        assert list(device.cdi_device_ids) == [f"gpu.kubecell.io/claim={ref.uid}-gpu-gpu-1"]
        undone = stub.NodeUnprepareResources(dra.pb2.NodeUnprepareResourcesRequest(claims=claims[:1]), timeout=10)
        assert undone.claims[ref.uid].error == ""
    assert not cdi.spec_path(node.directory / "cdi", ref.uid).exists()
    paths.registration_socket.unlink()  # someone cleaned the directory: served again
    deadline = time.monotonic() + 10
    while not paths.registration_socket.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert paths.registration_socket.is_socket()
