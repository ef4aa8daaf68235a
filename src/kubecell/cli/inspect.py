"""``kubecell inspect`` (also ``kubectl kubecell inspect``): what every node and GPU holds, who waits and why,
and how each virtual cluster uses its guarantee.

The successor of ``kubectl inspect gpushare``: a row per node (GPU models, health, a bar per GPU, the
GPUs and GiB allocated out of the total, the pods), the cluster's totals, the tenant source in force, the
pending pods with their reason, per VC the GPUs in use by class against the guarantee; ``-g`` a row per
GPU instead (milli-GPU and MiB), ``-d`` a row per pod. Only lists (nodes, pods, VirtualClusters, the tenant
ConfigMap) are read; the numbers come from ``kubecell.scheduler.observe.inspect``. An API server that cannot be reached
or refuses the lists is one line on stderr and exit status 1.
"""

from __future__ import annotations

import json
import os
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
import yaml
from rich.console import Console
from rich.table import Table
from rich.text import Text

from kubecell.cli.output import stderr_console, stdout_console
from kubecell.core.errors import InvalidInputError
from kubecell.core.model import Node
from kubecell.kube import virtualclusters
from kubecell.kube.accepted import CONFIGMAP as ACCEPTED_CONFIGMAP
from kubecell.kube.accepted import KEY as ACCEPTED_KEY
from kubecell.kube.accepted import TENANTS_KEY as ACCEPTED_TENANTS_KEY
from kubecell.kube.accepted import VC_KEY as ACCEPTED_VC_KEY
from kubecell.kube.accepted import AcceptedVc, decode, decode_tenants, decode_virtualclusters
from kubecell.kube.rest import ApiError, Kube, KubeconfigError, list_all
from kubecell.scheduler.observe.inspect import GpuReport, InspectReport, NodeReport, build_report

TENANTS_NAMESPACE = "kubecell-system"
TENANTS_CONFIGMAP = "kubecell-tenants"
TENANTS_KEY = "tenants.yaml"
LEVELS = "▁▂▃▄▅▆▇█"
"""A GPU's allocated share in eighths; a free GPU is ``FREE``, an unhealthy one ``UNHEALTHY``."""
FREE = "·"
UNHEALTHY = "✗"
GROUP = 4
"""GPUs per group of the bar (``████ ▄···``): GPU 5 of an 8-GPU node is found without counting."""


class Output(StrEnum):
    table = "table"
    json = "json"
    yaml = "yaml"


def default_kubeconfig() -> Path:
    """As kubectl: the first file of ``$KUBECONFIG``, else ``~/.kube/config``."""
    listed = [part for part in os.environ.get("KUBECONFIG", "").split(os.pathsep) if part]
    return Path(listed[0]) if listed else Path.home() / ".kube" / "config"


