"""``gpu.kubecell.io`` against the real thing: the node agent with ``dra=True`` on a real kubelet v1.37.2
(``tests/node/test_real_kubelet.py``'s fixture), claims allocated by the STOCK kube-scheduler of the session's
testbed with the DeviceClasses of ``deploy/dra/deviceclasses.yaml``, prepared through the kubelet's DRA
plugin API into CDI specs, and unprepared when their pods go.

The real kubelet's node is the only node with slices of this driver (the testbed's other nodes have none),
so a claim can only be allocated there; its pods tolerate the node's ``NoSchedule`` taint and name no
scheduler. Skips, with the reason, where the real kubelet cannot run (no Go, not root, ...).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("grpc", reason="tests/node needs the `node` extra: pip install -e '.[dev,node]' (grpcio)")
pytest.importorskip("grpc_tools", reason="tests/node needs the `node` extra: pip install -e '.[dev,node]' "
                                         "(grpcio-tools)")

from kubecell.kube import dra_names as names
from kubecell.kube.dialects.resources import parse_quantity
from kubecell.kube.names import ANNOTATION_ALLOCATION, ANNOTATION_GPU_FAULT_CLEAR, ANNOTATION_GPU_FAULTS
from kubecell.kube.records import parse_record
from kubecell.kube.rest import ApiError, Kube
from kubecell.node.agent import AgentOptions, NodeAgent
from kubecell.node.dra import cdi
from kubecell.node.fake_nvml import FakeNvml, example_path
from kubecell.testbed.real_kubelet import TAINT_KEY, RealKubelet
from tests.dra_support import apply_device_classes, make_claim, make_template, request, results
from tests.node.test_real_kubelet import WAIT, _settled, real_kubelet
from tests.support import wait_for

__all__ = ["real_kubelet"]  # the module-scoped fixture: this module gets a kubelet of its own

RESOURCE = "/apis/resource.k8s.io/v1"


@pytest.fixture(scope="module")
def device_classes(real_kubelet: RealKubelet, kube: Kube) -> Iterator[list[str]]:
    """The shipped DeviceClasses, created (or replaced) on the testbed for this module, deleted afterwards."""
    served = kube.get(RESOURCE)
    assert {r["name"] for r in served["resources"]} >= {"resourceslices", "resourceclaims", "deviceclasses",
                                                        "resourceclaimtemplates"}
    created = apply_device_classes(kube)
    assert sorted(created) == sorted([names.CLASS_GPU, names.CLASS_GPU_SHARE, names.CLASS_MIG])
    try:
        yield created
    finally:
        for name in created:
            with contextlib.suppress(ApiError):
                kube.delete(f"{RESOURCE}/deviceclasses/{name}")


class DraAgent:
    """The whole node agent with ``dra=True`` on the real kubelet's node, its fake GPUs and its CDI directory."""

    def __init__(self, kubelet: RealKubelet, kube: Kube, example: str, tmp_path: Path) -> None:
        self.kubelet = kubelet
        self.kube = kube
        self.backend = FakeNvml.from_file(example_path(example))
        self.cdi_dir = tmp_path / "cdi"
        options = AgentOptions(
            node=kubelet.node, device_plugin_dir=kubelet.device_plugin_dir, pod_resources=kubelet.pod_resources,
            mps_root=tmp_path / "mps", interval=2.0, dra=True,
            dra_plugin_dir=kubelet.kubelet_dir / "plugins" / names.DRIVER,
            dra_registry_dir=kubelet.kubelet_dir / "plugins_registry",
            dra_advertised_dir=Path("/var/lib/kubelet/plugins") / names.DRIVER, cdi_dir=self.cdi_dir)
        self.agent = NodeAgent(kube, self.backend, options)
        assert self.agent.dra is not None
        self.dra = self.agent.dra
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.agent.run, args=(self.stop,), daemon=True, name="dra-agent")

    def slices(self) -> list[dict[str, Any]]:
        selector = f"spec.nodeName={self.kubelet.node},spec.driver={names.DRIVER}"
        items: list[dict[str, Any]] = self.kube.get(f"{RESOURCE}/resourceslices", fieldSelector=selector)["items"]
        return items

    def devices(self) -> dict[str, dict[str, Any]]:
        return {d["name"]: d for s in self.slices() for d in s["spec"].get("devices") or []}

    def spec_files(self) -> list[Path]:
        return sorted(self.cdi_dir.glob(f"{cdi.FILE_PREFIX}*.json")) if self.cdi_dir.is_dir() else []


