"""What many test folders share: the trace headers, the tiny cluster most file-level tests use, and a
bounded wait for tests that watch a real API server."""

from __future__ import annotations

import contextlib
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from kubecell.kube.rest import ApiError, Kube
from kubecell.testbed.kubelet import register_nodes

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec"
PCS_HEADER = "app_id,submit_time,service,num_jobs,sleep_time,model_name"
SIA_HEADER = "name,time,application,num_replicas,batch_size"

# 2 racks x 2 nodes x 8 V100 GPUs = 32 GPUs, no NVLink groups (the input tests' cluster)
RACKED_CLUSTER = """\
nodeGroups:
  - count: 4
    namePrefix: n-
    gpu: {model: V100M32, count: 8}
    cpuMilli: 64000
    memoryMiB: 524288
    rackSize: 2
"""

# the same with two NVLink islands per node
TINY_CLUSTER = RACKED_CLUSTER.replace("    rackSize:", "    nvlinkGroups: [[0, 1, 2, 3], [4, 5, 6, 7]]\n    rackSize:")


def wait_for(what: str, probe: Callable[[], Any], timeout: float = 30.0) -> Any:
    """Poll ``probe`` until it returns something truthy; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@contextlib.contextmanager
def registered_node(kube: Kube, manifest: dict[str, Any]) -> Iterator[str]:
    """A Node of a test's own on the testbed (registered Ready and untainted as the testbed registers its
    nodes), deleted when the block ends."""
    register_nodes(kube, [manifest])
    try:
        yield str(manifest["metadata"]["name"])
    finally:
        with contextlib.suppress(ApiError):
            kube.delete(f"/api/v1/nodes/{manifest['metadata']['name']}")


def http_get(port: int, path: str) -> tuple[int, str]:
    """A GET on a server the test started on loopback: its status and body (0 and why while nothing listens)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except urllib.error.URLError as error:  # not listening yet
        return 0, str(error)


def refused(write: Callable[..., Any], *args: Any) -> str:
    """The API server's message for a write it refuses with 403 Forbidden (an admission policy's, say)."""
    with pytest.raises(ApiError) as error:
        write(*args)
    assert error.value.status == 403, error.value
    return error.value.api_message


@contextlib.contextmanager
def loopback_http(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """A threaded HTTP server of ``handler`` on 127.0.0.1 and a free port, for the block: its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
