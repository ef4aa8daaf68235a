"""Interference-aware sharing on a real control plane, learned from what a node agent exports, beside the
simulator's figure for the same jobs.

``bench/colocation_sim.py`` measures the admission rules in the simulator. This replays a smaller workload of
the same kind on the testbed (a real API server, kubecell's scheduler) under three rules: blind packing,
Alnair's 70 % rule and ``kubecell + history`` (the adaptive rule whose idle part asks the pair history first,
at the cluster's floor ``MEASURED_FLOOR``). Every piece of the loop runs as on a cluster:

- **The GPUs** are emulated (``testbed.shared_gpus``): a pod bound to a GPU runs its work at the speed Lucid's pair
  table measured for it beside the pod sharing that GPU (alone: solo speed), read from the allocation record
  kubecell's binder wrote, and is marked Succeeded when its work is done. No real GPU is needed, but the speeds
  are measured ones, and who shares with whom is whatever the scheduler decided.
- **The node agent** is emulated with it: each running share pod's ``kubecell_node_gpu_pod_utilization_ratio``,
  ``kubecell_node_gpu_pod_memory_bytes`` and ``kubecell_node_gpu_pod_memory_utilization_ratio`` (labels ``pod``,
  ``namespace``, ``node``, ``gpu``), as the agent exports them under time-slicing: its solo utilization times
  its speed (a job slowed to 0.7x keeps the GPU busy 0.7 of the time it did alone). A real Prometheus scrapes
  them every second. ``--no-controller-series`` leaves the memory controller's series out, as on a node whose
  driver does not sample it: the history then takes each family's compute utilization for it.
- **The profiler** runs a pass every ``--profile-every`` seconds (``profile_jobs`` over the API server's pods,
  against that Prometheus) into a SQLite job history, observing which families shared a GPU and how busy each
  was beside the other and alone (``profiler.pairs``).
- **The scheduler** reads each family's solo profile and the pairs' speeds from that history
  (``HistoryKnowledge``, as ``kubecell scheduler --history`` does), with ``pair_min_seconds`` scaled to the
  replay's time (a pair needs ``--pair-seconds`` of sharing observed before its speed counts).

Each family starts with ``PAST_RUNS`` earlier runs alone in the history (its solo profile: what
``--history`` has for a family the cluster ran last week), and, for the history rule, the pairs a first
workload of the same families (another draw, seed + 1000) taught in the simulator, filed as the profiler files
them (capped at 1: a utilization ratio cannot show a gain). The simulator replays the same jobs with the same
rules, profiles and starting history, its history capped the same way (as the profiler reads it). Its figures
show how much of each rule's effect survives a real cluster's latencies and a history read from series.

The workload is ``sim.colocation.workload``'s (one-GPU jobs asking half a GPU and their solo memory, drawn from
the 40 configurations of the pair table), scaled to seconds: run times are multiplied so that the median job
runs ``--median-seconds`` and capped at ``--cap-seconds``, on 2 nodes of 4 RTX 3090, with Poisson arrivals at
``--load``. The rules are calibrated as the simulator's experiment calibrates them (3 models held out per seed).

    python bench/colocation_live.py [--jobs 80] [--load 1.2] [--seeds 0,1] [--rules blind,...]
                                    [--median-seconds 15] [--cap-seconds 150] [--profile-every 2]
                                    [--pair-seconds 3] [--no-controller-series] [--simulate-only]

Printed per seed and rule: the average and p90 JCT and the average wait, in seconds, live and simulated, the
share of job-time run beside another job, and the pairs the history knew at the end (live: read from the job
history; simulated: the simulator's); then each rule's avg JCT over blind packing's, live and simulated. Needs
Go for the first testbed build (cached afterwards), Debian's ``prometheus`` and the Lucid tables
(``../shared/data/colocation``, non-commercial licence: read at run time, never stored); it says which is
missing and stops. Loopback only; everything it starts is stopped at the end. The jobs run in real time: at the
default 80 jobs, about 5 minutes per seed and rule here.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from kubecell.core.engine.job import JobSpec
from kubecell.core.interference import JobKey, SharedRun, SoloProfile
from kubecell.core.interference.admission import AdmissionRule
from kubecell.core.interference.history import MEASURED_FLOOR, KnownPairs, PairHistory, informed_by_pairs
from kubecell.core.model import Node
from kubecell.core.placement.colocation import usage_of
from kubecell.core.tenancy.config import resolve_tenants
from kubecell.core.topology import CellForest
from kubecell.inputs.colocation import load_shared_runs, load_solo_profiles
from kubecell.kube.names import ANNOTATION_VC, RESOURCE_GPU_MEMORY, RESOURCE_GPU_MILLI
from kubecell.kube.rest import Kube
from kubecell.profiler.distribution import QUANTILES, Distribution
from kubecell.profiler.history import JobHistory, JobRecord, Outcome, SharedUse
from kubecell.profiler.knowledge import HistoryKnowledge
from kubecell.profiler.pairs import ALONE
from kubecell.profiler.recommend import GPU_MEMORY, GPU_UTILIZATION
from kubecell.profiler.sources import GPU_MEMORY_UTILIZATION
from kubecell.scheduler.options import SchedulerOptions, engine_options
from kubecell.sim.colocation.experiment import WARM_SEED, ExperimentConfig, calibrate
from kubecell.sim.colocation.speeds import PairSpeeds
from kubecell.sim.colocation.workload import SHARE_MILLI, VC, WorkloadSpec, make_workload, paired_configurations
from kubecell.sim.dynamic.simulator import DynamicSimulation
from kubecell.testbed import testbed
from kubecell.testbed.nodes import load_cluster_nodes
from kubecell.testbed.prometheus import PrometheusMissingError, binaries, serve
from kubecell.testbed.replay import own_scheduler
from kubecell.testbed.shared_gpus import EmulatedShare, SharedGpus, metrics_endpoint
from queue_order_live import cluster_on_testbed, pod_name, print_ratios, profiler, replay

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "colocation"
NODES, GPUS_PER_NODE, GPU_MODEL = 2, 4, "RTX3090"
GPUS = NODES * GPUS_PER_NODE
CLUSTER = (f"nodeGroups:\n  - count: {NODES}\n    namePrefix: share-\n    gpu: {{model: {GPU_MODEL}, count: "
           f"{GPUS_PER_NODE}}}\n    cpuMilli: 64000\n    memoryMiB: 262144\n")
TENANTS = {"virtualClusters": {VC: {"gpus": GPUS}}}
RULES = ("blind", "alnair 70 %", "kubecell + history")
PAST_RUNS = 3
"""Earlier runs alone filed per family: the history gives a solo profile from 3 finished runs, its utilization
read from their time alone (``HistoryKnowledge``), so the replay's shared runs do not move it."""
ALONE_SECONDS = 600.0
"""How long each earlier run ran alone (its solo baseline for the pairs)."""
MIB = 1 << 20