@contextlib.contextmanager
def dra_agent(kubelet: RealKubelet, kube: Kube, tmp_path: Path, example: str,
              published: Callable[[DraAgent], bool]) -> Iterator[DraAgent]:
    # the node outlives each test's agent, and its faulted GPUs are kept on it across agents: a new test's GPUs are
    # new hardware, so the record of an earlier test's XIDs goes
    kube.patch(f"/api/v1/nodes/{kubelet.node}", {"metadata": {"annotations": {
        ANNOTATION_GPU_FAULTS: None, ANNOTATION_GPU_FAULT_CLEAR: None}}})
    running = DraAgent(kubelet, kube, example, tmp_path)
    running.thread.start()
    try:
        wait_for("the kubelet registered the DRA plugin", running.dra.plugin.registered.is_set, WAIT)
        wait_for(f"the slice of {example}", lambda: published(running), WAIT)
        yield running
    finally:
        running.stop.set()
        running.thread.join(30)


@pytest.fixture
def gpus(real_kubelet: RealKubelet, kube: Kube, tmp_path: Path, device_classes: list[str]) -> Iterator[DraAgent]:
    """The agent with the fake NVML's eight A100s (two NVLink islands)."""
    with dra_agent(real_kubelet, kube, tmp_path, "a100-nvlink", lambda a: len(a.devices()) == 8) as running:
        yield running


@pytest.fixture
def mig(real_kubelet: RealKubelet, kube: Kube, tmp_path: Path, device_classes: list[str]) -> Iterator[DraAgent]:
    """The agent with two A100s in MIG mode, seven 1g.5gb instances each."""
    with dra_agent(real_kubelet, kube, tmp_path, "a100-mig-1g", lambda a: len(a.devices()) == 14 and all(
            "-mig-" in name for name in a.devices())) as running:
        yield running


def claim_spec(device_class: str, *, compute: str | None = None, selector: str | None = None) -> list[dict[str, Any]]:
    """The requests of a one-device claim named ``gpu``."""
    return [request("gpu", device_class, capacity={names.CAPACITY_COMPUTE: compute} if compute is not None else None,
                    selectors=[selector] if selector is not None else ())]


def make_pod(kube: Kube, namespace: str, name: str, claims: dict[str, dict[str, str]],
             scheduler: str | None = None) -> None:
    """A pod of the stock kube-scheduler (no ``schedulerName``), or of ``scheduler``, whose one container uses
    every claim."""
    kube.create(f"/api/v1/namespaces/{namespace}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {**({"schedulerName": scheduler} if scheduler else {}),
                 "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                 "tolerations": [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
                 "resourceClaims": [{"name": claim, **source} for claim, source in claims.items()],
                 "containers": [{"name": "main", "image": "registry.invalid/cuda:12",
                                 "resources": {"claims": [{"name": claim} for claim in claims]}}]}})


def claims_of(kube: Kube, namespace: str, pod: str) -> dict[str, dict[str, Any]]:
    """The pod's ResourceClaims by the pod's claim names (generated ones through ``status.resourceClaimStatuses``)."""
    got = kube.get(f"/api/v1/namespaces/{namespace}/pods/{pod}")
    generated = {s["name"]: s.get("resourceClaimName") for s in got["status"].get("resourceClaimStatuses") or []}
    out = {}
    for entry in got["spec"]["resourceClaims"]:
        name = entry.get("resourceClaimName") or generated.get(entry["name"])
        out[entry["name"]] = kube.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{name}")
    return out


