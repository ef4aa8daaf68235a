"""Gavel (Narayanan et al., OSDI '20) with TunedJobs, as the Sia artifact runs it for its Table 3.

Read from ``siasosp23/artifacts`` (``sia-simulator/gavel.py``, ``policies/max_sum_throughput.py``,
``policies/policy.py``, ``cluster.py``, ``multi_simulator.py``, ``run_experiment.sh``,
``simulator_config.py``); nothing copied. What Sia runs (``--policy=gavel --interval=360``,
``gavel_default_policy = "max_sum_throughput_perf"``):

- **Rounds of 6 minutes** for the whole simulation: jobs run 360 s, then the policy decides again (the
  registry gives this policy its own round length, ``PolicySpec.round_seconds``).
- **Jobs are rigid** (TunedJobs): the workload's GPU count ("scale factor") and global batch, never resized.
- **Throughputs**: iterations per second of each job on each GPU type, its GPUs packed on the fewest nodes,
  at its fixed batch, times Sia's calibration (1 / slowdown); 0.1 where the type has fewer GPUs than the job
  asks for (Sia's ``predict_throughput``). Read from the tables through the job's oracle estimate; any other
  ``GoodputEstimate`` stands in with its goodput at that placement.
- **Allocation**: Gavel's max-sum-throughput LP, re-solved every round over the jobs present: maximise
  ``sum_jt T[j,t] x[j,t]`` with ``x >= 0``, ``sum_t x[j,t] <= 1`` (a job's time fractions) and
  ``sum_j s_j x[j,t] <= W_t`` (GPUs of type t). Note: max *sum* of raw iterations per second, not max-min
  fairness, so fast-iterating jobs (CIFAR-10) win over slow ones (ImageNet), which get what is left.
- **Priorities** (Gavel's round-based mechanism): ``x[j,t] / (time j received on t / time all jobs received on
  t)``, the times starting at half a round per job and type, never reset, jobs that left included; 0 where
  ``x`` is 0. All (job, type) pairs sorted by priority, then ``x``, descending (stable: types in Sia's order,
  then jobs in arrival order); each job is taken at the first pair whose type still has as many free GPUs
  as it asks for (counted per type, not per node); jobs with ``x = 0`` fill what is left in that order.
- **Placement**: per type, the chosen jobs largest first; a job keeps exactly the GPUs it held when none of
  them went to a larger (or earlier kept) job, otherwise it takes the next free GPUs in node order from a
  pointer that only moves forward (so a job can straddle nodes).

Restarts are charged by the simulator as Sia's ``Cluster`` charges them for Gavel: a job suspended, resumed,
moved to another GPU type, or given another shape of replicas per node pays its model's restart delay; a
job moved to other nodes of the same type with the same replicas per node does not
(``PolicySpec.restart_on_move`` is False for this policy).

Approximation: Sia solves the LP with cvxpy's ECOS (interior point) and rounds ``x`` to 5 decimals. The LP's
optimum is mostly not unique here (a workload has some 15 distinct (model, GPUs, batch) jobs among 160, and
identical jobs have identical throughputs); an interior-point solver returns a point inside the optimal face,
which by symmetry gives identical jobs identical shares (that is what time-slices them). Here: identical jobs
are pooled into one class, the class-level LP (a transportation problem: GPUs of each type to classes, value
``T / s`` per GPU) is solved exactly by successive shortest paths, and each class's share is split evenly over
its jobs, then rounded as Sia does. Where two *different* classes tie (the class-level optimum is not unique,
which needs exactly equal value differences between types), this picks a vertex where ECOS would pick an
interior point.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from kubecell.core.elastic.types import ClusterNode, ElasticJobView
from kubecell.sim.elastic.cluster import GPU_KINDS
from kubecell.sim.elastic.estimates import OracleGoodput

ROUND_SECONDS = 360.0
"""Sia's ``--interval`` for Gavel (``run_experiment.sh``)."""
UNFIT_THROUGHPUT = 0.1
"""Sia's throughput for a job on a GPU type that has fewer GPUs than it asks for."""


