"""The round loop of the elastic simulator: any ``ElasticPolicy`` over a workload on a cluster of ``ClusterNode``.

The order within a round is Sia's (``sia-simulator/cluster.py``, ``Cluster.step``): every job runs for the
round (60 s, or the policy's own ``PolicySpec.round_seconds``: Gavel's 360 s) on what it was given, then the
clock moves on, then the policy decides for every job that has arrived and is not done, and the changes take
effect (a changed allocation costs its restart delay at the start of the next round, except a same-shape move
within a GPU type for a policy registered with ``restart_on_move=False``, as Sia charges Gavel). So a job
arriving at 107 s is first considered at 120 s, and a job finishing within a round holds its GPUs to the
round's end. With ``handover_seconds`` above 0, a GPU one job gives up in a round reaches the job it is given to
only that much later (see ``_handover``). The policy sees each job through an ``ElasticJobView``
only; the simulator checks its answer (known jobs and nodes, one GPU type per job, sizes within the job's
bounds, never more replicas on a node than it has GPUs) and stops with a clear error when it is broken.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kubecell.core.elastic.types import ClusterNode, ElasticJobView, StepReport
from kubecell.core.errors import KubecellError
from kubecell.sim.elastic.applications import ApplicationModel, Batch
from kubecell.sim.elastic.cluster import kinds_of
from kubecell.sim.elastic.estimates import JobEstimate, OracleGoodput, online_estimate
from kubecell.sim.elastic.job import SimJob
from kubecell.sim.elastic.policies import PolicySpec
from kubecell.sim.elastic.workload import Workload

ROUND_SECONDS = 60.0
"""Sia's scheduling interval for Sia and Pollux (``--interval=60``)."""
DEFAULT_MAX_HOURS = 1000.0
MAX_HANDOVER_SECONDS = 3600.0
"""The longest handover a run accepts: an hour of grace is no cluster's setting, and beyond it a typo."""


class SimulationError(KubecellError):
    """A run that cannot go on: a policy broke its contract, or the simulated time ran out."""


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One job's outcome."""

    name: str
    application: str
    submitted: float
    num_replicas: int
    batch_size: int
    first_start: float | None
    completion: float | None
    restarts: int
    gpu_seconds: float
    """GPU-seconds held (restart delays included, to the end of the round it finished in)."""
    restart_gpu_seconds: float
    max_gpus: int
    """Most GPUs it held at once."""

    @property
    def jct(self) -> float | None:
        return None if self.completion is None else self.completion - self.submitted


@dataclass(frozen=True, slots=True)
class Sample:
    """The cluster after one round's decision."""

    time: float
    allocated_gpus: int
    running_jobs: int
    waiting_jobs: int


@dataclass(slots=True)
class SimulationResult:
    policy: str
    workload: str
    family: str
    total_gpus: int
    records: list[JobRecord] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    rounds: int = 0
    wall_seconds: float = 0.0