def results_of(claim: dict[str, Any]) -> list[dict[str, Any]]:
    found = results(claim)
    assert found, f"claim {claim['metadata']['name']} is not allocated"
    return found


def running(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    pod = _settled(kube, namespace, name)
    assert pod["status"]["phase"] == "Running", pod["status"]
    return pod


def env_of_claim(agent: DraAgent, claim: dict[str, Any]) -> dict[str, str]:
    uid = claim["metadata"]["uid"]
    spec = cdi.read_spec(agent.cdi_dir, uid)
    assert spec is not None, f"no CDI spec for claim {claim['metadata']['name']} in {agent.spec_files()}"
    (result,) = results_of(claim)
    return cdi.env_of(spec, cdi.device_name(uid, result["request"], result["device"]))


def delete_and_wait_unprepared(kube: Kube, agent: DraAgent, namespace: str, *pods: str) -> None:
    for pod in pods:
        kube.delete(f"/api/v1/namespaces/{namespace}/pods/{pod}")
    wait_for("the kubelet unprepared every claim (no CDI spec left)", lambda: not agent.spec_files(), WAIT)


def test_the_agent_publishes_its_slice_and_the_kubelet_registers_the_plugin(
        real_kubelet: RealKubelet, kube: Kube, gpus: DraAgent) -> None:
    (one,) = gpus.slices()
    assert one["metadata"]["name"] == f"{real_kubelet.node}-gpu.kubecell.io"
    node = kube.get(f"/api/v1/nodes/{real_kubelet.node}")
    assert one["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": real_kubelet.node,
                                                   "uid": node["metadata"]["uid"]}]
    assert one["spec"]["pool"]["name"] == real_kubelet.node
    assert one["spec"]["pool"]["resourceSliceCount"] == 1
    devices = gpus.devices()
    uuids = [d.uuid for d in gpus.backend.devices()]
    assert [devices[f"gpu-{i}"]["attributes"]["uuid"]["string"] for i in range(8)] == uuids
    assert devices["gpu-0"]["allowMultipleAllocations"] is True
    assert parse_quantity(devices["gpu-0"]["capacity"]["compute"]["value"]) == 1000
    assert gpus.dra.plugin.info_calls >= 1
    assert gpus.dra.plugin.registration_error == ""
    others = kube.get(f"{RESOURCE}/resourceslices", fieldSelector=f"spec.driver={names.DRIVER}")["items"]
    assert {s["spec"]["nodeName"] for s in others} == {real_kubelet.node}, "no other node has kubecell slices"


def test_the_stock_scheduler_allocates_whole_gpus_and_the_kubelet_prepares_them(
        real_kubelet: RealKubelet, kube: Kube, namespace: str, gpus: DraAgent) -> None:
    make_template(kube, namespace, "whole", claim_spec(names.CLASS_GPU))
    make_claim(kube, namespace, "direct", claim_spec(names.CLASS_GPU))
    make_pod(kube, namespace, "train", {"templated": {"resourceClaimTemplateName": "whole"},
                                        "direct": {"resourceClaimName": "direct"}})
    pod = running(kube, namespace, "train")
    assert pod["spec"]["nodeName"] == real_kubelet.node
    assert "schedulerName" not in pod["spec"] or pod["spec"]["schedulerName"] == "default-scheduler"
    claims = claims_of(kube, namespace, "train")
    held = []
    for claim in claims.values():
        (result,) = results_of(claim)
        assert (result["driver"], result["pool"]) == (names.DRIVER, real_kubelet.node)
        assert parse_quantity(result["consumedCapacity"]["compute"]) == 1000, "a whole GPU"
        assert {r["uid"] for r in claim["status"]["reservedFor"]} == {pod["metadata"]["uid"]}
        env = env_of_claim(gpus, claim)
        uuid = gpus.devices()[result["device"]]["attributes"]["uuid"]["string"]
        assert env["NVIDIA_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"] == uuid
        assert env["KUBECELL_GPU_MILLI"] == "1000"
        assert env["KUBECELL_ISOLATION"] == "accounting"
        held.append(result["device"])
    assert len(set(held)) == 2, "two whole GPUs, not one shared"
    # the kubelet took our CDI devices for the container: its own DRA checkpoint records them
    recorded = (real_kubelet.kubelet_dir / "dra_manager_state").read_text()
    for claim in claims.values():
        (result,) = results_of(claim)
        uid = claim["metadata"]["uid"]
        assert f"{names.CDI_KIND}={cdi.device_name(uid, result['request'], result['device'])}" in recorded
    assert gpus.dra.plugin.prepare_calls >= 1
    assert len(gpus.spec_files()) == 2
    delete_and_wait_unprepared(kube, gpus, namespace, "train")
    assert gpus.dra.plugin.unprepare_calls >= 1
    assert gpus.dra.preparer.checkpoint.claims == {}


