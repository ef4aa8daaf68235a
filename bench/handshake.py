"""What the device-plugin handshake costs: GPU pods started on one agent-served node, one after another.

On a testbed (real kube-apiserver) with kubecell's scheduler in this process, one node is served by
``kubecell node-agent`` (fake NVML backend, 8 GPUs) behind a fake kubelet that speaks the real device
plugin protos. ``--pods`` pods asking for ``kubecell.io/gpu-milli`` are created at once, pinned to that
node; a loop admits each as soon as it is bound, as the kubelet would. The scheduler binds the next pod
only after the agent acknowledged the previous one, so this measures the serialisation: pods/s on one
node, and per pod the time from its bind (as this loop, polling every 10 ms, first sees it) to its
acknowledgement.

    python bench/handshake.py [--pods 40]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from kubecell.core.model import GPU_MODELS, Gpu, Node
from kubecell.kube.names import ANNOTATION_ACK
from kubecell.kube.rest import Kube
from kubecell.node.agent import AgentOptions, NodeAgent
from kubecell.node.fake_kubelet import FakeKubelet
from kubecell.node.fake_nvml import FakeNvml, example_path
from kubecell.scheduler.scheduler import Scheduler
from kubecell.testbed import testbed
from kubecell.testbed.kubelet import register_nodes
from kubecell.testbed.nodes import node_manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kubecell-bench-") as scratch:
        state = testbed.up("synthetic", nodes=4, directory=Path(scratch) / "tb",
                           log=lambda line: print(line, file=sys.stderr)).state
        kube = Kube.from_kubeconfig(state.admin_kubeconfig)
        name = "agent-node"
        node = Node(name, 512_000, 2_000_000, tuple(Gpu(i, "A100", GPU_MODELS["A100"].memory_mib) for i in range(8)),
                    labels={"kubecell.io/bench": name})
        register_nodes(kube, [node_manifest(node)])
        root = Path(tempfile.mkdtemp(dir="/tmp", prefix="hs-"))
        kubelet = FakeKubelet(root / "dp", root / "pr" / "kubelet.sock").start()
        agent = NodeAgent(kube, FakeNvml.from_file(example_path("a100-nvlink")),
                          AgentOptions(node=name, device_plugin_dir=kubelet.directory,
                                       pod_resources=kubelet.pod_resources, interval=5.0))
        stop = threading.Event()
        threading.Thread(target=agent.run, args=(stop,), daemon=True).start()
        scheduler = Scheduler(kube)
        loop = threading.Thread(target=scheduler.run, daemon=True)
        loop.start()
        try:
            kubelet.wait_for(lambda: kubelet.capacity().get("kubecell.io/gpu-milli") == 8000, 60, "the agent")
            assert scheduler.ready.wait(60)
            time.sleep(2)  # the scheduler sees the agent's inventory (devicePlugin) and rebuilds
            path = "/api/v1/namespaces/default/pods"
            for i in range(args.pods):
                kube.create(path, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"hs-{i:03d}"},
                                   "spec": {"schedulerName": "kubecell", "nodeSelector": {"kubecell.io/bench": name},
                                            "containers": [{"name": "main", "image": "x", "resources": {
                                                "limits": {"kubecell.io/gpu-milli": "100"}}}]}})
            started = time.monotonic()
            bound_at: dict[str, float] = {}
            acked_at: dict[str, float] = {}
            deadline = started + 300
            while len(acked_at) < args.pods and time.monotonic() < deadline:
                for pod in kube.get(path, labelSelector="")["items"]:
                    key = pod["metadata"]["name"]
                    if not key.startswith("hs-") or key in acked_at or not pod["spec"].get("nodeName"):
                        continue
                    bound_at.setdefault(key, time.monotonic())
                    if ANNOTATION_ACK in (pod["metadata"].get("annotations") or {}):
                        acked_at[key] = time.monotonic()
                    elif key not in kubelet.assignments().get(("default", key), {}):
                        kubelet.admit("default", key, "main", {"kubecell.io/gpu-milli": 100})
                time.sleep(0.01)
            total = time.monotonic() - started
        finally:
            scheduler.shutdown()
            stop.set()
            kubelet.stop()
            shutil.rmtree(root, ignore_errors=True)
            kube.close()
            testbed.down(Path(scratch) / "tb")
    serve = [acked_at[k] - bound_at[k] for k in acked_at]
    print(f"{len(acked_at)}/{args.pods} pods served on one node in {total:.1f} s: {len(acked_at) / total:.1f} pods/s")
    print(f"bind -> acknowledged: median {statistics.median(serve) * 1000:.0f} ms, max {max(serve) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
