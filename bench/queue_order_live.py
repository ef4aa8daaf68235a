"""History-based queue order on a real control plane, beside the simulator's figure for the same jobs.

``bench/queue_order.py`` measures the order in the simulator. This replays a smaller workload of the same kind
on the testbed (a real API server, the fake kubelet ending each pod after its ``kubecell.io/duration-seconds``)
twice, with kubecell's scheduler ordering each VC's queue by age and by shortest-expected-first. In the history
run the whole loop runs as on a cluster: a profiler pass (``profile_jobs`` over the API server's pods, against
a real, empty Prometheus: a job's run time needs no series) files every finished job in a SQLite job history
every ``--profile-every`` seconds, and the scheduler reads its expected run times from that history
(``HistoryKnowledge``, as ``kubecell scheduler --history`` does).

The workload is ``bench/queue_order.py``'s (families with Philly median run times, a lognormal spread, 1/2/4/8
GPUs per job, two VCs each guaranteed half of the GPUs), scaled to seconds: run times are multiplied so that
the median job runs ``--median-seconds`` and capped at ``--cap-seconds``, on 2 nodes of 8 GPUs, with Poisson
arrivals at ``--load``. Each family starts with ``--past-runs`` earlier runs in the history (drawn from its own
distribution: last week's jobs), so that a short replay is not all cold start; the simulator is given the same
earlier runs. The simulator then replays the same jobs with the same options; its figures show how much of the
difference between the orders survives a real cluster's latencies.

    python bench/queue_order_live.py [--jobs 80] [--load 1.3] [--seeds 0,1,2,3] [--families 12]
                                     [--median-seconds 12] [--cap-seconds 120] [--past-runs 3]

Printed per seed and order: the average and p90 JCT and the average wait, in seconds, and the preemptions
(restarts), live and simulated, the share of jobs that had an estimate when the scheduler took them in, and
(``filed``) how many Succeeded runs the profiler filed in the history meanwhile; then history's avg JCT over
age's, live and simulated. Needs Go for the first testbed build (cached afterwards),
Debian's ``prometheus`` and the Philly run times (``../shared/data/philly``); it says which is missing and stops.
Loopback only; everything it starts is stopped at the end. The jobs run in real time: at the default 80 jobs,
5 to 12 minutes per seed and order here.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from kubecell.core.engine.job import JobSpec
from kubecell.core.model import Node
from kubecell.core.tenancy.config import resolve_tenants
from kubecell.core.topology import CellForest
from kubecell.kube.names import ANNOTATION_DURATION, ANNOTATION_VC, RESOURCE_GPU
from kubecell.kube.rest import Kube
from kubecell.profiler.history import JobHistory, JobRecord, Outcome
from kubecell.profiler.identity import name_family
from kubecell.profiler.jobs import group_pods, list_pods
from kubecell.profiler.knowledge import HistoryKnowledge
from kubecell.profiler.prometheus import Prometheus
from kubecell.profiler.run import profile_jobs
from kubecell.scheduler.options import SchedulerOptions, engine_options
from kubecell.sim.dynamic.simulator import DynamicSimulation, family_keys
from kubecell.testbed import testbed
from kubecell.testbed.nodes import synthetic_cluster
from kubecell.testbed.prometheus import PrometheusMissingError, binaries, serve
from kubecell.testbed.replay import own_scheduler
from queue_order import RUNTIMES, CountingHistory, runtimes, workload

NODES, GPUS_PER_NODE = 2, 8
TENANTS = {"virtualClusters": {"a": {"gpus": 8}, "b": {"gpus": 8}}}
"""Each VC guaranteed half the GPUs: the scheduler reads it from its ConfigMap (as JSON, which is YAML), the
simulator as it is."""
SPREAD = 0.8
"""The lognormal sigma of a job's run time around its family's median (``queue_order.py``'s default)."""
POLL_SECONDS = 0.25
"""How often the replay lists the pods to see which were bound and which have ended (the JCT's resolution)."""


@dataclass(frozen=True)
class Figures:
    avg_jct: float
    p90_jct: float
    avg_wait: float
    estimated: float
    restarts: int
    filed: int = 0
    """Runs the profiler filed in the history while the replay ran (the history run only)."""


@dataclass(frozen=True)
class Replayed:
    jct: list[float]
    wait: list[float]
    restarts: int


def scaled(specs: Sequence[JobSpec], median_seconds: float, cap: float, load: float, seed: int) -> list[JobSpec]:
    """The jobs in seconds: run times scaled to a ``median_seconds`` median and capped, arrivals Poisson at ``load``
    on this bench's GPUs."""
    work = np.array([spec.work for spec in specs], np.float64)
    factor = median_seconds / float(np.median(work))
    work = np.clip(work * factor, 2.0, cap)
    demand = float(sum(w * spec.member.gpu_count for w, spec in zip(work, specs, strict=True)))
    rate = load * NODES * GPUS_PER_NODE * len(specs) / demand
    submits = np.cumsum(np.random.default_rng(seed + 10_000).exponential(1.0 / rate, size=len(specs)))
    return [replace(spec, work=float(w), submit_time=float(s)) for spec, w, s in zip(specs, work, submits, strict=True)]


def family(spec: JobSpec) -> str:
    return dict(spec.labels)["family"]


def past_runs(specs: Sequence[JobSpec], count: int, seed: int) -> dict[str, tuple[str, list[float]]]:
    """Per family: its VC and ``count`` earlier run times, drawn as the workload draws its jobs' (the family's
    median, estimated here from its jobs, times the same lognormal spread)."""
    rng = np.random.default_rng(seed + 20_000)
    by_family: dict[str, list[JobSpec]] = {}
    for spec in specs:
        by_family.setdefault(family(spec), []).append(spec)
    cap = max(spec.work for spec in specs)
    return {name: (members[0].vc, [float(np.clip(statistics.median(m.work for m in members)
                                                  * rng.lognormal(0.0, SPREAD), 2.0, cap)) for _ in range(count)])
            for name, members in sorted(by_family.items())}


def simulate(nodes: Sequence[Node], specs: Sequence[JobSpec], order: str,
             past: Mapping[str, tuple[str, list[float]]]) -> Figures:
    """The simulator's run of the same jobs, with the scheduler's options and the same earlier runs."""
    tenants = resolve_tenants(TENANTS, CellForest(list(nodes)))
    options = engine_options(SchedulerOptions(queue_order="age" if order == "age" else "shortest-expected"))
    history = None
    if order == "history":
        history = CountingHistory()
        for name, (vc, runs) in past.items():
            example = next(spec for spec in specs if family(spec) == name)
            for seconds in runs:
                history.record(family_keys(replace(example, vc=vc)), seconds)
        history.given = 0  # counted from here: the jobs that had an estimate when submitted
    result = DynamicSimulation(list(nodes), tenants, options, list(specs), sample_seconds=0, durations=history).run()
    records = [r for r in result.records if r.completion_time is not None and r.first_start is not None]
    jct = [float(r.completion_time) for r in records]  # type: ignore[arg-type]
    wait = [float(r.first_start - r.submit) for r in records]  # type: ignore[operator]
    return Figures(statistics.fmean(jct), float(np.percentile(jct, 90)), statistics.fmean(wait),
                   0.0 if history is None else history.given / len(specs), sum(r.preemptions for r in result.records))


def pod_name(spec: JobSpec, attempt: int) -> str:
    """``f3-17-0``: family ``f3`` (the profiler's name family), job 17, first attempt."""
    return f"{family(spec)}-{spec.name.rsplit('-', 1)[-1]}-{attempt}"


def manifest(spec: JobSpec, attempt: int, namespace: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name(spec, attempt), "namespace": namespace,
                         "annotations": {ANNOTATION_VC: spec.vc, ANNOTATION_DURATION: f"{spec.work:.3f}"}},
            "spec": {"schedulerName": "kubecell", "terminationGracePeriodSeconds": 0, "restartPolicy": "Never",
                     "containers": [{"name": "main", "image": "replay",
                                     "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                                   "limits": {RESOURCE_GPU: str(spec.member.gpu_count)}}}]}}


def seed_history(history: JobHistory, namespace: str, past: Mapping[str, tuple[str, list[float]]]) -> None:
    """File each family's earlier runs, as the profiler would have (a day ago, Succeeded)."""
    start = datetime.now(UTC) - timedelta(days=1)
    for name, (vc, runs) in past.items():
        for index, seconds in enumerate(runs):
            begun = start + timedelta(minutes=index)
            history.save(JobRecord(uid=f"past-{name}-{index}", namespace=namespace, owner_kind="Pod",
                                   owner_name=f"{name}-past{index}", family=name_family(f"{name}-0"), vc=vc,
                                   created=begun, started=begun, finished=begun + timedelta(seconds=seconds),
                                   outcome=Outcome.SUCCEEDED, gpus_per_pod=1))


@contextmanager
def profiler(kube: Kube, url: str, history_url: str, namespace: str, every: float) -> Iterator[None]:
    """A profiling pass over the namespace every ``every`` seconds in a thread, as ``kubecell profile collect
    --every`` would run beside the scheduler."""
    stop = threading.Event()
    failures: list[BaseException] = []

    def loop() -> None:
        with JobHistory.open(history_url) as history:
            client = Prometheus(url)
            while not stop.wait(every):
                try:
                    profile_jobs(group_pods(list_pods(kube, namespace)), client, history)
                except Exception as error:  # reported once the run ends; the run goes on
                    failures.append(error)

    thread = threading.Thread(target=loop, name="profiler", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=60)
        if failures:
            print(f"  profiler: {len(failures)} failed passes, first: {failures[0]}", file=sys.stderr)


def replay(kube: Kube, specs: Sequence[JobSpec], namespace: str, timeout: float,
           make: Callable[[JobSpec, int, str], dict[str, Any]] = manifest) -> Replayed:
    """Create each job's pod at its submit time, and a new one when the scheduler preempts it (the pod is evicted:
    gone, or Failed), as a Job's controller would; the new pod runs the whole time again, as the simulator's job
    restarts from its last checkpoint (none, at these lengths). Each job's JCT and first wait are measured from
    its submit time to when the pods' list first shows it bound and Succeeded. ``make`` writes attempt N of a job's
    pod (named ``pod_name(spec, N)``)."""
    pending = sorted(specs, key=lambda spec: spec.submit_time)
    running: dict[str, tuple[JobSpec, int]] = {}  # pod name -> its job and attempt
    submitted: dict[str, float] = {}
    bound: dict[str, float] = {}
    ended: dict[str, float] = {}
    restarts = 0
    path = f"/api/v1/namespaces/{namespace}/pods"
    start = time.monotonic()
    deadline = start + timeout
    while len(ended) < len(specs):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(specs) - len(ended)} of {len(specs)} jobs not ended after {timeout:.0f} s")
        while pending and pending[0].submit_time <= time.monotonic() - start:
            spec = pending.pop(0)
            kube.create(path, make(spec, 0, namespace))
            submitted[spec.name] = time.monotonic()
            running[pod_name(spec, 0)] = (spec, 0)
        seen = time.monotonic()
        listed = {pod["metadata"]["name"]: pod for pod in kube.get(path)["items"]}
        for name, (spec, attempt) in list(running.items()):
            pod = listed.get(name)
            phase = pod["status"].get("phase") if pod is not None else None
            if pod is not None and pod["spec"].get("nodeName"):
                bound.setdefault(spec.name, seen)
            if phase == "Succeeded":
                ended[spec.name] = seen
                del running[name]
            elif pod is None or phase == "Failed" or pod["metadata"].get("deletionTimestamp"):
                del running[name]  # preempted: its controller makes another
                restarts += 1
                kube.create(path, make(spec, attempt + 1, namespace))
                running[pod_name(spec, attempt + 1)] = (spec, attempt + 1)
        time.sleep(POLL_SECONDS)
    return Replayed([ended[job] - submitted[job] for job in submitted],
                    [bound.get(job, ended[job]) - submitted[job] for job in submitted], restarts)


def live(kube: Kube, specs: Sequence[JobSpec], order: str, past: Mapping[str, tuple[str, list[float]]],
         scratch: Path, run: str, every: float, timeout: float) -> Figures:
    namespace = f"order-{run}"
    kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    history_url = f"sqlite:///{scratch / f'{run}.db'}"
    estimated: set[str] = set()  # first pods that had an estimate when the scheduler took them in
    with JobHistory.open(history_url) as history:
        knowledge: HistoryKnowledge | None = None
        if order == "history":
            seed_history(history, namespace, past)
            knowledge = HistoryKnowledge(history, ttl_seconds=1.0)
            original = knowledge.expected_seconds

            def counted(pod: Mapping[str, Any]) -> float | None:
                found = original(pod)
                name = str(pod["metadata"]["name"])
                if found is not None and pod["metadata"]["namespace"] == namespace and name.endswith("-0"):
                    estimated.add(name)
                return found

            knowledge.expected_seconds = counted  # type: ignore[method-assign]
        options = SchedulerOptions(queue_order="age" if order == "age" else "shortest-expected", knowledge=knowledge)
        with contextlib.ExitStack() as running:
            running.enter_context(own_scheduler(kube, options))
            if order == "history":  # a profiler beside the scheduler, reading a real (empty) Prometheus
                data = scratch / f"{run}-tsdb"
                data.mkdir()
                running.enter_context(profiler(kube, running.enter_context(serve(data)), history_url, namespace,
                                               every))
            done = replay(kube, specs, namespace, timeout)
        filed = sum(1 for job in history.jobs(namespace=namespace, limit=100 * len(specs))
                    if job.outcome == Outcome.SUCCEEDED and not job.uid.startswith("past-"))
    testbed.clear_pods(kube, namespace)
    return Figures(statistics.fmean(done.jct), float(np.percentile(done.jct, 90)), statistics.fmean(done.wait),
                   len(estimated) / len(specs), done.restarts, filed)


def tenants(kube: Kube, spec: Mapping[str, Any] = TENANTS) -> None:
    """The scheduler's tenancy, in the ConfigMap it reads (``kubecell-system/kubecell-tenants``)."""
    kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                       "metadata": {"name": "kubecell-system"}})
    kube.create("/api/v1/namespaces/kubecell-system/configmaps",
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kubecell-tenants"},
                 "data": {"tenants.yaml": json.dumps(spec)}})