def test_two_half_gpu_claims_share_one_gpu_and_a_third_does_not_fit(
        real_kubelet: RealKubelet, kube: Kube, namespace: str, gpus: DraAgent) -> None:
    on_gpu_0 = f'device.attributes["{names.DRIVER}"].index == 0'
    make_template(kube, namespace, "half", claim_spec(names.CLASS_GPU_SHARE, compute="500", selector=on_gpu_0))
    for name in ("a", "b"):
        make_pod(kube, namespace, name, {"gpu": {"resourceClaimTemplateName": "half"}})
        running(kube, namespace, name)
    share_ids = set()
    for name in ("a", "b"):
        (claim,) = claims_of(kube, namespace, name).values()
        (result,) = results_of(claim)
        assert result["device"] == "gpu-0"
        assert parse_quantity(result["consumedCapacity"]["compute"]) == 500
        share_ids.add(result["shareID"])
        env = env_of_claim(gpus, claim)
        assert env["KUBECELL_GPU_MILLI"] == "500"
        assert env["NVIDIA_VISIBLE_DEVICES"] == gpus.devices()["gpu-0"]["attributes"]["uuid"]["string"]
    assert len(share_ids) == 2
    make_pod(kube, namespace, "c", {"gpu": {"resourceClaimTemplateName": "half"}})

    def unschedulable() -> str | None:
        conditions = kube.get(f"/api/v1/namespaces/{namespace}/pods/c")["status"].get("conditions") or []
        return next((c.get("message", "") or "unschedulable" for c in conditions
                     if c["type"] == "PodScheduled" and c["status"] == "False"), None)
    assert wait_for("the third half-GPU claim found unschedulable", unschedulable, WAIT)
    assert not kube.get(f"/api/v1/namespaces/{namespace}/pods/c")["spec"].get("nodeName")
    delete_and_wait_unprepared(kube, gpus, namespace, "a", "b", "c")


def health_of(kube: Kube, namespace: str, pod: str) -> dict[str, tuple[str, str]]:
    """Resource ID (the CDI device) -> (health, message), as the kubelet wrote them into the pod's containers."""
    got = kube.get(f"/api/v1/namespaces/{namespace}/pods/{pod}")
    return {resource["resourceID"]: (resource.get("health", ""), resource.get("message", ""))
            for container in got["status"].get("containerStatuses") or []
            for entry in container.get("allocatedResourcesStatus") or []
            for resource in entry.get("resources") or []}


def holding_gpu_2(kube: Kube, namespace: str) -> str:
    """Run pod ``holder`` with a claim on ``gpu-2``; the resource ID the kubelet shows its health under: the CDI
    device our Prepare answered with."""
    on_gpu_2 = f'device.attributes["{names.DRIVER}"].index == 2'
    make_claim(kube, namespace, "held", claim_spec(names.CLASS_GPU, selector=on_gpu_2))
    make_pod(kube, namespace, "holder", {"gpu": {"resourceClaimName": "held"}})
    running(kube, namespace, "holder")
    (claim,) = claims_of(kube, namespace, "holder").values()
    (result,) = results_of(claim)
    assert result["device"] == "gpu-2"
    return f"{names.CDI_KIND}={cdi.device_name(claim['metadata']['uid'], result['request'], result['device'])}"


