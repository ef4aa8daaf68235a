"""``kubecell profile``: the profiler's job history: collect it, advise from it, report on it.

``collect`` reads the cluster's pods (grouped into jobs by controller owner or gang), their series from
Prometheus and saves each job in the history (``--db``: SQLite file by default, ``postgresql://`` for a
cluster); with ``--every`` it repeats until interrupted or ``--passes`` are done. ``recommend`` prints the
share each workload family needs; ``report`` writes an HTML page with plots. The profiler's libraries
(SQLAlchemy, Alembic, psycopg) are the ``profiler`` extra: imported only by these commands.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn
from urllib.parse import urlsplit

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from kubecell.cli.output import stderr_console, stdout_console

if TYPE_CHECKING:
    from kubecell.profiler.history import JobHistory
    from kubecell.profiler.pairs import PairSpeed

DEFAULT_DB = "sqlite:///kubecell-history.db"
DbOption = Annotated[str, typer.Option("--db", envvar="KUBECELL_HISTORY", help="The job history: a SQLAlchemy URL "
                                       "(sqlite:///FILE, postgresql://USER@HOST/DB); env KUBECELL_HISTORY.")]

MAX_EVERY_SECONDS = 7 * 86_400.0
"""The longest pause between passes ``--every`` takes: pods are deleted long before a week goes by."""
OutputOption = Annotated[str, typer.Option("--output", "-o", help="table or json.")]
profile_app = typer.Typer(help="The profiler: what jobs used, kept in a job history, and the requests it advises.",
                          no_args_is_help=True)


def _fail(message: str) -> NoReturn:
    stderr_console().print(Text.assemble(("error:", "bold red"), f" {message}"), highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _history(db: str, *, create: bool = False) -> JobHistory:
    """The history at ``db`` (made there only by ``collect``: ``create``); the profiler extra may be absent, so
    it is imported here, not at the top."""
    try:
        from kubecell.profiler.history import JobHistory
    except ImportError as error:
        _fail(f"the profiler needs its extra: pip install 'kubecell[profiler]' ({error})")
    return JobHistory.open(db, create=create)


@profile_app.command("collect")
def collect(
    prometheus: Annotated[str, typer.Option(help="Prometheus' base URL, e.g. http://prometheus:9090.")],
    db: DbOption = DEFAULT_DB,
    kubeconfig: Annotated[Path | None, typer.Option(
        help="Kubeconfig (default: $KUBECONFIG, else ~/.kube/config, else the pod's service account).")] = None,
    namespace: Annotated[str | None, typer.Option(help="Only this namespace (default: all).")] = None,
    all_jobs: Annotated[bool, typer.Option("--all-jobs", help="Also jobs that asked for no GPU.")] = False,
    every: Annotated[float | None, typer.Option(help="Repeat every this many seconds.")] = None,
    passes: Annotated[int | None, typer.Option(help="With --every: stop after this many passes.")] = None,
    scrape_job: Annotated[list[str] | None, typer.Option(
        "--scrape-job", help="Read only the series of this Prometheus scrape job (its 'job' label; repeat for "
        "each exporter: the node agent, dcgm-exporter, the kubelet's cAdvisor). Give them where tenants' own "
        "pods are scraped too, or a pod could export its own usage. Default: every job's series.")] = None,
) -> None:
    """Profile the cluster's jobs from Prometheus into the job history."""
    from kubecell.cli.inspect import default_kubeconfig
    from kubecell.core.errors import KubecellError
    from kubecell.kube.rest import ApiError, Kube, KubeconfigError
    from kubecell.profiler.jobs import group_pods, list_pods
    from kubecell.profiler.prometheus import Prometheus, PrometheusError
    from kubecell.profiler.run import profile_jobs

    if every is not None and not (math.isfinite(every) and 0 < every <= MAX_EVERY_SECONDS):
        _fail(f"--every {every}: give seconds > 0 and at most {MAX_EVERY_SECONDS:g} (a week)")
    if passes is not None and (passes < 1 or every is None):
        _fail(f"--passes {passes}: give at least 1, with --every" if passes < 1 else "--passes needs --every")
    scheme = urlsplit(prometheus)
    if scheme.scheme not in ("http", "https") or not scheme.hostname:
        _fail(f"--prometheus {prometheus!r}: give Prometheus' base URL, http(s)://HOST[:PORT][/PREFIX]")
    try:
        client = Prometheus(prometheus, scrape_jobs=scrape_job or ())
    except KubecellError as error:
        _fail(f"--scrape-job: {error}")
    path = kubeconfig or default_kubeconfig()
    in_cluster = kubeconfig is None and not path.is_file()  # in a pod: its service account (deploy/profiler)
    try:
        kube = Kube.from_kubeconfig(None if in_cluster else path, pool=2)
    except KubeconfigError as error:
        _fail(f"{error} ({path} is absent)" if in_cluster else str(error))
    history = _history(db, create=True)
    done = 0
    try:
        while True:
            try:
                found = group_pods(list_pods(kube, namespace))
                result = profile_jobs(found, client, history, gpu_only=not all_jobs)
            except ApiError as error:
                _fail(f"cannot list pods: {error}")
            except PrometheusError as error:
                _fail(str(error))
            problems = sum(len(record.problems) for record in result.saved)
            stdout_console().print(f"{len(result.saved)} job(s) saved, {len(result.unchanged)} unchanged, "
                                   f"{problems} series problem(s) recorded", highlight=False)
            for uid, why in result.refused:
                stderr_console().print(f"warning: job {uid} not saved: {why}", highlight=False, markup=False)
            done += 1
            if every is None or (passes is not None and done >= passes):
                return
            time.sleep(every)
    finally:
        history.close()
        kube.close()


