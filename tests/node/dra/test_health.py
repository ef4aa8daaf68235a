"""The resource-health service: what the kubelet is told about each device of the pool, and the stream itself
on a real Unix socket (the kubelet's side of it is ``test_dra_kubelet.py``'s)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("grpc", reason="tests/node needs the `node` extra: pip install -e '.[dev,node]' (grpcio)")
pytest.importorskip("grpc_tools", reason="tests/node needs the `node` extra: pip install -e '.[dev,node]' "
                                         "(grpcio-tools)")

import grpc  # type: ignore[import-untyped]

from kubecell.kube.gpu_faults import RecordedFault
from kubecell.node import protos
from kubecell.node.dra.health import (
    TIMEOUT_SECONDS,
    DeviceHealth,
    HealthBoard,
    HealthService,
    device_health,
)
from kubecell.node.dra.plugin import KubeletPlugin
from kubecell.node.dra.slices import healthy_devices
from tests.node.dra.test_cdi import Node, serving
from tests.node.dra.test_slices import inventory_of

POOL = "n1"


def faults_of(inventory_example: str, unhealthy: tuple[int, ...]) -> dict[str, RecordedFault]:
    inventory = inventory_of(inventory_example)
    return {inventory.gpus[i].uuid: RecordedFault(79, 1_700_000_000.0) for i in unhealthy}


def test_every_device_is_reported_and_those_of_a_broken_gpu_say_why() -> None:
    inventory = inventory_of("a100-nvlink", unhealthy=(2,))
    reports = device_health(inventory, POOL, faults_of("a100-nvlink", (2,)))
    assert [r.device for r in reports] == [f"gpu-{i}" for i in range(8)], "the broken GPU too: pods hold it"
    assert {r.pool for r in reports} == {POOL}
    assert [r.healthy for r in reports] == [i != 2 for i in range(8)]
    broken = reports[2]
    assert "XID 79 (GPU has fallen off the bus) at 2023-11-14T22:13:20Z" in broken.message
    assert inventory.gpus[2].uuid in broken.message
    assert "left the node's ResourceSlice" in broken.message
    assert all(r.message == "" for r in reports if r.healthy)
    assert {d.name for d in healthy_devices(inventory)} == {r.device for r in reports if r.healthy}, \
        "healthy here exactly where the slice carries the device"


def test_the_instances_of_a_broken_mig_gpu_are_all_unhealthy_by_their_slice_names() -> None:
    inventory = inventory_of("a100-mig-1g", unhealthy=(1,))
    reports = device_health(inventory, POOL, {})
    assert len(reports) == 14
    broken = [r for r in reports if not r.healthy]
    assert len(broken) == 7
    assert all(r.device.startswith("gpu-1-mig-") for r in broken)
    assert all("its GPU 1" in r.message and "reported unhealthy by the node agent" in r.message for r in broken), \
        "no fault known: said so, not invented"


def test_the_board_wakes_on_a_change_repeats_when_nothing_changed_and_ends_when_closed() -> None:
    board = HealthBoard()
    assert board.next(0, 0.01) == (0, ()), "nothing published yet"
    first = (DeviceHealth(POOL, "gpu-0", True),)
    assert board.publish(first)
    assert not board.publish(first), "the same report is no change"
    version, reports = board.next(0, 5) or (0, ())
    assert reports == first
    started = time.monotonic()
    assert board.next(version, 0.05) == (version, first), "unchanged: the same again after the interval"
    assert time.monotonic() - started >= 0.05
    woken: queue.Queue[Any] = queue.Queue()
    waiter = threading.Thread(target=lambda: woken.put(board.next(version, 30)))
    waiter.start()
    second = (DeviceHealth(POOL, "gpu-0", False, "broken"),)
    board.publish(second)
    assert woken.get(timeout=5) == (version + 1, second), "a change wakes a waiting stream at once"
    waiter.join(5)
    board.close()
    assert board.next(version + 1, 30) is None


@pytest.fixture
def served(tmp_path: Path) -> Iterator[KubeletPlugin]:
    with serving(Node(tmp_path).preparer, HealthService(HealthBoard(), report_seconds=0.3)) as plugin:
        yield plugin


def test_the_stream_reports_the_pool_at_once_on_each_change_and_again_before_the_kubelet_forgets(
        served: KubeletPlugin) -> None:
    api = protos.dra_health()
    healthy = device_health(inventory_of("a100-nvlink"), POOL, {})
    served.health.board.publish(healthy)
    got: queue.Queue[Any] = queue.Queue()
    with grpc.insecure_channel(f"unix://{served.paths.dra_socket}") as channel:
        stream = api.grpc.DRAResourceHealthStub(channel).NodeWatchResources(api.pb2.NodeWatchResourcesRequest(),
                                                                            timeout=30)
        ended: list[str] = []

        def read() -> None:
            try:
                for report in stream:
                    got.put(report)
                ended.append("closed")
            except grpc.RpcError as error:
                ended.append(str(error.code()))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        first = got.get(timeout=10)
        assert [(d.device.pool_name, d.device.device_name) for d in first.devices] == [
            (POOL, f"gpu-{i}") for i in range(8)]
        assert {d.health for d in first.devices} == {api.pb2.HEALTHY}
        assert {d.health_check_timeout_seconds for d in first.devices} == {TIMEOUT_SECONDS}
        assert abs(first.devices[0].last_updated_time - time.time()) < 60
        again = got.get(timeout=5)  # nothing changed: the same pool again, so the kubelet's entries stay fresh
        assert [(d.device.device_name, d.health) for d in again.devices] == [
            (d.device.device_name, d.health) for d in first.devices]
        broken = device_health(inventory_of("a100-nvlink", unhealthy=(2,)), POOL, faults_of("a100-nvlink", (2,)))
        served.health.board.publish(broken)
        deadline = time.monotonic() + 10
        while True:
            report = got.get(timeout=max(deadline - time.monotonic(), 0.01))
            if report.devices[2].health == api.pb2.UNHEALTHY:
                break
        assert "XID 79" in report.devices[2].message
        assert [d.health for i, d in enumerate(report.devices) if i != 2] == [api.pb2.HEALTHY] * 7
        started = time.monotonic()
        served.stop()
        reader.join(10)
        assert not reader.is_alive(), "the stream ends when the plugin stops"
        assert ended
        assert time.monotonic() - started < 5
    assert served.health.streams == 1


class Reader:
    """One client stream read on a thread, its reports queued."""

    def __init__(self, channel: Any) -> None:
        api = protos.dra_health()
        self.call = api.grpc.DRAResourceHealthStub(channel).NodeWatchResources(api.pb2.NodeWatchResourcesRequest(),
                                                                               timeout=60)
        self.got: queue.Queue[Any] = queue.Queue()
        self.ended: list[str] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for report in self.call:
                self.got.put(report)
            self.ended.append("closed")
        except grpc.RpcError as error:
            self.ended.append(str(error.code()))


def wait_until(what: str, probe: Any, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not probe():
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(0.02)


def test_a_new_stream_ends_the_older_one_and_a_cancelled_one_frees_its_thread_at_once(tmp_path: Path) -> None:
    """A stream holds a worker thread that Prepare calls need too: streams the kubelet left behind (it opens a
    new one after every error) must not pile up, nor wait for their next report to notice they are gone."""
    service = HealthService(HealthBoard(), report_seconds=60)  # no periodic report to end a wait
    service.board.publish(device_health(inventory_of("a100-nvlink"), POOL, {}))
    with serving(Node(tmp_path).preparer, service) as plugin, \
            grpc.insecure_channel(f"unix://{plugin.paths.dra_socket}") as channel:
        first = Reader(channel)
        first.got.get(timeout=10)
        second = Reader(channel)
        second.got.get(timeout=10)
        first.thread.join(5)
        assert first.ended == ["closed"], "the newer stream is the one served"
        wait_until("one stream holds a thread", lambda: service.open == 1)
        second.call.cancel()
        wait_until("the cancelled stream's thread is free", lambda: service.open == 0)
        third = Reader(channel)
        assert len(third.got.get(timeout=10).devices) == 8, "served again after both"