@dataclass(frozen=True)
class Figures:
    avg_jct: float
    p90_jct: float
    avg_wait: float
    shared: float
    """Share of job-time run beside another job."""
    pairs: int
    """Ordered pairs whose speed the history knew at the end (every rule's history learns; only ``kubecell +
    history`` asks it)."""


NOT_RUN = Figures(math.nan, math.nan, math.nan, math.nan, 0)
"""The live figures of a ``--simulate-only`` run."""


class Capped(PairHistory):
    """The simulator's pair history as the profiler reads one: each observed speed capped at 1 (a utilization
    ratio beside a partner over alone cannot show a gain), and unknown until observed for ``min_seconds``
    (``--pair-seconds``); ``observed`` keeps what it was told, for seeding the live history with the same pairs."""

    def __init__(self, min_seconds: float) -> None:
        super().__init__()
        self.min_seconds = min_seconds
        self.observed: dict[tuple[JobKey, JobKey], tuple[float, float]] = {}

    def speed(self, own: JobKey, partner: JobKey) -> float | None:
        return super().speed(own, partner) if self.seconds(own, partner) >= self.min_seconds else None

    def known(self) -> int:
        return sum(1 for own, partner in self.observed if self.speed(own, partner) is not None)

    def observe(self, own: JobKey, partner: JobKey, speed: float, seconds: float) -> bool:
        capped = min(1.0, speed) if math.isfinite(speed) else speed
        learned = super().observe(own, partner, capped, seconds)
        if learned:
            total, weighted = self.observed.get((own, partner), (0.0, 0.0))
            self.observed[own, partner] = (total + seconds, weighted + capped * seconds)
        return learned


