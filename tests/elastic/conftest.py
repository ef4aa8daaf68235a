"""Fixtures of the ElasticJob tests on the testbed: the CRD installed once per module, a controller per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kubecell.testbed.control_plane import ControlPlaneState
from tests.elastic.support import RunningController, install_crd


@pytest.fixture(scope="module")
def elastic_crd(testbed: ControlPlaneState) -> None:
    install_crd(testbed)


@pytest.fixture
def controller(testbed: ControlPlaneState, elastic_crd: None, namespace: str) -> Iterator[RunningController]:
    """The ElasticJob controller running in a thread, watching the test's namespace."""
    running = RunningController(testbed.admin_kubeconfig, namespace)
    try:
        yield running
    finally:
        running.close()