class GavelPolicy:
    """Gavel's max-sum-throughput policy with its round-based time-slicing (see the module docstring)."""

    name = "gavel"

    def __init__(self, round_seconds: float = ROUND_SECONDS) -> None:
        self.round_seconds = round_seconds
        self.job_time: dict[str, dict[str, float]] = {}
        """Seconds each job has been given on each type, from half a round (Gavel's ``_job_time``)."""
        self.type_time: dict[str, float] = {}
        """Seconds given on each type over all jobs ever seen (Gavel's ``_cluster_time``)."""
        self.workers: dict[str, tuple[int, ...]] = {}
        """GPU slots each job held after the last decision (Gavel's worker ids)."""
        self.throughputs: dict[str, dict[str, float]] = {}

    def allocate(self, now: float, jobs: Sequence[ElasticJobView],
                 nodes: Sequence[ClusterNode]) -> Mapping[str, tuple[str, ...]]:
        if not jobs:
            return {}
        types = sorted({node.gpu_type for node in nodes}, key=_sia_order)
        slots: dict[str, list[list[int]]] = {gpu_type: [] for gpu_type in types}
        slot_node: list[str] = []
        slot_type: list[str] = []
        for node in nodes:
            slots[node.gpu_type].append(list(range(len(slot_node), len(slot_node) + node.gpus)))
            slot_node.extend([node.name] * node.gpus)
            slot_type.extend([node.gpu_type] * node.gpus)
        capacity = {gpu_type: sum(len(server) for server in slots[gpu_type]) for gpu_type in types}
        per_node = {gpu_type: max(len(server) for server in slots[gpu_type]) for gpu_type in types}
        held = self._held(jobs, slots, slot_node)
        for job in jobs:
            if job.name not in self.job_time:
                self.job_time[job.name] = dict.fromkeys(types, self.round_seconds / 2)
                for gpu_type in types:
                    self.type_time[gpu_type] = self.type_time.get(gpu_type, 0.0) + self.round_seconds / 2
            if job.name not in self.throughputs:
                self.throughputs[job.name] = {t: throughput(job, t, per_node[t], capacity[t]) for t in types}

        # The LP and the priorities.
        sizes = np.array([job.max_replicas for job in jobs], dtype=float)
        table = np.array([[self.throughputs[job.name][t] for t in types] for job in jobs], dtype=float)
        share = max_sum_throughput(table, sizes, np.array([capacity[t] for t in types], dtype=float))
        entries: list[tuple[float, float, int, int]] = []
        for ti, gpu_type in enumerate(types):
            for ji, job in enumerate(jobs):
                x = float(share[ji, ti])
                priority = x * self.type_time[gpu_type] / self.job_time[job.name][gpu_type] if x > 0 else 0.0
                entries.append((priority, x, ji, ti))
        entries.sort(key=lambda entry: (entry[0], entry[1]), reverse=True)

        # Which jobs run on which type (free GPUs counted per type).
        free = dict(capacity)
        chosen: dict[str, list[int]] = {gpu_type: [] for gpu_type in types}
        taken: set[int] = set()
        for _, _, ji, ti in entries:
            gpu_type, size = types[ti], jobs[ji].max_replicas
            if ji in taken or free[gpu_type] == 0 or size > free[gpu_type]:
                continue
            free[gpu_type] -= size
            taken.add(ji)
            chosen[gpu_type].append(ji)

        # Which GPUs: keep the old ones where possible, else the next free ones from a forward-only pointer.
        workers: dict[str, tuple[int, ...]] = {}
        for gpu_type in types:
            order = sorted(chosen[gpu_type], key=lambda ji: -jobs[ji].max_replicas)
            servers = [list(server) for server in slots[gpu_type]]
            assigned: set[int] = set()
            pointer = 0
            for size in sorted({jobs[ji].max_replicas for ji in order}, reverse=True):
                group = [jobs[ji] for ji in order if jobs[ji].max_replicas == size]
                for job in group:
                    old = held.get(job.name, ())
                    if old and slot_type[old[0]] == gpu_type and not assigned.intersection(old):
                        workers[job.name] = old
                        assigned.update(old)
                for job in group:
                    if job.name in workers:
                        continue
                    given: list[int] = []
                    while len(given) < size and pointer < len(servers):
                        if not servers[pointer]:
                            pointer += 1
                            continue
                        slot = servers[pointer].pop(0)
                        if slot not in assigned:
                            given.append(slot)
                            assigned.add(slot)
                    if len(given) != size:
                        raise RuntimeError(f"gavel: could not place job {job.name} on {size} {gpu_type} GPUs")
                    workers[job.name] = tuple(given)
            for ji in chosen[gpu_type]:
                self.job_time[jobs[ji].name][gpu_type] += self.round_seconds
                self.type_time[gpu_type] += self.round_seconds
        self.workers = workers
        return {job.name: tuple(slot_node[slot] for slot in workers.get(job.name, ())) for job in jobs}

    def _held(self, jobs: Sequence[ElasticJobView], slots: Mapping[str, list[list[int]]],
              slot_node: Sequence[str]) -> dict[str, tuple[int, ...]]:
        """The GPU slots each job holds now: as remembered where that matches what it holds, else free slots of
        the nodes it holds (a job this policy did not place)."""
        held: dict[str, tuple[int, ...]] = {}
        for job in jobs:
            old = self.workers.get(job.name, ())
            if job.current and sorted(slot_node[slot] for slot in old) == sorted(job.current):
                held[job.name] = old
        used = {slot for kept in held.values() for slot in kept}
        node_slots: dict[str, list[int]] = {}
        for servers in slots.values():
            for server in servers:
                node_slots[slot_node[server[0]]] = server
        for job in jobs:
            if job.current and job.name not in held:
                picked: list[int] = []
                for name in job.current:
                    slot = next(s for s in node_slots[name] if s not in used)
                    used.add(slot)
                    picked.append(slot)
                held[job.name] = tuple(picked)
        return held


