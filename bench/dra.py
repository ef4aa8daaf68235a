"""Pods that ask for GPUs through DRA ResourceClaims: kubecell's scheduler against kube-scheduler's own DRA
allocator, on the same testbed and the same devices.

Starts a testbed of N synthetic 8-GPU nodes with the stock kube-scheduler v1.37.2 and kube-controller-manager
(whose resourceclaim controller makes each pod's claim from its template), publishes every node's GPUs as
kubecell's ResourceSlices (``gpu.kubecell.io``, as the node agent with ``--dra`` does) and applies
kubecell's DeviceClasses. Then, for each scheduler, creates P pods from a pool of client threads, each with
one claim from a ``ResourceClaimTemplate`` for one whole GPU, and watches them bound. Prints pods/s from the
first create to the last bind, p50/p99 create-to-bound latency, and the kubecell / kube-scheduler ratios.
kubecell's scheduler runs as a separate process (``kubecell scheduler``), as it would in a cluster.

    python bench/dra.py [--nodes 100] [--pods 400] [--clients 8] [--repeat 3] [--claims template|direct]

Both schedulers write the claim's allocation (finalizer, then status) before the Binding; the claims'
creation by the controller is in both measurements. Needs Go for the first testbed build (cached after).
Loopback only; everything is stopped at the end.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from kubecell.kube.inventory_schema import parse_inventory
from kubecell.kube.names import ANNOTATION_INVENTORY
from kubecell.kube.rest import Kube
from kubecell.node.dra.slices import node_slices
from kubecell.testbed import testbed
from kubecell.testbed.load import alternating_rounds, claim_pod, measure, print_comparison, start_kubecell

ROOT = Path(__file__).resolve().parents[1]
RESOURCE = "/apis/resource.k8s.io/v1"


def publish(kube: Kube) -> int:
    """Every node's slices and kubecell's DeviceClasses; returns how many devices were published."""
    for document in yaml.safe_load_all((ROOT / "deploy" / "dra" / "deviceclasses.yaml").read_text()):
        kube.create(f"{RESOURCE}/deviceclasses", document)
    devices = 0
    for node in kube.get("/api/v1/nodes")["items"]:
        meta = node["metadata"]
        text = (meta.get("annotations") or {}).get(ANNOTATION_INVENTORY)
        if text is None:
            continue
        for piece in node_slices(parse_inventory(text, node=meta["name"]), meta["name"], meta["uid"], 1):
            kube.create(f"{RESOURCE}/resourceslices", piece)
            devices += len(piece["spec"].get("devices") or [])
    return devices


def claim(name: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.kubecell.io", "count": 1}}]}}}


def direct_pod(kube: Kube) -> Callable[[str, str, str], dict[str, Any]]:
    """Pods whose claim the client creates just before the pod (no controller in the way)."""
    def make(name: str, namespace: str, scheduler: str) -> dict[str, Any]:
        kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", claim(name))
        body = claim_pod(name, namespace, scheduler)
        body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": name}]
        return body
    return make


def clear(kube: Kube, namespace: str, timeout: float = 600.0) -> None:
    """The round's pods and claims gone, every device free again: the resourceclaim controller deallocates a
    claim once its pod is gone and only then lets it be deleted, so waiting for the claims waits for that."""
    testbed.clear_pods(kube, namespace, timeout=timeout)
    path = f"{RESOURCE}/namespaces/{namespace}/resourceclaims"
    kube.delete(path)
    deadline = time.monotonic() + timeout
    while kube.get(path, limit=1)["items"] and time.monotonic() < deadline:
        time.sleep(1.0)


def template(kube: Kube, namespace: str) -> None:
    kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "gpu", "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.kubecell.io", "count": 1}}]}}}})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--pods", type=int, default=400)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--claims", choices=("template", "direct"), default="template",
                        help="Each pod's claim made from a template by kube-controller-manager, or created by the "
                             "client just before the pod.")
    parser.add_argument("--repeat", type=int, default=1,
                        help="Rounds per scheduler, alternating which goes first; medians are printed.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kubecell-bench-") as scratch:
        state = testbed.up("synthetic", nodes=args.nodes, directory=Path(scratch), kube_scheduler=True,
                           controller_manager=True, log=lambda line: print(line, file=sys.stderr)).state
        kube = Kube.from_kubeconfig(state.admin_kubeconfig, pool=args.clients + 4)
        devices = publish(kube)
        ours = start_kubecell(state.admin_kubeconfig)
        try:
            make = claim_pod if args.claims == "template" else direct_pod(kube)

            def one_round(name: str, round_: int) -> dict[str, float]:
                namespace = f"bench-{name}-{round_}"
                figures = measure(kube, name, namespace, args.pods, args.clients, args.timeout, make=make,
                                  prepare=lambda ns: template(kube, ns))
                clear(kube, namespace)
                return figures
            results = alternating_rounds(args.repeat, one_round)
        finally:
            ours.terminate()
            ours.wait(timeout=30)
            kube.close()
            testbed.down(Path(scratch))
    source = "from a template" if args.claims == "template" else "created by the client before the pod"
    print(f"{args.nodes} nodes x 8 GPUs as {devices} DRA devices, {args.pods} pods with one whole-GPU claim each "
          f"({source}), {args.clients} client threads, median of {args.repeat} round(s)")
    print_comparison(results)

if __name__ == "__main__":
    main()
