"""Nodes of a test's own whose pods run as real host processes (the process kubelet), for the tests that run
real programs under kubecell."""

from __future__ import annotations

import contextlib
import sys
import uuid
from collections.abc import Iterator

from kubecell.core.model import make_node
from kubecell.kube.rest import Kube
from kubecell.testbed.control_plane import ControlPlaneState
from kubecell.testbed.nodes import node_manifest
from kubecell.testbed.process_kubelet import RUNS_LABEL, RUNS_PROCESSES, ProcessKubelet, running_process_kubelet
from tests.support import registered_node

TEST_NODE = "kubecell.io/test-node"
"""The label naming a test's own node, for the ``nodeSelector`` of the pods meant for it."""

WAIT = 60.0
"""Seconds any one wait may take (a python start on a busy 2-core machine can take a second or two)."""

IMAGE = "ignored"
"""The API requires an image; the process kubelet runs ``command`` on the host and ignores it."""


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


@contextlib.contextmanager
def process_node(testbed: ControlPlaneState, kube: Kube, *, gpus: int = 2,
                 prefix: str = "proc") -> Iterator[tuple[str, ProcessKubelet]]:
    """An A100 node of ``gpus`` GPUs, registered for the block and served by a process kubelet of its own
    (quick back-off, grace periods at most 10 s); every process it started is ended when the block ends."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    node = make_node(name, cpu_milli=32_000, memory_mib=131_072, gpu_count=gpus, gpu_model="A100",
                     labels={TEST_NODE: name, RUNS_LABEL: RUNS_PROCESSES})
    with registered_node(kube, node_manifest(node)), running_process_kubelet(
            testbed, [name], backoff_initial=0.2, backoff_max=1.0, max_grace=10.0) as kubelet:
        yield name, kubelet
