"""``kubecell elasticjobs`` (also ``kubectl kubecell elasticjobs``): each ElasticJob's state, and what the
scheduler's goodput model says it is worth at other sizes (``kubecell.elastic.inspect``).

A row per job: phase, minimum, maximum, target, ready workers, GPU model, counted restarts, and the kept model in
one cell (per GPU model, the speed-up at the largest size it prices, over one worker of the job's best GPU
model). Name one job for its model in full:
per GPU model, the speed-up and the batch (micro-batch x accumulation) at each size, the noise scale, and the
scheduler's newest decisions on it (its Resize, Move and Start Events, with their reasons). Only ElasticJobs are
read (one list; named: one GET and one list of the job's Events, whose refusal is shown, not fatal); an API
server that cannot be reached or refuses the ElasticJobs is one line on stderr and exit status 1.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer
import yaml
from rich.console import Console
from rich.table import Table
from rich.text import Text

from kubecell.cli.inspect import Output, default_kubeconfig
from kubecell.cli.output import stderr_console, stdout_console
from kubecell.elastic.inspect import JobView, TypeView, job_views
from kubecell.kube import elasticjobs
from kubecell.kube.rest import ApiError, Kube, KubeconfigError, list_all


def _cell(value: int | None) -> str:
    return "-" if value is None else str(value)


def _summary(view: JobView) -> str:
    model = view.model
    if model.state != "kept":
        return model.state if model.state == "none" else f"dropped: {model.reason}"
    parts = []
    for gpu in model.types:
        priced = {n: s for n, s in gpu.speedup.items() if s is not None}
        if priced:
            most = max(priced)
            parts.append(f"{gpu.gpu_type}: x{priced[most]:.2f} at {most} ({gpu.shapes} shapes)")
        else:
            parts.append(f"{gpu.gpu_type}: {gpu.shapes} shapes")
    return "; ".join(parts) or "kept, nothing measured"


def jobs_table(views: list[JobView]) -> Table:
    table = Table(box=None, pad_edge=False)
    for column in ("NAMESPACE", "NAME", "PHASE", "MIN", "MAX", "TARGET", "READY", "GPU-MODEL", "RESTARTS",
                   "GOODPUT MODEL"):
        table.add_column(column, overflow="fold")
    for view in views:
        table.add_row(view.namespace, view.name, view.phase, _cell(view.minimum), _cell(view.maximum),
                      _cell(view.target), f"{view.ready}/{view.replicas}", view.gpu_model or "-", str(view.restarts),
                      _summary(view))
    return table


def _batch(gpu: TypeView, n: int) -> str:
    chosen = gpu.batch.get(n)
    if chosen is None:
        return "-"
    local, steps = chosen
    return f"{local}" if steps == 1 else f"{local}x{steps}"


def model_table(view: JobView) -> Table:
    """Per GPU model and size: the speed-up over one worker there, and the batch it would train at."""
    sizes = sorted({n for gpu in view.model.types for n in gpu.speedup})
    table = Table(box=None, pad_edge=False, title=Text(
        f"{view.namespace}/{view.name}: goodput per size over one worker of its best GPU model "
        "(the micro-batch it would train at, x the accumulation steps where it accumulates)"), title_justify="left")
    table.add_column("GPU MODEL")
    table.add_column("SHAPES", justify="right")
    for n in sizes:
        table.add_column(f"{n}", justify="right")
    for gpu in view.model.types:
        cells = [f"x{gpu.speedup[n]:.2f} ({_batch(gpu, n)})" if gpu.speedup.get(n) is not None else "not priced"
                 for n in sizes]
        table.add_row(gpu.gpu_type, str(gpu.shapes), *cells)
    return table


DECISIONS = ("Resize", "Move", "Start", "ResizeRefused", "GoodputModelDropped", "MaxReplicasUnreachable",
             "MixedGpuModels")
"""The Events the scheduler's sizer writes on an ElasticJob: the reasons behind its size and GPU model."""
SHOWN_DECISIONS = 5
EVENTS_READ = 500
"""At most this many of the job's Events are read (a job's Events are few: the API server merges repeats)."""