def shown(kube: Kube, namespace: str, resource: str, health: str) -> str | None:
    """The message the kubelet shows with ``health`` for ``resource`` of pod ``holder`` ("-" for none), or None
    while it shows another health."""
    now, message = health_of(kube, namespace, "holder").get(resource, ("", ""))
    return (message or "-") if now == health else None


def test_a_gpu_hit_by_a_critical_xid_leaves_the_slice_and_its_pod_is_told(
        real_kubelet: RealKubelet, kube: Kube, namespace: str, gpus: DraAgent) -> None:
    resource = holding_gpu_2(kube, namespace)
    wait_for("the kubelet shows the held GPU Healthy (the plugin's health stream)",
             lambda: shown(kube, namespace, resource, "Healthy"), WAIT)
    assert gpus.dra.plugin.health.streams >= 1
    before = gpus.slices()[0]["spec"]["pool"]["generation"]
    gpus.backend.inject_xid(2, 79)  # "GPU has fallen off the bus"
    wait_for("gpu-2 gone from the slice", lambda: "gpu-2" not in gpus.devices() and len(gpus.devices()) == 7, WAIT)
    assert gpus.slices()[0]["spec"]["pool"]["generation"] > before
    message = wait_for("the pod holding gpu-2 told it is Unhealthy", lambda: shown(kube, namespace, resource,
                                                                                    "Unhealthy"), WAIT)
    assert "XID 79 (GPU has fallen off the bus)" in message
    delete_and_wait_unprepared(kube, gpus, namespace, "holder")


def test_a_restarted_agent_streams_health_again_to_the_kubelet(
        real_kubelet: RealKubelet, kube: Kube, namespace: str, tmp_path: Path, device_classes: list[str]) -> None:
    """The kubelet ends its stream with the old agent and opens one with the new: a GPU that breaks after the
    restart is shown on the pod that has held it since before."""
    with dra_agent(real_kubelet, kube, tmp_path, "a100-nvlink", lambda a: len(a.devices()) == 8):
        resource = holding_gpu_2(kube, namespace)
        wait_for("Healthy from the first agent", lambda: shown(kube, namespace, resource, "Healthy"), WAIT)
    with dra_agent(real_kubelet, kube, tmp_path, "a100-nvlink", lambda a: len(a.devices()) == 8) as again:
        wait_for("the kubelet opened a stream with the new agent", lambda: again.dra.plugin.health.streams, WAIT)
        assert running(kube, namespace, "holder")["status"]["phase"] == "Running"
        wait_for("Healthy from the new agent", lambda: shown(kube, namespace, resource, "Healthy"), WAIT)
        again.backend.inject_xid(2, 48)  # "double-bit ECC error"
        message = wait_for("Unhealthy from the new agent", lambda: shown(kube, namespace, resource, "Unhealthy"),
                           WAIT)
        assert "XID 48 (double-bit ECC error)" in message
        delete_and_wait_unprepared(kube, again, namespace, "holder")


def test_a_mig_instance_of_a_profile_is_allocated_and_prepared(
        real_kubelet: RealKubelet, kube: Kube, namespace: str, mig: DraAgent) -> None:
    profile = f'device.attributes["{names.DRIVER}"].profile == "1g.5gb"'
    make_template(kube, namespace, "slice", claim_spec(names.CLASS_MIG, selector=profile))
    make_pod(kube, namespace, "infer", {"gpu": {"resourceClaimTemplateName": "slice"}})
    running(kube, namespace, "infer")
    (claim,) = claims_of(kube, namespace, "infer").values()
    (result,) = results_of(claim)
    device = mig.devices()[result["device"]]
    assert device["attributes"]["type"]["string"] == "mig"
    assert "shareID" not in result, "an instance is exclusive"
    env = env_of_claim(mig, claim)
    assert env["NVIDIA_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"] == device["attributes"]["uuid"]["string"]
    assert env["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-")
    assert env["KUBECELL_ISOLATION"] == "mig"
    make_template(kube, namespace, "whole", claim_spec(names.CLASS_GPU))
    make_pod(kube, namespace, "whole", {"gpu": {"resourceClaimTemplateName": "whole"}})
    wait_for("a whole-GPU claim finds no GPU on a node in MIG mode", lambda: any(
        c["type"] == "PodScheduled" and c["status"] == "False"
        for c in kube.get(f"/api/v1/namespaces/{namespace}/pods/whole")["status"].get("conditions") or []), WAIT)
    delete_and_wait_unprepared(kube, mig, namespace, "infer", "whole")