def _sia_order(gpu_type: str) -> str:
    """Sia orders GPU types by its profile names (``aws``, ``dgx-ext``, ``rtx``); unknown types by name."""
    kind = GPU_KINDS.get(gpu_type)
    return kind.profile if kind is not None else gpu_type


def packed(size: int, per_node: int) -> tuple[int, ...]:
    """``size`` replicas on the fewest nodes of ``per_node`` GPUs (``10, 4`` -> 4, 4, 2)."""
    full, rest = divmod(size, per_node)
    return (per_node,) * full + ((rest,) if rest else ())


def throughput(job: ElasticJobView, gpu_type: str, per_node: int, capacity: int) -> float:
    """Iterations per second of a rigid job on ``gpu_type``, packed, at its fixed batch, calibrated (Sia's
    ``GavelPolicy.predict_throughput``); ``UNFIT_THROUGHPUT`` where the type has too few GPUs."""
    size = job.max_replicas
    if size > capacity:
        return UNFIT_THROUGHPUT
    placement = packed(size, per_node)
    estimate = job.estimate
    if isinstance(estimate, OracleGoodput) and estimate.fixed_batch is not None:
        app = estimate.app
        if gpu_type not in app.throughput:
            return 0.0
        batch = app.fixed_batch(gpu_type, placement, estimate.fixed_batch)
        times = app.iteration_time(gpu_type, placement, batch) if batch is not None else None
        return 0.0 if times is None or times[0] <= 0 else 1.0 / times[0] / app.slowdown
    return estimate.goodput(gpu_type, len(placement), size)