@profile_app.command("recommend")
def recommend(
    db: DbOption = DEFAULT_DB,
    namespace: Annotated[str | None, typer.Option(help="Only this namespace.")] = None,
    output: OutputOption = "table",
) -> None:
    """The GPU share and memory each workload family needs, from its finished jobs."""
    from kubecell.profiler.recommend import advise

    _check_output(output)
    with _history(db) as history:
        advice = advise(history.jobs(namespace=namespace, limit=100_000))
    if output == "json":
        sys.stdout.write(json.dumps([{
            "namespace": a.namespace, "family": a.family, "jobs": a.advice.jobs, "askedGpus": a.asked_gpus,
            "askedMilli": a.asked_milli, "milli": a.advice.milli, "memoryMiB": a.advice.memory_mib,
            "savedMilliPerPod": a.saved_milli_per_pod, "jobsWithoutSeries": a.without_series,
            "reason": a.advice.reason} for a in advice], indent=2) + "\n")
        return
    table = Table(title="recommended requests per GPU, from finished jobs", box=box.SIMPLE_HEAD)
    for column in ("namespace", "family", "jobs", "asked / pod", "share", "GPU memory", "why"):
        table.add_column(column, overflow="fold")
    for a in advice:
        got = a.advice
        share = "—" if got.milli is None else ("whole GPU" if got.whole_gpu else f"{got.milli} milli")
        table.add_row(a.namespace, a.family, str(got.jobs), f"{a.asked_gpus} x {a.asked_milli} milli", share,
                      "—" if got.memory_mib is None else f"{got.memory_mib} MiB", got.reason)
    stdout_console().print(table)


def _check_output(output: str) -> None:
    if output not in ("table", "json"):
        _fail(f"--output {output!r}: table or json")


def _pairs(history: JobHistory, namespace: str | None) -> list[PairSpeed]:
    """The history's pairs whose family is in ``namespace`` (all where None)."""
    from kubecell.profiler.pairs import pair_speeds

    return [pair for pair in pair_speeds(history.sharing())
            if namespace is None or pair.family.split("/", 1)[0] == namespace]


