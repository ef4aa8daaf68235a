"""Fixtures for the tests that run against the session's real testbed (the Kubernetes adapter, the scheduler and
its extender and observers): a namespace per test, kubecell schedulers started inside a test, the bundled
example's nodes, the VirtualCluster CRD. ``tests/conftest.py`` makes them available to the whole suite."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubecell.cli.main import example_paths
from kubecell.kube.kept_holds import HoldStore
from kubecell.kube.rest import ApiError, Kube
from kubecell.scheduler.options import SchedulerOptions
from kubecell.scheduler.scheduler import Scheduler
from kubecell.testbed import testbed as testbed_driver
from kubecell.testbed.control_plane import ControlPlaneState
from tests.scheduler.deploy_support import clear_virtualclusters, install_crd


@pytest.fixture
def namespace(kube: Kube) -> Iterator[str]:
    """A fresh namespace; its pods are force-deleted afterwards so later tests find the GPUs free."""
    with fresh_namespace(kube) as name:
        yield name


@contextlib.contextmanager
def fresh_namespace(kube: Kube) -> Iterator[str]:
    """The ``namespace`` fixture's namespace, for a test that needs more than one."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    try:
        yield name
    finally:
        for pod in kube.get(f"/api/v1/namespaces/{name}/pods")["items"]:
            with contextlib.suppress(ApiError):
                kube.delete(f"/api/v1/namespaces/{name}/pods/{pod['metadata']['name']}", gracePeriodSeconds=0)
        kube.delete(f"/api/v1/namespaces/{name}")


class RunningScheduler:
    """A kubecell scheduler running in a thread against the testbed, stopped by ``close``."""

    def __init__(self, testbed: ControlPlaneState, options: SchedulerOptions | None = None) -> None:
        self.kube = Kube.from_kubeconfig(testbed.admin_kubeconfig)
        self.scheduler = Scheduler(self.kube, options)
        self.thread = threading.Thread(target=self.scheduler.run, name="kubecell-scheduler", daemon=True)
        self.thread.start()
        if not self.scheduler.ready.wait(60):
            raise AssertionError("the scheduler did not complete its first cycle in 60 s")

    def close(self) -> None:
        self.scheduler.shutdown()
        self.thread.join(timeout=10)
        self.kube.close()


@pytest.fixture
def start_scheduler(testbed: ControlPlaneState) -> Iterator[type[RunningScheduler]]:
    """Start schedulers inside a test (``start_scheduler(testbed)``); all are stopped at its end."""
    started: list[RunningScheduler] = []

    class Tracked(RunningScheduler):
        def __init__(self, tb: ControlPlaneState, options: SchedulerOptions | None = None) -> None:
            super().__init__(tb, options)
            started.append(self)

    try:
        yield Tracked
    finally:
        for running in started:
            running.close()
        if started:  # what they held for the test's jobs is not for the next test's scheduler to take on
            kube = Kube.from_kubeconfig(testbed.admin_kubeconfig)
            try:
                with contextlib.suppress(ApiError):
                    kube.delete(HoldStore(kube, SchedulerOptions().tenants_namespace).path)
            finally:
                kube.close()


@pytest.fixture(scope="module")
def example_state(testbed: ControlPlaneState, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlaneState]:
    """A second control plane of the test module's own, holding the bundled example's 64 heterogeneous
    nodes (no kube-scheduler: a test starts the one it needs)."""
    nodes_csv, _ = example_paths()
    directory = Path(tmp_path_factory.mktemp("example-testbed"))
    result = testbed_driver.up(str(nodes_csv), directory=directory)
    try:
        yield result.state
    finally:
        testbed_driver.down(directory)


@pytest.fixture(scope="module")
def example_kube(example_state: ControlPlaneState) -> Iterator[Kube]:
    kube = Kube.from_kubeconfig(example_state.admin_kubeconfig)
    try:
        yield kube
    finally:
        kube.close()


@pytest.fixture
def crd(testbed: ControlPlaneState, kube: Kube) -> Iterator[None]:
    """The VirtualCluster CRD installed, and no VirtualCluster before or after the test."""
    install_crd(testbed)
    clear_virtualclusters(kube)
    yield
    clear_virtualclusters(kube)