class ByFamily:
    """A ``SpeedModel`` for jobs keyed by their family (``namespace/cNN``, as the history keys them): the
    measured speeds of the configurations the families stand for."""

    def __init__(self, speeds: PairSpeeds, true: Mapping[JobKey, SoloProfile]) -> None:
        self.speeds, self.true = speeds, true

    def beside(self, own: JobKey, others: Sequence[JobKey]) -> float:
        return self.speeds.speed_beside(self.true[own], [self.true[other] for other in others])

    def speed(self, job: JobSpec, partners: Sequence[Sequence[JobSpec]]) -> float:
        own = usage_of(job.member).key
        return min((self.beside(own, [usage_of(other.member).key for other in gpu]) for gpu in partners),
                   default=1.0)


@dataclass
class Families:
    """The workload's configurations as job families of one namespace: what the history learns of each
    (``learned``: the solo profile ``HistoryKnowledge`` gives; its memory-controller utilization is the
    measured one where the agent exports it, ``controller``, else its compute's) and what each really is
    (``true``: its measured solo profile, keying the pair table)."""

    namespace: str
    names: list[str]
    learned: dict[str, SoloProfile]
    true: dict[JobKey, SoloProfile]
    controller: bool

    @classmethod
    def of(cls, configurations: Sequence[SoloProfile], namespace: str, controller: bool = True) -> Families:
        names = [f"c{index:02d}" for index in range(len(configurations))]
        learned = {name: SoloProfile(JobKey(f"{namespace}/{name}"), p.gpu_util,
                                     p.gmem_util if controller else p.gpu_util, p.memory_mib)
                   for name, p in zip(names, configurations, strict=True)}
        true = {learned[name].key: p for name, p in zip(names, configurations, strict=True)}
        return cls(namespace, names, learned, true, controller)


def workload(configurations: Sequence[SoloProfile], families: Families, jobs: int, load: float, seed: int,
             median_seconds: float, cap: float) -> list[JobSpec]:
    """The simulator experiment's jobs, in seconds: run times scaled to a ``median_seconds`` median and capped,
    arrivals Poisson at ``load`` on this bench's GPUs; each job carries its family's learned profile."""
    drawn = make_workload(configurations, WorkloadSpec(jobs=jobs, load=load, gpus=GPUS, seed=seed))
    index = {p.key: i for i, p in enumerate(configurations)}
    work = np.array([spec.work for spec in drawn], np.float64)
    work = np.clip(work * median_seconds / float(np.median(work)), 1.0, cap)
    rate = load * GPUS / float(work.mean())
    submits = np.cumsum(np.random.default_rng(seed + 10_000).exponential(1.0 / rate, size=len(drawn)))
    specs = []
    for number, (spec, seconds, submit) in enumerate(zip(drawn, work, submits, strict=True)):
        assert spec.member.profile is not None
        name = families.names[index[spec.member.profile.key]]
        member = replace(spec.member, profile=families.learned[name])
        specs.append(replace(spec, name=f"{name}-{number}", member=member, work=float(seconds),
                             submit_time=float(submit), labels=(("family", name),)))
    return specs


def warm_pairs(rules: Mapping[str, AdmissionRule], speeds: PairSpeeds, configurations: Sequence[SoloProfile],
               families: Families, args: argparse.Namespace, seed: int, nodes: Sequence[Node]
               ) -> dict[tuple[JobKey, JobKey], tuple[float, float]]:
    """What a first workload of the same families (seed + ``WARM_SEED``) teaches the history rule in the
    simulator: per ordered pair, (seconds, speed-seconds), capped as the profiler reads them."""
    earlier = workload(configurations, families, args.jobs, args.load, seed + WARM_SEED, args.median_seconds,
                       args.cap_seconds)
    history = Capped(args.pair_seconds)
    simulate(nodes, earlier, rules, "kubecell + history", history, ByFamily(speeds, families.true))
    return history.observed