def read_cluster(kube: Kube, *, scheduler: str | None) -> InspectReport:
    nodes = list_all(kube, "/api/v1/nodes")
    pod_list = list_all(kube, "/api/v1/pods")
    configmap: dict[str, Any] | None = None
    try:
        configmap = kube.get(f"/api/v1/namespaces/{TENANTS_NAMESPACE}/configmaps/{TENANTS_CONFIGMAP}")
    except ApiError as error:
        if not error.not_found and error.status != 403:
            raise
    objects: list[dict[str, Any]] | None = None
    unread = ""
    try:
        objects = list_all(kube, virtualclusters.PATH)
    except ApiError as error:
        if not error.not_found and error.status != 403:  # 404: the CRD is not installed, so there are none
            raise
        if error.status == 403:
            unread = (f"VirtualClusters not listed ({error}); the tenants shown are the ConfigMap's or the default, "
                      "which the scheduler uses only when no VirtualCluster exists")
    accepted: list[Node] | None = None
    in_force: list[AcceptedVc] | None = None
    data: dict[str, Any] = {}
    try:
        data = kube.get(f"/api/v1/namespaces/{TENANTS_NAMESPACE}/configmaps/{ACCEPTED_CONFIGMAP}").get("data") or {}
    except ApiError as error:
        if not error.not_found and error.status != 403:
            raise
    try:
        accepted = decode(data.get(ACCEPTED_KEY) or "") or None
    except InvalidInputError as error:
        unread = "; ".join(filter(None, (unread, f"{error}; tenants are judged on today's nodes only")))
    if data.get(ACCEPTED_VC_KEY) is not None:
        try:  # the set the scheduler keeps in force, older specs of refused edits included
            in_force = decode_virtualclusters(str(data[ACCEPTED_VC_KEY]))
        except InvalidInputError as error:
            unread = "; ".join(filter(None, (unread, f"{error}; the VirtualClusters in force are read from their "
                                                     "Accepted conditions, as the scheduler does")))
    source = f"configmap {TENANTS_NAMESPACE}/{TENANTS_CONFIGMAP} key {TENANTS_KEY}"
    kept_text: str | None = None
    if data.get(ACCEPTED_TENANTS_KEY) is not None:
        try:  # the ConfigMap text the scheduler keeps in force while an edit of it is refused
            taken_from, text = decode_tenants(str(data[ACCEPTED_TENANTS_KEY]))
            kept_text = text if taken_from == source else None
        except InvalidInputError as error:
            unread = "; ".join(filter(None, (unread, f"{error}; a refused edit of the tenants ConfigMap is shown with "
                                                     "the whole-cluster default")))
    report = build_report(nodes, pod_list, configmap, scheduler=scheduler, virtualcluster_objs=objects,
                          tenants_key=TENANTS_KEY, tenants_configmap_name=f"{TENANTS_NAMESPACE}/{TENANTS_CONFIGMAP}",
                          tenants_source=source, accepted_nodes=accepted, accepted_virtualclusters=in_force,
                          accepted_tenants_text=kept_text)
    if unread:
        report.warnings.append(unread)
    return report


def _percent(used: int, total: int) -> str:
    return f" ({100 * used / total:.0f}%)" if total else ""


def _fraction(used: int, total: int) -> str:
    return f"{used}/{total}{_percent(used, total)}"


def _gpus(value: int) -> str:
    return f"{value / 1000:g}"


def _gib(mib: int) -> str:
    return f"{mib / 1024:.1f}"


def gpu_glyph(gpu: GpuReport) -> Text:
    """One character for one GPU: free, its allocated share in eighths (any share at least ``▁``, only a
    full GPU ``█``), or unhealthy."""
    if not gpu.healthy:
        return Text(UNHEALTHY, style="red")
    if gpu.milli_allocated <= 0:
        return Text(FREE, style="dim")
    if gpu.milli_allocated >= gpu.milli_total:
        return Text(LEVELS[-1])
    level = min(len(LEVELS) - 1, max(1, round(len(LEVELS) * gpu.milli_allocated / gpu.milli_total)))
    return Text(LEVELS[level - 1])


def gpu_bar(node: NodeReport) -> Text:
    """The node's GPUs in index order, in groups of ``GROUP``; GPUs another scheduler holds (which ones,
    kubecell cannot see) are counted after the bar."""
    bar = Text()
    for position, gpu in enumerate(sorted(node.gpus, key=lambda g: g.index)):
        if position and position % GROUP == 0:
            bar.append(" ")
        bar.append_text(gpu_glyph(gpu))
    if node.other_gpus:
        bar.append(f" +{node.other_gpus} other", style="yellow")
    return bar


def _health(node: NodeReport) -> Text:
    parts = [Text(node.excluded, style="yellow")] if node.excluded else []
    if node.unhealthy:
        parts.append(Text(f"{node.unhealthy} unhealthy", style="red"))
    return Text("; ").join(parts) if parts else Text("ok")


