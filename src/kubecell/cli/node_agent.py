"""``kubecell node-agent``: the GPU inventory, the kubelet device plugin and isolation on one node."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Annotated, cast

import typer

from kubecell.cli.output import configure_logging
from kubecell.core.digits import decimal_digits
from kubecell.core.errors import InvalidInputError
from kubecell.kube.inventory_schema import IsolationMode
from kubecell.kube.names import ISOLATION_MODES
from kubecell.kube.rest import Kube
from kubecell.node.deviceplugin import DEVICE_PLUGIN_DIR
from kubecell.node.dra.cdi import CDI_DIR
from kubecell.node.dra.plugin import PLUGIN_DIR as DRA_PLUGIN_DIR
from kubecell.node.dra.plugin import REGISTRY_DIR as DRA_REGISTRY_DIR
from kubecell.node.inventory import DEFAULT_INTERVAL
from kubecell.node.nvml import GpuBackend
from kubecell.node.podresources import POD_RESOURCES_SOCKET


def node_agent(
    node_name: Annotated[str, typer.Option(help="This node's name (the DaemonSet passes spec.nodeName).",
                                           envvar="NODE_NAME")] = "",
    kubeconfig: Annotated[Path | None, typer.Option(help="Kubeconfig (default: the pod's service account).")] = None,
    fake_gpus: Annotated[Path | None, typer.Option(
        help="Describe the GPUs in YAML instead of asking NVML (machines without GPUs, tests).")] = None,
    isolation: Annotated[str, typer.Option(help="Comma list of the isolation modes this node gives: "
                                                "accounting, mps (GPUs in MIG mode give mig alone).")] = "accounting",
    device_plugin_dir: Annotated[Path, typer.Option(help="The kubelet's device-plugin directory.")] = (
        DEVICE_PLUGIN_DIR),
    pod_resources_socket: Annotated[Path, typer.Option(help="The kubelet's PodResources socket.")] = (
        POD_RESOURCES_SOCKET),
    interval: Annotated[float, typer.Option(help="Seconds between inventory heartbeats.")] = DEFAULT_INTERVAL,
    proc_root: Annotated[Path, typer.Option(help="The host's /proc (processes to pods, MPS daemons).")] = (
        Path("/proc")),
    evict_after: Annotated[float | None, typer.Option(
        help="Evict a pod that overuses its GPU share for this many seconds (default: report only).")] = None,
    mps_binary: Annotated[str, typer.Option(help="The MPS control binary.")] = "nvidia-cuda-mps-control",
    metrics_listen: Annotated[str, typer.Option(help="HOST:PORT of the agent's /metrics ('' for none).")] = (
        "0.0.0.0:10260"),
    dra: Annotated[bool, typer.Option("--dra", help="Also be the DRA driver gpu.kubecell.io: publish the GPUs as "
                                                    "ResourceSlices and serve the kubelet's DRA plugin.")] = False,
    dra_plugin_dir: Annotated[Path, typer.Option(help="The DRA plugin's directory (its socket, the prepared-claims "
                                                      "checkpoint), as this process sees it.")] = DRA_PLUGIN_DIR,
    dra_registry_dir: Annotated[Path, typer.Option(help="The kubelet's plugin registration directory, as this "
                                                        "process sees it.")] = DRA_REGISTRY_DIR,
    dra_advertised_dir: Annotated[Path | None, typer.Option(
        help="The DRA plugin's directory as the kubelet sees it (default: --dra-plugin-dir).")] = None,
    cdi_dir: Annotated[Path, typer.Option(help="Where prepared claims' CDI specs are written.")] = CDI_DIR,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Publish this node's GPUs and serve the kubelet's device plugin API from the scheduler's records."""
    from kubecell.node.agent import AgentOptions, NodeAgent  # the node extra (grpcio) is needed from here on

    if not node_name:
        raise InvalidInputError("no node name", field="node-name", accepted="--node-name or $NODE_NAME")
    modes = tuple(mode.strip() for mode in isolation.split(",") if mode.strip())
    bad = [mode for mode in modes if mode not in ISOLATION_MODES or mode == "mig"]
    if bad or "accounting" not in modes:
        raise InvalidInputError(f"isolation {isolation!r}", field="isolation",
                                accepted="accounting, optionally with mps (mig is given, alone, wherever the "
                                         "node's GPUs are in MIG mode)")
    configure_logging(verbose)
    backend: GpuBackend
    if fake_gpus is not None:
        from kubecell.node.fake_nvml import FakeNvml
        backend = FakeNvml.from_file(fake_gpus)
    else:
        from kubecell.node.nvml import NvmlBackend
        backend = NvmlBackend()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    metrics = None
    if metrics_listen:
        host, _, port = metrics_listen.rpartition(":")
        if not decimal_digits(port):
            raise InvalidInputError(f"--metrics-listen {metrics_listen!r}", field="metrics-listen",
                                    accepted="HOST:PORT, or '' for none")
        metrics = (host or "0.0.0.0", int(port))
    options = AgentOptions(node=node_name, isolation=cast(tuple[IsolationMode, ...], modes),
                           device_plugin_dir=device_plugin_dir, pod_resources=pod_resources_socket,
                           interval=interval, proc_root=proc_root, evict_after_seconds=evict_after,
                           mps_binary=mps_binary, metrics=metrics, dra=dra, dra_plugin_dir=dra_plugin_dir,
                           dra_registry_dir=dra_registry_dir, dra_advertised_dir=dra_advertised_dir or dra_plugin_dir,
                           cdi_dir=cdi_dir)
    kube = Kube.from_kubeconfig(kubeconfig or os.environ.get("KUBECONFIG"))
    NodeAgent(kube, backend, options).run(stop)