def rule_of(rules: Mapping[str, AdmissionRule], name: str, pairs: KnownPairs) -> AdmissionRule:
    if name == "kubecell + history":
        return informed_by_pairs(rules["kubecell adaptive"], pairs, MEASURED_FLOOR)
    return rules[name]


def simulate(nodes: Sequence[Node], specs: Sequence[JobSpec], rules: Mapping[str, AdmissionRule], name: str,
             history: Capped, model: ByFamily) -> Figures:
    """The simulator's run of the same jobs with the same rule and starting history."""
    tenants_ = resolve_tenants(TENANTS, CellForest(list(nodes)))
    options = engine_options(SchedulerOptions(colocation=rule_of(rules, name, history)))
    simulation = DynamicSimulation(list(nodes), tenants_, options, list(specs), sample_seconds=0, speed_model=model,
                                   pair_history=history)
    result = simulation.run()
    tracker = simulation.sharing
    assert tracker is not None
    records = [r for r in result.records if r.completion_time is not None and r.first_start is not None]
    jct = [float(r.completion_time) for r in records]  # type: ignore[arg-type]
    wait = [float(r.first_start - r.submit) for r in records]  # type: ignore[operator]
    total = sum(segment.duration for segment in tracker.segments)
    shared = sum(segment.duration for segment in tracker.segments if segment.shared)
    return Figures(statistics.fmean(jct), float(np.percentile(jct, 90)), statistics.fmean(wait),
                   shared / total if total else 0.0, history.known())


def manifest(spec: JobSpec, attempt: int, namespace: str) -> dict[str, Any]:
    """A pod asking half a GPU and its solo memory; no run time: the emulated GPU decides when it is done."""
    limits = {RESOURCE_GPU_MILLI: str(SHARE_MILLI), RESOURCE_GPU_MEMORY: str(spec.member.gpu_memory_mib)}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name(spec, attempt), "namespace": namespace,
                         "annotations": {ANNOTATION_VC: spec.vc}},
            "spec": {"schedulerName": "kubecell", "terminationGracePeriodSeconds": 0, "restartPolicy": "Never",
                     "containers": [{"name": "main", "image": "replay",
                                     "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": limits}}]}}


def seed_history(history: JobHistory, families: Families, pairs: Mapping[tuple[JobKey, JobKey], tuple[float, float]]
                 ) -> None:
    """File each family's earlier runs alone (its solo profile and baseline), and on the first of them the pairs
    ``pairs`` holds, as the profiler files what it observed (busy seconds beside a partner: the solo busy
    fraction times the speed)."""
    start = datetime.now(UTC) - timedelta(days=1)
    for name in families.names:
        learned = families.learned[name]
        util, memory, controller = learned.gpu_util / 100.0, learned.memory_mib * MIB, learned.gmem_util / 100.0
        beside = [SharedUse(str(partner), seconds, util * weighted)
                  for (own, partner), (seconds, weighted) in sorted(pairs.items(), key=str) if own == learned.key]
        for run in range(PAST_RUNS):
            begun = start + timedelta(minutes=20 * run)
            metrics = {GPU_UTILIZATION: Distribution((util,) * len(QUANTILES), util, 600, ALONE_SECONDS),
                       GPU_MEMORY: Distribution((memory,) * len(QUANTILES), memory, 600, ALONE_SECONDS)}
            if families.controller:
                metrics[GPU_MEMORY_UTILIZATION.name] = Distribution((controller,) * len(QUANTILES), controller, 600,
                                                                    ALONE_SECONDS)
            sharing = (SharedUse(ALONE, ALONE_SECONDS, util * ALONE_SECONDS), *(beside if run == 0 else ()))
            history.save(JobRecord(
                uid=f"past-{name}-{run}", namespace=families.namespace, owner_kind="Pod",
                owner_name=f"{name}-past{run}", family=name, vc=VC, created=begun, started=begun,
                finished=begun + timedelta(seconds=ALONE_SECONDS), outcome=Outcome.SUCCEEDED, gpus_per_pod=1,
                milli_gpu_per_pod=SHARE_MILLI, gpu_memory_mib_per_pod=math.ceil(learned.memory_mib),
                metrics=metrics, sharing=sharing))