def _node_row(table: Table, node: NodeReport, pod_counts: dict[str, tuple[int, int]]) -> None:
    """The compact view: one row per node."""
    held, bad = pod_counts.get(node.name, (0, 0))
    pods = str(held) + (f" +{bad} bad record" if bad else "")
    if not node.gpus:
        table.add_row(node.name, "-", _health(node), "-", "-", "-", pods)
        return
    table.add_row(node.name, ",".join(node.models), _health(node), gpu_bar(node),
                  f"{_gpus(node.milli_allocated)}/{_gpus(node.milli_total)}",
                  f"{_gib(node.memory_allocated_mib)}/{_gib(node.memory_total_mib)}", pods)


def _gpu_health(gpu: GpuReport) -> str | Text:
    if gpu.healthy:
        return "ok"
    return Text(f"unhealthy: {gpu.fault}" if gpu.fault else "unhealthy", style="red")


def _gpu_rows(table: Table, node: NodeReport) -> None:
    """The ``-g`` view: one row per GPU and the node's total."""
    state = f" [{node.excluded}]" if node.excluded else ""
    if not node.gpus:
        table.add_row(node.name + state, "-", "-", "-", "-", "-", "")
        return
    for gpu in node.gpus:
        table.add_row(node.name + state if gpu.index == 0 else "", str(gpu.index), gpu.model,
                      f"{gpu.milli_allocated}/{gpu.milli_total}", f"{gpu.memory_allocated_mib}/{gpu.memory_total_mib}",
                      _gpu_health(gpu), ", ".join(gpu.pods))
    other = f", {node.other_gpus} GPU(s) held by other schedulers" if node.other_gpus else ""
    table.add_row("", "total", ",".join(node.models), _fraction(node.milli_allocated, node.milli_total),
                  _fraction(node.memory_allocated_mib, node.memory_total_mib), "", other.lstrip(", "),
                  end_section=True)


def node_table(report: InspectReport, *, per_gpu: bool, details: bool) -> Table:
    """The nodes, compact (a row per node) or ``per_gpu`` (a row per GPU); nodes without GPUs with ``details``."""
    shown = [node for node in report.nodes if node.gpus or details]
    if per_gpu:
        table = Table(title="GPUs per node (allocated/total)")
        for column in ("NODE", "GPU", "MODEL", "MILLI", "MEMORY MiB", "HEALTH", "PODS"):
            table.add_column(column, no_wrap=column != "PODS")
        for node in shown:
            _gpu_rows(table, node)
        return table
    counts: dict[str, tuple[int, int]] = {}
    for pod in report.pods:
        held, bad = counts.get(pod.node, (0, 0))
        counts[pod.node] = (held, bad + 1) if pod.error else (held + 1, bad)
    table = Table(title="GPUs per node (allocated/total)",
                  caption=f"GPUS: a mark per GPU by index: {FREE} free, {LEVELS[0]}..{LEVELS[-1]} eighths "
                          f"allocated, {UNHEALTHY} unhealthy; -g: a row per GPU")
    for column in ("NODE", "MODEL", "HEALTH", "GPUS", "GPU", "MEMORY GiB", "PODS"):
        table.add_column(column, no_wrap=column not in ("HEALTH", "MODEL"),
                         justify="right" if column in ("GPU", "MEMORY GiB", "PODS") else "left")
    for node in shown:
        _node_row(table, node, counts)
    return table