def kubecell_pod(kube: Kube, namespace: str, name: str, template: str) -> None:
    """A pod of kubecell's scheduler with one claim from ``template``."""
    make_pod(kube, namespace, name, {"gpu": {"resourceClaimTemplateName": template}}, scheduler="kubecell")


def recorded_gpus(pod: dict[str, Any]) -> list[tuple[str, int]]:
    meta = pod["metadata"]
    record = parse_record(meta["annotations"][ANNOTATION_ALLOCATION], pod=f"{meta['namespace']}/{meta['name']}",
                          uid=meta["uid"])
    return [(gpu.uuid, gpu.milli) for gpu in record.gpus]


def test_kubecell_allocates_two_shares_the_kubelet_prepares_with_the_recorded_gpu(
        testbed: Any, real_kubelet: RealKubelet, kube: Kube, namespace: str, gpus: DraAgent,
        start_scheduler: Any) -> None:
    """kubecell's scheduler (not kube-scheduler) allocates the claims; the real kubelet prepares them through the
    agent, and the container's environment names the GPU and share of kubecell's allocation record."""
    start_scheduler(testbed)
    make_template(kube, namespace, "half", claim_spec(names.CLASS_GPU_SHARE, compute="500"))
    uuids = set()
    for name in ("a", "b"):
        kubecell_pod(kube, namespace, name, "half")
    for name in ("a", "b"):
        pod = running(kube, namespace, name)
        assert pod["spec"]["schedulerName"] == "kubecell"
        assert pod["spec"]["nodeName"] == real_kubelet.node
        ((uuid, milli),) = recorded_gpus(pod)
        assert milli == 500
        (claim,) = claims_of(kube, namespace, name).values()
        (result,) = results_of(claim)
        assert parse_quantity(result["consumedCapacity"]["compute"]) == 500
        assert gpus.devices()[result["device"]]["attributes"]["uuid"]["string"] == uuid
        env = env_of_claim(gpus, claim)
        assert env["NVIDIA_VISIBLE_DEVICES"] == uuid
        assert env["KUBECELL_GPU_MILLI"] == "500"
        uuids.add(uuid)
    assert len(uuids) == 1, "kubecell packs the two halves onto one GPU"
    delete_and_wait_unprepared(kube, gpus, namespace, "a", "b")


def test_kubecell_allocates_a_mig_instance_by_profile_and_the_kubelet_prepares_it(
        testbed: Any, real_kubelet: RealKubelet, kube: Kube, namespace: str, mig: DraAgent,
        start_scheduler: Any) -> None:
    start_scheduler(testbed)
    profile = f'device.attributes["{names.DRIVER}"].profile == "1g.5gb"'
    make_template(kube, namespace, "slice", claim_spec(names.CLASS_MIG, selector=profile))
    kubecell_pod(kube, namespace, "infer", "slice")
    pod = running(kube, namespace, "infer")
    ((uuid, _),) = recorded_gpus(pod)
    (claim,) = claims_of(kube, namespace, "infer").values()
    env = env_of_claim(mig, claim)
    assert env["NVIDIA_VISIBLE_DEVICES"] == uuid
    assert uuid.startswith("MIG-")
    assert env["KUBECELL_ISOLATION"] == "mig"
    delete_and_wait_unprepared(kube, mig, namespace, "infer")
