"""The kubelet stubs: generated from the upstream protos (verified), cached, and carrying upstream names."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

pytest.importorskip("grpc", reason="tests/node needs the `node` extra: pip install -e '.[dev,node]' (grpcio)")
pytest.importorskip("grpc_tools", reason="tests/node needs the `node` extra: pip install -e '.[dev,node]' "
                                         "(grpcio-tools)")

from kubecell.node import protos


def _mod_cache() -> Path:
    mod_cache = protos.go_mod_cache()
    if mod_cache is None or protos.sources_from_mod_cache(mod_cache) is None:
        pytest.skip(f"{protos.KUBELET_MODULE}@{protos.KUBELET_VERSION} is not in the Go module cache "
                    f"(`go mod download {protos.KUBELET_MODULE}@{protos.KUBELET_VERSION}` puts it there)")
    return mod_cache


def test_generation_from_the_mod_cache_then_reuse(tmp_path: Path) -> None:
    _mod_cache()
    directory, generated = protos.ensure_generated(tmp_path)
    assert generated
    assert directory == tmp_path / protos.stamp()
    for proto in protos.PROTO_FILES:
        base = directory / proto.target
        assert base.with_name("api_pb2.py").is_file()
        assert base.with_name("api_pb2_grpc.py").is_file()
        assert hashlib.sha256(base.read_bytes()).hexdigest() == proto.sha256
    # The grpc module imports its messages by the package path we laid out, not a bare `api_pb2`.
    grpc_source = (directory / protos.DEVICEPLUGIN.target).with_name("api_pb2_grpc.py").read_text()
    assert "from kubecell_kubelet_api.deviceplugin.v1beta1 import api_pb2" in grpc_source
    marker = (directory / "stamp").stat().st_mtime_ns
    again, generated_again = protos.ensure_generated(tmp_path)
    assert (again, generated_again) == (directory, False)
    assert (directory / "stamp").stat().st_mtime_ns == marker
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".partial-")]


def test_the_default_cache_is_outside_the_repository() -> None:
    repository = Path(__file__).resolve().parents[2]
    assert not protos.default_cache_dir().resolve().is_relative_to(repository)
    assert protos.default_cache_dir().name == protos.KUBELET_VERSION


def test_a_tampered_proto_in_the_mod_cache_is_refused(tmp_path: Path) -> None:
    mod_cache = _mod_cache()
    module = f"{protos.KUBELET_MODULE}@{protos.KUBELET_VERSION}"
    for proto in protos.PROTO_FILES:
        target = tmp_path / module / proto.upstream
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(mod_cache / module / proto.upstream, target)
    assert protos.sources_from_mod_cache(tmp_path) is not None
    with (tmp_path / module / protos.PODRESOURCES.upstream).open("a") as handle:
        handle.write("\n// edited\n")
    with pytest.raises(protos.ProtoUnavailable, match="does not match the recorded"):
        protos.sources_from_mod_cache(tmp_path)


def test_the_module_zip_is_checked_before_use() -> None:
    with pytest.raises(protos.ProtoUnavailable, match=r"is not the recorded .* refusing"):
        protos.sources_from_zip(b"PK\x05\x06" + b"\0" * 18, "test.zip")
    mod_cache = protos.go_mod_cache()
    zipped = (mod_cache / "cache" / "download" / protos.KUBELET_MODULE / "@v" / f"{protos.KUBELET_VERSION}.zip"
              if mod_cache else None)
    if zipped is None or not zipped.is_file():
        pytest.skip("the module zip the Go proxy serves is not in the Go module download cache")
    sources = protos.sources_from_zip(zipped.read_bytes(), str(zipped))
    assert set(sources) == set(protos.PROTO_FILES)


def test_device_plugin_messages_carry_the_upstream_field_names() -> None:
    pb2 = protos.deviceplugin().pb2
    device = pb2.Device(ID="GPU-1", health="Healthy", topology=pb2.TopologyInfo(nodes=[pb2.NUMANode(ID=1)]))
    listed = pb2.ListAndWatchResponse(devices=[device])
    assert (listed.devices[0].ID, listed.devices[0].health, listed.devices[0].topology.nodes[0].ID) == (
        "GPU-1", "Healthy", 1)
    allocate = pb2.AllocateRequest(container_requests=[pb2.ContainerAllocateRequest(devices_ids=["a", "b"])])
    assert list(allocate.container_requests[0].devices_ids) == ["a", "b"]
    response = pb2.ContainerAllocateResponse(
        envs={"A": "1"}, annotations={"k": "v"},
        mounts=[pb2.Mount(container_path="/c", host_path="/h", read_only=True)],
        devices=[pb2.DeviceSpec(container_path="/dev/nvidia0", host_path="/dev/nvidia0", permissions="rw")])
    assert (dict(response.envs), dict(response.annotations)) == ({"A": "1"}, {"k": "v"})
    assert (response.mounts[0].host_path, response.devices[0].permissions) == ("/h", "rw")
    preferred = pb2.PreferredAllocationRequest(container_requests=[pb2.ContainerPreferredAllocationRequest(
        available_deviceIDs=["a", "b"], must_include_deviceIDs=["a"], allocation_size=2)])
    assert preferred.container_requests[0].allocation_size == 2
    assert list(pb2.ContainerPreferredAllocationResponse(deviceIDs=["a"]).deviceIDs) == ["a"]
    register = pb2.RegisterRequest(version="v1beta1", endpoint="x.sock", resource_name="kubecell.io/gpu",
                                   options=pb2.DevicePluginOptions(get_preferred_allocation_available=True))
    assert (register.version, register.endpoint, register.resource_name) == ("v1beta1", "x.sock",
                                                                              "kubecell.io/gpu")
    assert register.options.get_preferred_allocation_available
    assert not register.options.pre_start_required
    grpc_module = protos.deviceplugin().grpc
    for name in ("RegistrationStub", "DevicePluginStub", "DevicePluginServicer", "add_RegistrationServicer_to_server"):
        assert hasattr(grpc_module, name)


def test_pod_resources_messages_carry_the_upstream_field_names() -> None:
    api = protos.podresources()
    pb2 = api.pb2
    pod = pb2.PodResources(name="p", namespace="ns", containers=[pb2.ContainerResources(
        name="c", devices=[pb2.ContainerDevices(resource_name="kubecell.io/gpu", device_ids=["GPU-1"])])])
    assert pb2.ListPodResourcesResponse(pod_resources=[pod]).pod_resources[0].containers[0].devices[0].device_ids[0] \
        == "GPU-1"
    assert pb2.GetPodResourcesRequest(pod_name="p", pod_namespace="ns").pod_namespace == "ns"
    assert hasattr(api.grpc, "PodResourcesListerStub")
    assert protos.podresources() is api  # loaded once per process


def test_dra_and_registration_services_carry_the_names_the_kubelet_dials() -> None:
    dra = protos.dra()
    registration = protos.pluginregistration()
    assert dra.pb2.DESCRIPTOR.services_by_name["DRAPlugin"].full_name == "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    assert registration.pb2.DESCRIPTOR.services_by_name["Registration"].full_name == "pluginregistration.Registration"
    for name in ("DRAPluginStub", "DRAPluginServicer", "add_DRAPluginServicer_to_server"):
        assert hasattr(dra.grpc, name)
    for name in ("RegistrationStub", "RegistrationServicer", "add_RegistrationServicer_to_server"):
        assert hasattr(registration.grpc, name)
    pb2 = dra.pb2
    device = pb2.Device(request_names=["gpu"], pool_name="n1", device_name="gpu-0",
                        cdi_device_ids=["gpu.kubecell.io/claim=x"], share_id="s")
    assert device.HasField("share_id")
    assert not pb2.Device().HasField("share_id")
    response = pb2.NodePrepareResourcesResponse(claims={"uid": pb2.NodePrepareResourceResponse(devices=[device])})
    assert response.claims["uid"].devices[0].cdi_device_ids == ["gpu.kubecell.io/claim=x"]
    claim = pb2.Claim(namespace="ns", uid="uid", name="c")
    assert pb2.NodeUnprepareResourcesRequest(claims=[claim]).claims[0].uid == "uid"
    info = registration.pb2.PluginInfo(type="DRAPlugin", name="gpu.kubecell.io", endpoint="/x/dra.sock",
                                       supported_versions=["v1.DRAPlugin"])
    assert list(info.supported_versions) == ["v1.DRAPlugin"]
    assert registration.pb2.RegistrationStatus(plugin_registered=True).plugin_registered