class ElasticSimulator:
    """One policy over one workload (build, then ``run``)."""

    def __init__(self, workload: Workload, apps: Mapping[str, ApplicationModel], nodes: Sequence[ClusterNode],
                 spec: PolicySpec, *, interval: float = ROUND_SECONDS, max_hours: float = DEFAULT_MAX_HOURS,
                 handover_seconds: float = 0.0) -> None:
        if not 0.0 <= handover_seconds <= MAX_HANDOVER_SECONDS:
            raise SimulationError(f"handover_seconds must be within 0..{MAX_HANDOVER_SECONDS:g} seconds, not "
                                  f"{handover_seconds!r}")
        self.workload = workload
        self.handover_seconds = handover_seconds
        """How long a GPU that one job gives up stays unusable for the job given it: on a cluster the giver's
        workers are deleted with their grace period and checkpoint before they exit (0: at once, as Sia's
        simulator and the published figures have it). It is charged with a restart; a same-shape move that a
        policy registered with ``restart_on_move=False`` makes without one is not charged it either."""
        self.spec = spec
        self.policy = spec.make()
        self.nodes = tuple(nodes)
        self.kinds = kinds_of(self.nodes)
        self.node_type = {node.name: node.gpu_type for node in self.nodes}
        self.node_gpus = {node.name: node.gpus for node in self.nodes}
        self.node_order = {node.name: index for index, node in enumerate(self.nodes)}
        if len(self.node_order) != len(self.nodes):
            raise SimulationError("two cluster nodes have the same name")
        self.interval = spec.round_seconds if spec.round_seconds is not None else interval
        self.max_seconds = max_hours * 3600.0
        self.jobs = [SimJob(spec_, apps[spec_.application]) for spec_ in workload.jobs]
        self.estimates: dict[str, JobEstimate] = {}
        self.max_gpus: dict[str, int] = {}
        types = frozenset(kind.gpu_type for kind in self.kinds)
        capacity = Counter[str]()
        for node in self.nodes:
            capacity[node.gpu_type] += node.gpus
        for job in self.jobs:
            if spec.tuned_jobs and job.spec.num_replicas > max(capacity.values()):
                raise SimulationError(f"job {job.name} of {workload.label} asks for {job.spec.num_replicas} GPUs; "
                                      f"no GPU type of this cluster has that many ({dict(capacity)})")
            self.estimates[job.name] = self._estimate(job)
            self.max_gpus[job.name] = 0
        self.types = types

    def _estimate(self, job: SimJob) -> JobEstimate:
        if self.spec.estimate == "online":
            return online_estimate(job.app, self.kinds)
        if self.spec.estimate == "online-true-noise":
            return online_estimate(job.app, self.kinds, true_noise_epoch=lambda: job.epoch)
        fixed = job.spec.batch_size if self.spec.tuned_jobs else None
        return OracleGoodput(job.app, fixed_batch=fixed, epoch=lambda: job.epoch)

    # ------------------------------------------------------------------ the policy's view and answer
    def _view(self, job: SimJob) -> ElasticJobView:
        if self.spec.tuned_jobs:
            low = high = job.spec.num_replicas
        else:
            low, high = 1, job.app.max_replicas
        return ElasticJobView(name=job.name, submitted=job.spec.submitted, min_replicas=low, max_replicas=high,
                              current=job.nodes, last_resize=job.last_resize, attained_gpu_seconds=job.gpu_seconds,
                              restart_seconds=job.app.restart_seconds, estimate=self.estimates[job.name],
                              gpu_types=self.types)

    def _check(self, now: float, decision: Mapping[str, tuple[str, ...]], views: Mapping[str, ElasticJobView],
               held: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        where = f"policy {self.spec.name} at {now / 3600:.2f} h on {self.workload.label}"
        after = dict(held)
        for name, given in decision.items():
            view = views.get(name)
            if view is None:
                raise SimulationError(f"{where}: allocated {name!r}, which is not a waiting or running job")
            nodes = tuple(given)
            unknown = sorted({node for node in nodes if node not in self.node_type})
            if unknown:
                raise SimulationError(f"{where}: job {name} on unknown node(s) {', '.join(unknown)}")
            types = {self.node_type[node] for node in nodes}
            if len(types) > 1:
                raise SimulationError(f"{where}: job {name} mixes GPU types {sorted(types)}; a job runs on one type")
            if nodes and not view.min_replicas <= len(nodes) <= view.max_replicas:
                raise SimulationError(f"{where}: job {name} given {len(nodes)} replicas; it takes "
                                      f"{view.min_replicas}..{view.max_replicas} (or none)")
            after[name] = nodes
        used = Counter(node for nodes in after.values() for node in nodes)
        for node, count in used.items():
            if count > self.node_gpus[node]:
                holders = sorted(name for name, nodes in after.items() if node in nodes)
                raise SimulationError(f"{where}: {count} replicas on node {node}, which has {self.node_gpus[node]} "
                                      f"GPUs (jobs {', '.join(holders)})")
        return after

    def placement(self, nodes: Sequence[str]) -> tuple[int, ...]:
        """Replicas per node, nodes in cluster order (Sia's node-index order)."""
        counts = Counter(nodes)
        return tuple(counts[name] for name in sorted(counts, key=self.node_order.__getitem__))

    # ------------------------------------------------------------------ batches and measurements
    def _batch(self, job: SimJob) -> Batch:
        assert job.gpu_type is not None
        app, gpu, placement = job.app, job.gpu_type, job.placement
        if self.spec.tuned_jobs:
            batch = app.fixed_batch(gpu, placement, job.spec.batch_size)
        else:
            advice = self.estimates[job.name].best_batch(gpu, len(placement), sum(placement))
            batch = (app.settle(gpu, placement, advice[0], advice[1] - 1) if advice
                     else app.initial_batch(gpu, placement))
        if batch is None:
            raise SimulationError(f"policy {self.spec.name}: job {job.name} ({app.name}) on {sum(placement)} replicas "
                                  f"cannot run: even the smallest per-replica batch exceeds its largest global batch "
                                  f"{app.max_bsz}")
        return batch

    def _report(self, job: SimJob) -> StepReport | None:
        """What the job measured this round (Sia's ``update_params``: the table's step and sync time at its
        placement and micro-batch, uncalibrated, and the gradient statistics of its epoch)."""
        if job.gpu_type is None or job.batch is None:
            return None
        times = job.app.throughput[job.gpu_type].times(job.placement, job.batch.atomic_bsz)
        if times is None:
            return None
        sqr, var = job.app.grad_stats(job.batch.global_bsz, job.epoch)
        return StepReport(gpu_type=job.gpu_type, num_nodes=len(job.placement), num_replicas=sum(job.placement),
                          local_bsz=job.batch.atomic_bsz, step_time=times[0], sync_time=times[1], grad_sqr=sqr,
                          grad_var=var)

    # ------------------------------------------------------------------ the loop
    def run(self) -> SimulationResult:
        started = time.perf_counter()
        result = SimulationResult(self.spec.name, self.workload.label, self.workload.family,
                                  sum(self.node_gpus.values()))
        arrivals = sorted(self.jobs, key=lambda j: (j.spec.submitted, j.name))
        arrived = 0
        active: list[SimJob] = []
        now = 0.0
        online = self.spec.estimate != "oracle"
        while True:
            for job in active:
                if job.running:
                    job.advance(now, self.interval)
                    if online and job.ran_seconds > 0 and not job.done:
                        report = self._report(job)
                        if report is not None:
                            self.estimates[job.name].observe(report)
            now += self.interval
            result.rounds += 1
            active = [job for job in active if not job.done]
            while arrived < len(arrivals) and arrivals[arrived].spec.submitted <= now:
                active.append(arrivals[arrived])
                arrived += 1
            if not active and arrived == len(arrivals):
                break
            if now > self.max_seconds:
                raise SimulationError(
                    f"policy {self.spec.name} on {self.workload.label}: {len(active) + len(arrivals) - arrived} of "
                    f"{len(arrivals)} jobs unfinished after {self.max_seconds / 3600:g} simulated hours; raise "
                    "--max-hours if the cluster is simply too small, else the policy leaves jobs waiting forever")
            if active:
                self._decide(now, active)
            allocated = sum(len(job.nodes) for job in active)
            running = sum(1 for job in active if job.nodes)
            result.samples.append(Sample(now, allocated, running, len(active) - running))
        result.records = [self._record(job) for job in self.jobs]
        result.wall_seconds = time.perf_counter() - started
        return result

    def _decide(self, now: float, active: Sequence[SimJob]) -> None:
        views = {job.name: self._view(job) for job in active}
        decision = self.policy.allocate(now, list(views.values()), self.nodes)
        held = {job.name: job.nodes for job in active}
        after = self._check(now, decision, views, held)
        waiting = self._handover(held, after) if self.handover_seconds > 0 else frozenset()
        for job in active:
            nodes = after[job.name]
            gpu_type = self.node_type[nodes[0]] if nodes else None
            placement = self.placement(nodes)
            if (not self.spec.restart_on_move and nodes and job.nodes and gpu_type == job.gpu_type
                    and placement == job.placement):
                job.nodes, changed = nodes, False    # Sia's Cluster: same type and shape, no restart
            else:
                changed = job.reallocate(now, gpu_type, nodes, placement)
            if changed and job.name in waiting and job.nodes:
                job.restart_left += self.handover_seconds
            if job.nodes and (changed or not self.spec.tuned_jobs or job.batch is None):
                job.set_batch(self._batch(job))
            self.max_gpus[job.name] = max(self.max_gpus[job.name], len(job.nodes))

    def _handover(self, held: Mapping[str, tuple[str, ...]], after: Mapping[str, tuple[str, ...]]) -> frozenset[str]:
        """The jobs that wait for GPUs another job gives up this round: every job given more replicas on a node
        than that node had idle GPUs for all the jobs given replicas there. An upper bound: which job gets the
        idle GPUs and which the handed-over ones is the placement's choice, and it is charged to all of them;
        a gang starts only when its last member is bound, so one such member delays the whole job."""
        before = Counter(node for nodes in held.values() for node in nodes)
        gains: dict[str, Counter[str]] = {}
        for name, nodes in after.items():
            gained = Counter(nodes) - Counter(held.get(name, ()))
            if gained:
                gains[name] = gained
        wanted = Counter[str]()
        for gained in gains.values():
            wanted.update(gained)
        short = {node for node, count in wanted.items() if count > self.node_gpus[node] - before[node]}
        return frozenset(name for name, gained in gains.items() if short.intersection(gained))

    def _record(self, job: SimJob) -> JobRecord:
        return JobRecord(name=job.name, application=job.app.name, submitted=job.spec.submitted,
                         num_replicas=job.spec.num_replicas, batch_size=job.spec.batch_size,
                         first_start=job.first_start, completion=job.completion, restarts=job.restarts,
                         gpu_seconds=job.gpu_seconds, restart_gpu_seconds=job.restart_gpu_seconds,
                         max_gpus=self.max_gpus[job.name])


def simulate(workload: Workload, apps: Mapping[str, ApplicationModel], nodes: Sequence[ClusterNode],
             spec: PolicySpec, *, interval: float = ROUND_SECONDS, max_hours: float = DEFAULT_MAX_HOURS,
             handover_seconds: float = 0.0) -> SimulationResult:
    """Run one policy over one workload."""
    return ElasticSimulator(workload, apps, nodes, spec, interval=interval, max_hours=max_hours,
                            handover_seconds=handover_seconds).run()
