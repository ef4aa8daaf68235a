"""Session fixtures shared across the suite: the real Kubernetes control plane of ``kubecell.testbed``.

The testbed is started once per test session, only when a test asks for it, and stopped at the end.
On a machine without its binaries they are built first (several minutes, once per machine); the
tests skip with a message only where no Go toolchain exists to build them. A failed build fails.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kubecell.kube.rest import Kube
from kubecell.testbed import testbed as testbed_driver
from kubecell.testbed.build import TestbedUnavailable, cached_binaries, ensure_binaries, go_toolchain
from kubecell.testbed.control_plane import ControlPlaneState
from tests.cluster_fixtures import crd, example_kube, example_state, namespace, start_scheduler

__all__ = ["crd", "example_kube", "example_state", "namespace", "start_scheduler"]
"""The testbed fixtures of ``tests/cluster_fixtures.py``, offered to every test."""

TESTBED_CLUSTER = "philly"
"""The bundled 64-node, 512-GPU Philly-like cluster: small enough to register in seconds, with racks,
NVLink quads and NUMA groups for the topology tests."""


@pytest.fixture(scope="session")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlaneState]:
    """A running testbed (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, fake kubelet, the
    Philly nodes)."""
    if cached_binaries() is None:
        try:
            go_toolchain()
        except TestbedUnavailable as error:
            pytest.skip(f"no Kubernetes testbed on this machine: {error}")
        ensure_binaries(log=lambda line: print(f"[testbed] {line}", flush=True))
    directory = Path(tmp_path_factory.mktemp("testbed"))
    result = testbed_driver.up(TESTBED_CLUSTER, directory=directory, kube_scheduler=True, controller_manager=True,
                               log=lambda line: print(f"[testbed] {line}", flush=True))
    try:
        yield result.state
    finally:
        testbed_driver.down(directory)


@pytest.fixture(scope="session")
def kube(testbed: ControlPlaneState) -> Iterator[Kube]:
    """An admin client of the session's testbed."""
    client = Kube.from_kubeconfig(testbed.admin_kubeconfig)
    try:
        yield client
    finally:
        client.close()