def live(kube: Kube, specs: Sequence[JobSpec], rules: Mapping[str, AdmissionRule], name: str, families: Families,
         model: ByFamily, pairs: Mapping[tuple[JobKey, JobKey], tuple[float, float]], scratch: Path, run: str,
         args: argparse.Namespace) -> Figures:
    namespace = families.namespace
    kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    history_url = f"sqlite:///{scratch / f'{run}.db'}"
    registry = CollectorRegistry()
    jobs = {spec.name: spec for spec in specs}

    def share(pod: str) -> EmulatedShare[JobKey] | None:
        spec = jobs.get(pod.rsplit("-", 1)[0])  # ``c07-12-0``: job ``c07-12``, attempt 0
        if spec is None:
            return None
        true = model.true[usage_of(spec.member).key]
        return EmulatedShare(spec.work, usage_of(spec.member).key, true.gpu_util / 100.0, true.memory_mib * MIB,
                             true.gmem_util / 100.0 if families.controller else None)

    gpus = SharedGpus(kube, namespace, share, model.beside, registry)
    with JobHistory.open(history_url) as history:
        seed_history(history, families, pairs if name == "kubecell + history" else {})
        knowledge = HistoryKnowledge(history, ttl_seconds=1.0, pair_min_seconds=args.pair_seconds)
        options = SchedulerOptions(colocation=rule_of(rules, name, knowledge), knowledge=knowledge)
        data = scratch / f"{run}-tsdb"
        data.mkdir()
        with contextlib.ExitStack() as running:
            target = running.enter_context(metrics_endpoint(registry))
            url = running.enter_context(serve(data, scrape=[target]))
            running.enter_context(own_scheduler(kube, options))
            running.enter_context(gpus.running())
            running.enter_context(profiler(kube, url, history_url, namespace, args.profile_every))
            done = replay(kube, specs, namespace, args.timeout, make=manifest)
        if gpus.failures:
            print(f"  emulated GPUs: {len(gpus.failures)} failed ticks, first: {gpus.failures[0]!r}", file=sys.stderr)
        known = sum(1 for own in families.learned.values() for partner in families.learned.values()
                    if knowledge.speed(own.key, partner.key) is not None)
    testbed.clear_pods(kube, namespace)
    return Figures(statistics.fmean(done.jct), float(np.percentile(done.jct, 90)), statistics.fmean(done.wait),
                   gpus.shared_seconds / gpus.run_seconds if gpus.run_seconds else 0.0, known)