@contextmanager
def cluster_on_testbed(cluster: str, scratch: Path, spec: Mapping[str, Any], nodes: int | None = None
                       ) -> Iterator[Kube]:
    """A testbed of ``cluster`` under ``scratch``, told the tenancy ``spec``: yields an admin client; everything
    is stopped at the end."""
    testbed.up(cluster, nodes=nodes, directory=scratch / "testbed", log=lambda line: print(line, file=sys.stderr))
    try:
        state = testbed.status(scratch / "testbed")
        assert state is not None
        kube = Kube.from_kubeconfig(state.admin_kubeconfig)
        try:
            tenants(kube, spec)
            yield kube
        finally:
            kube.close()
    finally:
        testbed.down(scratch / "testbed")


def print_ratios(name: str, rows: Sequence[tuple[Any, Any]], baseline: str, base: Sequence[tuple[Any, Any]]) -> None:
    """Per seed, ``name``'s avg JCT over ``baseline``'s, live (the rows' first figures) and simulated (second)."""
    for label, index in (("live", 0), ("simulated", 1)):
        ratios = [r[index].avg_jct / b[index].avg_jct for r, b in zip(rows, base, strict=True)]
        print(f"  {name} avg JCT / {baseline}'s, {label}: {statistics.fmean(ratios):.3f} "
              f"({', '.join(f'{r:.3f}' for r in ratios)})")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runtimes", type=Path, default=RUNTIMES)
    parser.add_argument("--jobs", type=int, default=80)
    parser.add_argument("--load", type=float, default=1.3)
    parser.add_argument("--seeds", default="0,1,2,3")
    parser.add_argument("--families", type=int, default=12)
    parser.add_argument("--median-seconds", type=float, default=12.0)
    parser.add_argument("--cap-seconds", type=float, default=120.0)
    parser.add_argument("--past-runs", type=int, default=3)
    parser.add_argument("--profile-every", type=float, default=2.0)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds one run may take before it stops")
    args = parser.parse_args()
    if not args.runtimes.is_file():
        print(f"Philly run times absent: {args.runtimes} (see ../shared/data/philly/SOURCE.md)", file=sys.stderr)
        return 2
    if args.jobs < 1 or args.families < 1 or args.past_runs < 0 or not 0 < args.load < 10:
        parser.error("--jobs and --families at least 1, --past-runs at least 0, --load in (0, 10)")
    seeds = [int(part) for part in args.seeds.split(",") if part.strip()]
    pool = runtimes(args.runtimes)
    nodes = synthetic_cluster(NODES, gpus=GPUS_PER_NODE)
    print(f"{args.jobs} jobs in {args.families} families, median run {args.median_seconds:g} s (cap "
          f"{args.cap_seconds:g} s), load {args.load}, {NODES} x {GPUS_PER_NODE} GPUs, 2 VCs, "
          f"{args.past_runs} earlier runs per family, seeds {seeds}")
    rows: dict[str, list[tuple[Figures, Figures]]] = {"age": [], "history": []}
    try:
        binaries()
    except PrometheusMissingError as error:
        print(f"cannot run: {error}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="kubecell-order-") as scratch_dir:
        scratch = Path(scratch_dir)
        with cluster_on_testbed("synthetic", scratch, TENANTS, NODES) as kube:
            print(f"  {'seed':>4s} {'order':8s} {'avg JCT s live':>14s} {'sim':>6s} {'p90 live':>9s} {'sim':>6s} "
                  f"{'avg wait live':>13s} {'sim':>6s} {'restarts':>8s} {'sim':>4s} {'estimated':>9s} {'filed':>5s}")
            for seed in seeds:
                specs = scaled(workload(pool, args.jobs, args.families, SPREAD, args.load, seed),
                               args.median_seconds, args.cap_seconds, args.load, seed)
                past = past_runs(specs, args.past_runs, seed)
                for order in rows:
                    measured = live(kube, specs, order, past, scratch, f"{order}-{seed}", args.profile_every,
                                    args.timeout)
                    simulated = simulate(nodes, specs, order, past)
                    rows[order].append((measured, simulated))
                    print(f"  {seed:4d} {order:8s} {measured.avg_jct:14.1f} {simulated.avg_jct:6.1f} "
                          f"{measured.p90_jct:9.1f} {simulated.p90_jct:6.1f} {measured.avg_wait:13.1f} "
                          f"{simulated.avg_wait:6.1f} {measured.restarts:8d} {simulated.restarts:4d} "
                          f"{measured.estimated:9.0%} {measured.filed:5d}", flush=True)
    print_ratios("history", rows["history"], "age", rows["age"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