@profile_app.command("pairs")
def pairs(
    db: DbOption = DEFAULT_DB,
    namespace: Annotated[str | None, typer.Option(help="Only families of this namespace.")] = None,
    output: OutputOption = "table",
) -> None:
    """How fast each family ran beside each other one on a time-sliced GPU, as 'kubecell scheduler --history'
    reads it for --colocation: busy beside the partner over busy alone."""
    _check_output(output)
    with _history(db) as history:
        found = _pairs(history, namespace)
    if output == "json":
        sys.stdout.write(json.dumps([{
            "family": p.family, "partner": p.partner, "seconds": p.seconds, "busyBeside": p.busy_beside,
            "busyAlone": p.busy_alone, "speed": p.speed, "why": p.why} for p in found], indent=2) + "\n")
        return
    table = Table(title="speed beside a partner on a shared GPU (time-sliced), from the pods' own utilization",
                  box=box.SIMPLE_HEAD)
    for column in ("family", "beside", "hours together", "busy beside", "busy alone", "speed", "why"):
        table.add_column(column, overflow="fold")
    for p in found:
        table.add_row(p.family, p.partner, f"{p.seconds / 3600:.2f}", f"{p.busy_beside:.0%}",
                      "—" if p.busy_alone is None else f"{p.busy_alone:.0%}",
                      "—" if p.speed is None else f"{p.speed:.2f}", p.why)
    stdout_console().print(table)


@profile_app.command("report")
def report(
    out: Annotated[Path, typer.Option(help="Directory for index.html and its plots (created).")],
    db: DbOption = DEFAULT_DB,
    namespace: Annotated[str | None, typer.Option(help="Only this namespace.")] = None,
) -> None:
    """An HTML report of the history: per-job use, asked against used per VC and family, recommendations, and
    how fast families ran beside each other on shared GPUs."""
    from kubecell.cli.output import check_out_dir, prepare_out_dir
    from kubecell.profiler.report import write_report

    check_out_dir(out)  # before the history is read: a bad --out is told at once, as by every other command
    with _history(db) as history:
        records = history.jobs(namespace=namespace, limit=100_000)
        pairs = _pairs(history, namespace)
    prepare_out_dir(out)
    page = write_report(records, out, pairs)
    stdout_console().print(f"{len(records)} job(s): {page}", highlight=False)


@profile_app.command("webhook")
def webhook(
    tls_cert: Annotated[Path, typer.Option(help="The serving certificate (PEM) the API server verifies.")],
    tls_key: Annotated[Path, typer.Option(help="Its private key (PEM).")],
    db: DbOption = DEFAULT_DB,
    listen: Annotated[str, typer.Option(help="HOST:PORT to serve HTTPS on.")] = "0.0.0.0:8443",
) -> None:
    """The right-sizing admission webhook: lowers a new pod's kubecell.io/gpu-milli to its family's need
    (deploy/rightsize). Runs until SIGTERM or Ctrl-C."""
    import ssl
    import threading

    from kubecell.cli.service import stop_on_signals
    from kubecell.cli.serving import serve

    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(str(tls_cert), str(tls_key))
    except (OSError, ssl.SSLError) as error:
        _fail(f"--tls-cert {tls_cert} / --tls-key {tls_key}: not a certificate and its key: {error}")
    from kubecell.cli.scheduler import listen_address
    from kubecell.core.errors import InvalidInputError

    try:
        address = listen_address(listen)
    except InvalidInputError as error:
        _fail(str(error))
    if address is None:
        _fail("--listen: a webhook must listen (HOST:PORT)")
    host, port = address
    from kubecell.profiler.knowledge import HistoryKnowledge
    from kubecell.profiler.webhook import webhook_app

    stop = threading.Event()
    stop_on_signals(stop)
    with _history(db) as history:
        knowledge = HistoryKnowledge(history)
        try:
            served = serve(webhook_app(knowledge.share_milli), host, port, tls=(str(tls_cert), str(tls_key)))
        except (OSError, RuntimeError) as error:
            _fail(f"cannot listen on {host}:{port}: {error}")
        stderr_console().print(f"right-sizing webhook on {served.url}/mutate", highlight=False)
        try:
            stop.wait()
        finally:
            served.stop()