def load_tables(pairs: Path, solo: Path) -> tuple[list[SharedRun], dict[JobKey, SoloProfile]]:
    solos = load_solo_profiles(solo)
    return load_shared_runs(pairs, solos), solos


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--pairs", type=Path, default=DATA / "lucid_colocate_pairs.csv")
    parser.add_argument("--solo", type=Path, default=DATA / "lucid_single_data.csv")
    parser.add_argument("--jobs", type=int, default=80)
    parser.add_argument("--load", type=float, default=1.2)
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--rules", default=",".join(RULES), help=f"a comma-separated subset of {', '.join(RULES)}")
    parser.add_argument("--median-seconds", type=float, default=15.0)
    parser.add_argument("--cap-seconds", type=float, default=150.0)
    parser.add_argument("--profile-every", type=float, default=2.0)
    parser.add_argument("--pair-seconds", type=float, default=3.0,
                        help="observed sharing a pair needs before its speed counts (the profiler's 300 s, scaled)")
    parser.add_argument("--no-controller-series", action="store_true",
                        help="the agent exports no memory-controller utilization (a driver that does not sample it): "
                             "the history takes each family's compute utilization for it")
    parser.add_argument("--simulate-only", action="store_true",
                        help="the simulator's figures only, in seconds (live columns nan): a preview of a setting")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds one run may take before it stops")
    args = parser.parse_args()
    rules_asked = [part.strip() for part in args.rules.split(",") if part.strip()]
    if not rules_asked or any(rule not in RULES for rule in rules_asked):
        parser.error(f"--rules {args.rules!r}: choose among {', '.join(RULES)}")
    if args.jobs < 1 or not 0 < args.load < 10 or not 0 < args.median_seconds <= args.cap_seconds:
        parser.error("--jobs at least 1, --load in (0, 10), 0 < --median-seconds <= --cap-seconds")
    if not (math.isfinite(args.pair_seconds) and args.pair_seconds >= 0 and args.profile_every > 0):
        parser.error("--pair-seconds at least 0, --profile-every above 0")
    for path in (args.pairs, args.solo):
        if not path.is_file():
            print(f"{path}: not found (the Lucid tables: ../shared/data/colocation/SOURCE.md)", file=sys.stderr)
            return 2
    runs, solos = load_tables(args.pairs, args.solo)
    speeds = PairSpeeds(runs, solos)
    configurations = paired_configurations(runs, solos)
    seeds = [int(part) for part in args.seeds.split(",") if part.strip()]
    print(f"{args.jobs} jobs of {len(configurations)} configurations, median run {args.median_seconds:g} s (cap "
          f"{args.cap_seconds:g} s), load {args.load}, {NODES} x {GPUS_PER_NODE} {GPU_MODEL}, seeds {seeds}, "
          f"a pass every {args.profile_every:g} s, pairs count after {args.pair_seconds:g} s")
    rows: dict[str, list[tuple[Figures, Figures]]] = {rule: [] for rule in rules_asked}
    try:
        if not args.simulate_only:
            binaries()
    except PrometheusMissingError as error:
        print(f"cannot run: {error}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="kubecell-colocation-") as scratch_dir:
        scratch = Path(scratch_dir)
        cluster = scratch / "cluster.yaml"
        cluster.write_text(CLUSTER)
        nodes = load_cluster_nodes(str(cluster))
        testbed_run: contextlib.AbstractContextManager[Kube | None] = (
            contextlib.nullcontext() if args.simulate_only else cluster_on_testbed(str(cluster), scratch, TENANTS))
        with testbed_run as kube:
            print(f"  {'seed':>4s} {'rule':18s} {'avg JCT s live':>14s} {'sim':>6s} {'p90 live':>9s} {'sim':>6s} "
                  f"{'avg wait live':>13s} {'sim':>6s} {'shared live':>11s} {'sim':>5s} {'pairs live':>10s} "
                  f"{'sim':>4s}")
            for seed in seeds:
                rules, _ = calibrate(runs, solos, ExperimentConfig(nodes=NODES, gpus_per_node=GPUS_PER_NODE,
                                                                   seed=seed))
                for rule in rules_asked:
                    run = f"{rule.replace(' + ', '-').replace(' %', '').replace(' ', '-')}-{seed}"
                    families = Families.of(configurations, f"share-{run}", not args.no_controller_series)
                    model = ByFamily(speeds, families.true)
                    specs = workload(configurations, families, args.jobs, args.load, seed, args.median_seconds,
                                     args.cap_seconds)
                    pairs = (warm_pairs(rules, speeds, configurations, families, args, seed, nodes)
                             if rule == "kubecell + history" else {})
                    measured = (NOT_RUN if kube is None
                                else live(kube, specs, rules, rule, families, model, pairs, scratch, run, args))
                    start = Capped(args.pair_seconds)
                    for (own, partner), (seconds, weighted) in pairs.items():
                        start.observe(own, partner, weighted / seconds, seconds)
                    simulated = simulate(nodes, specs, rules, rule, start, model)
                    rows[rule].append((measured, simulated))
                    print(f"  {seed:4d} {rule:18s} {measured.avg_jct:14.1f} {simulated.avg_jct:6.1f} "
                          f"{measured.p90_jct:9.1f} {simulated.p90_jct:6.1f} {measured.avg_wait:13.1f} "
                          f"{simulated.avg_wait:6.1f} {measured.shared:11.0%} {simulated.shared:5.0%} "
                          f"{measured.pairs:10d} {simulated.pairs:4d}", flush=True)
    for rule in rules_asked if "blind" in rows else ():
        if rule != "blind":
            print_ratios(rule, rows[rule], "blind", rows["blind"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