def print_table(console: Console, report: InspectReport, *, details: bool, per_gpu: bool = False) -> None:
    console.print(node_table(report, per_gpu=per_gpu, details=details))
    data = report.to_data()["cluster"]
    if per_gpu:
        console.print("Allocated/total GPU compute in cluster: "
                      f"{_fraction(data['milliAllocated'], data['milliTotal'])} milli; GPU memory: "
                      f"{_fraction(data['memoryAllocatedMiB'], data['memoryTotalMiB'])} MiB", highlight=False)
    else:
        console.print(f"Allocated/total in cluster: {_gpus(data['milliAllocated'])}/{_gpus(data['milliTotal'])} "
                      f"GPUs{_percent(data['milliAllocated'], data['milliTotal'])}; GPU memory: "
                      f"{_gib(data['memoryAllocatedMiB'])}/{_gib(data['memoryTotalMiB'])} GiB"
                      f"{_percent(data['memoryAllocatedMiB'], data['memoryTotalMiB'])}", highlight=False)
    console.print(f"Tenants in force: {report.tenants.summary}", highlight=False, markup=False)
    if details:
        rows = Table(title="Pods holding GPUs")
        for column in ("POD", "NODE", "GPUS", "MILLI", "MEMORY MiB", "ISOLATION", "VC", "CLASS", "NOTE"):
            rows.add_column(column)
        for pod in report.pods:
            rows.add_row(pod.pod, pod.node, ",".join(map(str, pod.gpus)) or "-", str(pod.milli), str(pod.memory_mib),
                         pod.isolation, pod.vc, pod.job_class, Text(f"bad record: {pod.error}" if pod.error else ""))
        console.print(rows)
    pending = Table(title=f"Pending pods ({len(report.pending)})")
    for column in ("POD", "SCHEDULER", "ASK", "REASON"):
        pending.add_column(column)
    for waiting in report.pending:
        pending.add_row(waiting.pod, waiting.scheduler, waiting.ask, Text(waiting.reason))
    console.print(pending)
    vcs = Table(title="Virtual clusters (GPUs)")
    for column in ("VC", "GUARANTEED", "IN USE", "GUARANTEED USE", "BORROWED", "OPPORTUNISTIC", "BORROWED SHARE",
                   "PODS"):
        vcs.add_column(column)
    for vc in report.vcs:
        milli = vc.in_use_milli
        vcs.add_row(vc.name, str(vc.guaranteed_gpus), f"{vc.in_use_gpus:g}", f"{milli['guaranteed'] / 1000:g}",
                    f"{milli['borrowed'] / 1000:g}", f"{milli['opportunistic'] / 1000:g}",
                    f"{100 * vc.borrowed_share:.0f}%", str(vc.pods))
    console.print(vcs)
    for warning in report.warnings:
        stderr_console().print(f"warning: {warning}", highlight=False, soft_wrap=True, markup=False)


def inspect(
    kubeconfig: Annotated[Path | None, typer.Option(
        help="Kubeconfig (default: $KUBECONFIG, else ~/.kube/config).")] = None,
    details: Annotated[bool, typer.Option("--details", "-d", help="A row per pod: GPUs, share, isolation.")] = False,
    gpus: Annotated[bool, typer.Option("--gpus", "-g", help="A row per GPU (milli-GPU, MiB, pods) instead of "
                                       "a row per node.")] = False,
    output: Annotated[Output, typer.Option("--output", "-o", help="table, json or yaml.")] = Output.table,
    node: Annotated[list[str] | None, typer.Option(help="Only this node (repeatable).")] = None,
    scheduler: Annotated[str, typer.Option(help="List the pending pods of this schedulerName ('*': every "
                                           "scheduler's).")] = "kubecell",
) -> None:
    """Per node (-g: per GPU): allocated/total GPUs and memory, model, health; pending pods and why; VC usage."""
    path = kubeconfig or default_kubeconfig()
    try:
        kube = Kube.from_kubeconfig(path, pool=2)
    except KubeconfigError as error:
        _fail(str(error))
    try:
        report = read_cluster(kube, scheduler=None if scheduler == "*" else scheduler)
    except ApiError as error:
        _fail(f"cannot read the cluster: {error}" + (" (is the API server running? check --kubeconfig)"
                                                     if error.status == 0 else ""))
    finally:
        kube.close()
    if node:
        wanted = set(node)
        report.nodes = [n for n in report.nodes if n.name in wanted]
        report.pods = [p for p in report.pods if p.node in wanted]
    if output is Output.table:
        print_table(stdout_console(), report, details=details, per_gpu=gpus)
    elif output is Output.json:
        sys.stdout.write(json.dumps(report.to_data(), indent=2) + "\n")
    else:
        sys.stdout.write(yaml.safe_dump(report.to_data(), sort_keys=False))


def _fail(message: str) -> NoReturn:
    stderr_console().print(Text.assemble(("error:", "bold red"), f" {message}"), highlight=False, soft_wrap=True)
    raise typer.Exit(1)