def max_sum_throughput(table: np.ndarray, sizes: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Gavel's max-sum-throughput allocation: ``x[j, t]``, the fraction of time job ``j`` should run on type
    ``t``, maximising ``sum(table * x)`` with ``x >= 0``, ``x.sum(1) <= 1``, ``(sizes[:, None] * x).sum(0) <=
    capacity``; identical jobs (same size and throughputs) get identical shares; rounded to 5 decimals as Sia
    does. Exact (successive shortest paths on the class-level transportation problem, see the module
    docstring)."""
    jobs, kinds = table.shape
    classes: dict[tuple[float, ...], list[int]] = {}
    for j in range(jobs):
        classes.setdefault((float(sizes[j]), *map(float, table[j])), []).append(j)
    members = list(classes.values())
    supply = np.array([len(group) * sizes[group[0]] for group in members])
    value = np.array([table[group[0]] / sizes[group[0]] for group in members]).reshape(len(members), kinds)
    flow = _transport(supply, capacity.astype(float), value)
    share = np.zeros((jobs, kinds))
    for c, group in enumerate(members):
        share[group] = flow[c] / supply[c] if supply[c] > 0 else 0.0
    return np.clip(share.round(5), 0.0, 1.0)


def _transport(supply: np.ndarray, capacity: np.ndarray, value: np.ndarray) -> np.ndarray:
    """GPUs of each type (``capacity``) to classes (at most ``supply`` each) maximising ``sum(value * flow)``:
    successive most-profitable augmenting paths (Bellman-Ford on the residual graph, whose only negative
    edges are class -> type at ``-value``), stopping when no path gains. Integral capacities give an integral
    optimum after at most a few dozen augmentations."""
    n_class, n_type = value.shape
    flow = np.zeros((n_class, n_type))
    sent = np.zeros(n_class)
    load = np.zeros(n_type)
    eps = 1e-12 * max(1.0, float(np.abs(value).max(initial=0.0)))
    source, sink = 0, 1 + n_class + n_type
    for _ in range(4 * (n_class + n_type) * (n_class + n_type + 2)):
        # edges: (from, to, cost, residual)
        edges: list[tuple[int, int, float, float]] = []
        for c in range(n_class):
            if sent[c] < supply[c]:
                edges.append((source, 1 + c, 0.0, supply[c] - sent[c]))
            if sent[c] > 0:
                edges.append((1 + c, source, 0.0, sent[c]))
            for t in range(n_type):
                edges.append((1 + c, 1 + n_class + t, -value[c, t], math.inf))
                if flow[c, t] > 0:
                    edges.append((1 + n_class + t, 1 + c, value[c, t], flow[c, t]))
        for t in range(n_type):
            if load[t] < capacity[t]:
                edges.append((1 + n_class + t, sink, 0.0, capacity[t] - load[t]))
            if load[t] > 0:
                edges.append((sink, 1 + n_class + t, 0.0, load[t]))
        dist = [math.inf] * (sink + 1)
        back: list[int | None] = [None] * (sink + 1)
        dist[source] = 0.0
        for _ in range(sink):
            moved = False
            for index, (a, b, cost, _) in enumerate(edges):
                if dist[a] + cost < dist[b] - eps:
                    dist[b] = dist[a] + cost
                    back[b] = index
                    moved = True
            if not moved:
                break
        if dist[sink] >= -eps:
            return flow
        path: list[int] = []
        node = sink
        while node != source:
            index = back[node]
            assert index is not None
            path.append(index)
            node = edges[index][0]
        amount = min(edges[index][3] for index in path)
        for index in path:
            a, b, _, _ = edges[index]
            if a == source:
                sent[b - 1] += amount
            elif b == source:
                sent[a - 1] -= amount
            elif b == sink:
                load[a - 1 - n_class] += amount
            elif a == sink:
                load[b - 1 - n_class] -= amount
            elif a <= n_class:
                flow[a - 1, b - 1 - n_class] += amount
            else:
                flow[b - 1, a - 1 - n_class] -= amount
    raise RuntimeError("gavel: the allocation did not converge")
