"""``kubecell testbed``: a real Kubernetes control plane on this machine, with the simulator's nodes.

``up`` builds the binaries once per machine (several minutes; cached outside the repository), starts
etcd, kube-apiserver (RBAC on), kube-controller-manager and optionally the stock kube-scheduler on
127.0.0.1, registers the cluster's GPU nodes and starts a fake kubelet; ``status`` prints the endpoints;
``down`` stops it all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from kubecell.cli.output import stderr_console, stdout_console
from kubecell.testbed import process_kubelet
from kubecell.testbed import testbed as driver
from kubecell.testbed.build import ensure_binaries
from kubecell.testbed.paths import binary_dir, default_state_dir

testbed_app = typer.Typer(help="A real Kubernetes control plane on loopback, with the simulator's GPU nodes.",
                          no_args_is_help=True)

StateDir = Annotated[Path | None, typer.Option("--dir", help="State directory (default: "
                                               f"{default_state_dir()}).")]


def _say(line: str) -> None:
    stderr_console().print(line, highlight=False, soft_wrap=True, markup=False)


@testbed_app.command("build")
def build() -> None:
    """Build (or find cached) etcd, kube-apiserver, kube-scheduler, kube-controller-manager and kubectl for the
    pinned release."""
    binaries = ensure_binaries(log=_say)
    stdout_console().print(f"binaries in {binaries.kube_apiserver.parent}", soft_wrap=True)


@testbed_app.command("up")
def up(
    cluster: Annotated[str, typer.Option(help="openb, philly, synthetic (with --nodes), or a cluster YAML / "
                                          "openb node CSV.")] = "philly",
    nodes: Annotated[int | None, typer.Option(help="Synthetic cluster size, or keep the first N nodes.")] = None,
    kube_scheduler: Annotated[bool, typer.Option("--kube-scheduler/--no-kube-scheduler",
                                                 help="Also run the stock kube-scheduler.")] = True,
    controller_manager: Annotated[bool, typer.Option(
        "--controller-manager/--no-controller-manager",
        help="Run kube-controller-manager (Deployments, Jobs, garbage collection, namespace deletion); "
             "leave it out to measure a scheduler alone.")] = True,
    directory: StateDir = None,
    process_nodes: Annotated[str, typer.Option(help="Comma-separated nodes whose pods run as real host processes "
                                                    "(the process kubelet, docs/kubernetes.md).")] = "",
) -> None:
    """Start the testbed and register the cluster's nodes."""
    result = driver.up(cluster, nodes=nodes, directory=directory, kube_scheduler=kube_scheduler,
                       controller_manager=controller_manager, log=_say)
    if process_nodes:
        process_kubelet.start_detached(result.state, process_nodes.split(","))
    console = stdout_console()
    console.print(f"testbed up in {result.seconds:.1f} s: {result.nodes} nodes from {cluster}", soft_wrap=True)
    console.print(f"export KUBECONFIG={result.state.admin_kubeconfig}", soft_wrap=True, highlight=False)


@testbed_app.command("status")
def status(directory: StateDir = None) -> None:
    """Print the testbed's endpoints and which of its processes run."""
    state = driver.status(directory)
    if state is None:
        stdout_console().print(f"no testbed in {directory or default_state_dir()}", soft_wrap=True)
        raise typer.Exit(1)
    running = {server.name for server in state.running()}
    table = Table(title=f"testbed {state.directory}")
    for column in ("process", "pid", "state", "endpoint", "log"):
        table.add_column(column, no_wrap=column != "log")
    for server in state.servers:
        table.add_row(server.name, str(server.pid), "running" if server.name in running else "stopped",
                      server.url, server.log)
    console = stdout_console()
    console.print(table)
    console.print(f"API server {state.api_url}; admin kubeconfig {state.admin_kubeconfig}; "
                  f"nodes {state.extra.get('nodes', '?')} from {state.extra.get('cluster', '?')}; "
                  f"binaries {binary_dir()}", soft_wrap=True, highlight=False)
    if not running:
        raise typer.Exit(1)


@testbed_app.command("down")
def down(directory: StateDir = None) -> None:
    """Stop every process of the testbed."""
    stopped = driver.down(directory)
    stdout_console().print(f"stopped {', '.join(stopped)}" if stopped else "nothing was running", soft_wrap=True)
