"""What ``RecordAllocator`` counts on after an agent restart, shown on a real kubelet v1.37.2: while the kubelet
admits a pod's GPU containers one ``Allocate`` after another, its PodResources ``Get`` answers from inside the
call (no deadlock) and shows the devices of the containers allocated before, in spec order, never the one being
allocated. So a restarted agent can count the earlier containers and check the pod's record as covered at its
last call (``_recall``). Skips, with the reason, where the real kubelet cannot run (``test_real_kubelet``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

pytest.importorskip("grpc", reason="tests/node needs the `node` extra: pip install -e '.[dev,node]' (grpcio)")
pytest.importorskip("grpc_tools", reason="tests/node needs the `node` extra: pip install -e '.[dev,node]' "
                                         "(grpcio-tools)")

from kubecell.kube.rest import Kube
from kubecell.node.deviceplugin import GPU_RESOURCE, ContainerAllocation, DeviceFeed, DevicePlugin
from kubecell.node.podresources import PodDevices, PodResourcesClient
from kubecell.testbed.real_kubelet import RealKubelet
from tests.node.test_real_kubelet import GPUS, WAIT, _gpu_pod, real_kubelet  # noqa: F401 - a fixture
from tests.support import wait_for


@dataclass
class Peeking:
    """Answers every container, and asks the kubelet's PodResources about the pod from inside each call."""

    client: PodResourcesClient
    namespace: str
    name: str
    seen: list[tuple[list[str], PodDevices | None]] = field(default_factory=list)

    def preferred(self, resource: str, available: list[str], must_include: list[str], size: int) -> list[str]:
        return [*must_include, *(i for i in available if i not in must_include)][:size]

    def allocate(self, resource: str, container_requests: list[list[str]]) -> list[ContainerAllocation]:
        self.seen.append((container_requests[0], self.client.get(self.namespace, self.name)))
        return [ContainerAllocation(envs={"NVIDIA_VISIBLE_DEVICES": ",".join(ids)}) for ids in container_requests]


@pytest.fixture
def peeking(real_kubelet: RealKubelet, namespace: str) -> Iterator[Peeking]:  # noqa: F811 - the fixture above
    with PodResourcesClient(real_kubelet.pod_resources, timeout=WAIT) as client:
        allocator = Peeking(client, namespace, "three")
        served = DevicePlugin(GPU_RESOURCE, DeviceFeed(GPUS), allocator, directory=real_kubelet.device_plugin_dir,
                              poll_interval=0.1)
        served.start(register_timeout=WAIT)
        try:
            yield allocator
        finally:
            served.stop()


def test_pod_resources_shows_the_containers_allocated_before_during_the_next_allocate(
        kube: Kube, namespace: str, real_kubelet: RealKubelet, peeking: Peeking) -> None:  # noqa: F811
    pod: dict[str, Any] = _gpu_pod("three", real_kubelet.node)
    main = pod["spec"]["containers"][0]
    pod["spec"]["initContainers"] = [{**main, "name": "warm-up"}]
    pod["spec"]["containers"] = [{**main, "name": name} for name in ("a", "b")]
    kube.create(f"/api/v1/namespaces/{namespace}/pods", pod)  # fakecri runs the init container for ever: admitted
    wait_for("one Allocate per GPU container", lambda: len(peeking.seen) >= 3, WAIT)
    assert len(peeking.seen) == 3
    shown = [{c.name: list(c.devices.get(GPU_RESOURCE, ())) for c in (found.containers if found else ())
              if c.devices.get(GPU_RESOURCE)} for _, found in peeking.seen]
    (warm_up, _), (first, _), _ = peeking.seen
    assert shown == [{}, {}, {"a": first}], "the init container is never shown; a is, once allocated"
    assert warm_up