def decisions(kube: Kube, namespace: str, name: str, uid: str | None) -> list[str] | str:
    """The sizer's newest Events on the job, newest first, as ``time reason: message`` (a string: why none could
    be read). One list of the job's Events."""
    try:
        listed = kube.get(f"/api/v1/namespaces/{namespace}/events", limit=EVENTS_READ,
                          fieldSelector=f"involvedObject.kind={elasticjobs.KIND},involvedObject.name={name}")
    except ApiError as error:
        return f"Events not read: {error}"
    found = listed.get("items") if isinstance(listed, dict) else None
    rows = []
    for event in found if isinstance(found, list) else []:
        if not isinstance(event, dict):
            continue
        involved = event.get("involvedObject") or {}
        if event.get("reason") not in DECISIONS or (uid and involved.get("uid") not in (None, "", uid)):
            continue
        when = str(event.get("lastTimestamp") or event.get("eventTime") or "")
        rows.append((when, f"{when} {event.get('reason')}: {event.get('message', '')}"))
    return [text for _, text in sorted(rows, reverse=True)[:SHOWN_DECISIONS]]


def print_views(console: Console, views: list[JobView], *, detail: bool,
                events: list[str] | str | None = None) -> None:
    if not views:
        console.print("No ElasticJobs found.")
        return
    console.print(jobs_table(views))
    if not detail:
        return
    for view in views:
        model = view.model
        if view.problem:
            console.print(Text(f"{view.namespace}/{view.name}: {view.problem}", style="red"), soft_wrap=True)
        if model.state != "kept":
            console.print(f"{view.namespace}/{view.name}: goodput model {_summary(view)}", soft_wrap=True,
                          highlight=False)
            continue
        console.print()
        console.print(model_table(view))
        noise = "no gradient statistics yet" if model.noise_ratio is None else f"{model.noise_ratio:g}"
        batch = "-" if model.batch_range is None else f"{model.batch_range[0]}-{model.batch_range[1]}"
        console.print(f"global batch range {batch}; gradient noise ratio at the smallest batch: {noise}; "
                      "'not priced': beyond what the model trusts until a report at a nearer size",
                      highlight=False, soft_wrap=True)
    if events is None:
        return
    console.print()
    if isinstance(events, str):
        console.print(events, highlight=False, soft_wrap=True, markup=False)
        return
    console.print("The scheduler's newest decisions on it:" if events else "No decision of the scheduler on it yet.")
    for line in events:
        console.print(f"  {line}", highlight=False, soft_wrap=True, markup=False)


def elasticjobs_command(
    name: Annotated[str | None, typer.Argument(help="One job (its goodput model in full).")] = None,
    namespace: Annotated[str | None, typer.Option("--namespace", "-n", help="This namespace (default: all; "
                                                  "needed with a NAME).")] = None,
    output: Annotated[Output, typer.Option("--output", "-o", help="table, json or yaml.")] = Output.table,
    gpus_per_node: Annotated[int, typer.Option(min=1, max=1024, help="Workers a node holds, for the "
                                               "placements the model is asked about.")] = 8,
    kubeconfig: Annotated[Path | None, typer.Option(
        help="Kubeconfig (default: $KUBECONFIG, else ~/.kube/config).")] = None,
) -> None:
    """ElasticJobs: phase, sizes, GPU model, and what the scheduler's goodput model says of other sizes."""
    if name is not None and namespace is None:
        _fail("a job NAME needs its --namespace")
    path = kubeconfig or default_kubeconfig()
    try:
        kube = Kube.from_kubeconfig(path, pool=1)
    except KubeconfigError as error:
        _fail(str(error))
    events: list[str] | str | None = None
    try:
        if name is not None and namespace is not None:
            objects = [kube.get(elasticjobs.job_path(namespace, name))]
            uid = (objects[0].get("metadata") or {}).get("uid")
            events = decisions(kube, namespace, name, uid if isinstance(uid, str) else None)
        else:
            objects = list_all(kube, elasticjobs.collection_path(namespace))
    except ApiError as error:
        if error.not_found and name is None:
            _fail("no ElasticJob API: the CRD is not installed (kubectl apply -k deploy/elastic)")
        _fail(f"cannot read ElasticJobs: {error}" + (" (is the API server running? check --kubeconfig)"
                                                     if error.status == 0 else ""))
    finally:
        kube.close()
    views = job_views(objects, gpus_per_node=gpus_per_node)
    data = [dict(view.to_data(), **({"decisions": events} if isinstance(events, list) else {})) for view in views]
    if output is Output.table:
        print_views(stdout_console(), views, detail=name is not None, events=events)
    elif output is Output.json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        sys.stdout.write(yaml.safe_dump(data, sort_keys=False))


def _fail(message: str) -> NoReturn:
    stderr_console().print(Text.assemble(("error:", "bold red"), f" {message}"), highlight=False, soft_wrap=True)
    raise typer.Exit(1)
