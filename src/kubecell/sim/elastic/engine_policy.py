"""The cluster's decision path in the elastic simulator (``kubecell``): the core ``Engine`` admits, places and
takes back members of the jobs as elastic gangs, and ``core.elastic.targets`` sizes them, moves them between GPU
types and chooses where they start, as the Kubernetes scheduler does with ElasticJobs (``scheduler.elastic``).
So the figures ``kubecell sim elastic`` reports for ``kubecell`` are those of the path a cluster runs; the
``kubecell-allocator`` run measures the allocator alone with the authority of the whole cluster, and
``kubecell-no-moves`` the same path with every job kept on the type it was first given.

What it reproduces: an ElasticJob is a gang of one-GPU members whose headcount is its maximum and whose
minimum is its minimum; its members run on one GPU type (the engine job accepts only that type). It is
submitted on a first type (``targets.start_type``: where its minimum is idle, as the cluster's intake pins a
gang that forms) with pods for its minimum (``Engine.limit_growth``). Every round the allocator sizes the
running jobs and the waiting ones together, as the cluster's sizer does: a running job grows into the
engine's headroom and into members other jobs of the VC give up for it (their controllers delete the newest
workers at once here: ``Engine.release_members``), or moves to another type where its minimum is idle now
(``Engine.queries.room_on``; its workers restart there: a new engine job on that type, as its new pods form a new gang
on a cluster); a waiting job is started on the type the allocator chooses, counting on what others give. A
running job without a goodput model takes the room. A job that needs its minimum takes back members others
grew (the engine's rule). The engine's resize interval holds. One VC holds the whole cluster. Each job's
restart cost is its own, as an ElasticJob states it in ``spec.restartSeconds`` (without it the cluster
charges 30 s).

What it leaves out: pods and their controller (a raised target is bound in the same round, and a moved job's
workers are gone at once: creating, binding and ending pods takes seconds, a round is 60 s, and the
restart delay is charged as for any change), and step reports (each job's model is fed by the simulator).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace

from kubecell.core.elastic.allocator import ElasticOptions, KubecellElasticPolicy
from kubecell.core.elastic.targets import (
    GrowthChoice,
    engine_candidate,
    plan_targets,
    start_type,
    take_the_room,
)
from kubecell.core.elastic.types import ClusterNode, ElasticJobView
from kubecell.core.engine.engine import Engine
from kubecell.core.engine.job import JobPhase, JobSpec
from kubecell.core.engine.options import PRESETS
from kubecell.core.engine.shrink import shrinkable
from kubecell.core.model import MILLI_PER_GPU, Request, make_node
from kubecell.core.tenancy.config import resolve_tenants
from kubecell.core.topology import CellForest

VC = "default"
GPU_MEMORY_MIB = 16_384
"""The elastic simulator's types are its own names (``t4``, ``rtx``, ``dgx``), not catalog models; whole-GPU
members never look at GPU memory, so any amount will do."""


class EngineSizedPolicy:
    """An ``ElasticPolicy`` that decides through the core engine (see the module)."""

    name = "kubecell"

    def __init__(self, resize_interval_seconds: float | None = None, *, moves: bool = True,
                 options: ElasticOptions | None = None) -> None:
        self.resize_interval_seconds = resize_interval_seconds
        """The engine's ``resize_min_interval_seconds`` (None: the preset's, as a cluster runs it)."""
        self.moves = moves
        """Jobs may be moved to another GPU type, and waiting jobs started on the type the allocator chooses
        (False: each keeps the type it was given at submission)."""
        self.engine: Engine | None = None
        self.sizers: dict[str, KubecellElasticPolicy] = {}
        """Size the jobs per VC, as the cluster's sizer does (each keeps restart counts and prices)."""
        self.options = options
        """The sizers' knobs (None: the defaults a cluster runs)."""
        self.last_reasons: dict[str, str] = {}
        self.live: dict[str, str] = {}
        """Each job's engine job: a job moved to another type (or re-pinned while it waits) is a new engine
        job, as its workers are new pods on a cluster."""
        self.pinned: dict[str, str] = {}
        """The type each job's engine job is restricted to."""
        self.generations: Counter[str] = Counter()

    def allocate(self, now: float, jobs: Sequence[ElasticJobView],
                 nodes: Sequence[ClusterNode]) -> Mapping[str, tuple[str, ...]]:
        engine = self.engine or self._build(nodes)
        views = {view.name: view for view in jobs}
        for name in [name for name in self.live if name not in views]:
            if engine.jobs[self.live[name]].phase in (JobPhase.RUNNING, JobPhase.RESERVED):
                engine.finish(self.live[name], now)
            del self.live[name]
            self.pinned.pop(name, None)
        new = [view for view in jobs if view.name not in self.live]
        if new:
            types = self._types(engine, new, nodes)
            for view in sorted(new, key=lambda v: (v.submitted, v.name)):
                self._submit(engine, view, types[view.name], view.min_replicas, now)
        kinds = sorted({node.gpu_type for node in nodes if node.gpus > 0})
        for name, choice in self._sizing(engine, views, kinds, now).items():
            self.last_reasons[name] = choice.reason
            job = engine.jobs[self.live[name]]
            if choice.gpu_type is not None and choice.gpu_type != self.pinned[name]:
                # moved (its workers restart on the other type) or started where the allocator chose
                engine.cancel(job.name, now)
                self._submit(engine, views[name], choice.gpu_type, choice.target, now)
                continue
            if job.phase == JobPhase.PENDING:
                engine.limit_growth(job.name, (max(choice.target, job.spec.minimum),))
                continue
            if choice.target < job.size:  # its controller deletes its newest workers at once
                engine.release_members(job.name, job.running_members[choice.target:], now, choice.reason)
            engine.limit_growth(job.name, (max(choice.target - job.size, 0),))
        engine.schedule(now)
        for job in list(engine.running.values()):
            if job.phase == JobPhase.RESERVED:  # the preempted members' pods are gone at once here
                engine.confirm(job.name, now)
        decision: dict[str, tuple[str, ...]] = {}
        for name in views:
            job = engine.jobs[self.live[name]]
            decision[name] = (tuple(a.node for a in engine.queries.allocations_of(job.name))
                              if job.phase == JobPhase.RUNNING else ())
            if job.phase == JobPhase.RUNNING:
                engine.limit_growth(job.name, (0,))  # pods the cycle did not bind are given back
        return decision

    def _submit(self, engine: Engine, view: ElasticJobView, gpu_type: str, pods: int, now: float) -> None:
        """A new engine job for ``view`` on ``gpu_type``, with pods for ``pods`` members (at least its minimum)."""
        self.generations[view.name] += 1
        name = f"{view.name}#{self.generations[view.name]}"
        member = Request(name=name, gpu_count=1, gpu_milli=MILLI_PER_GPU, gpu_models=frozenset({gpu_type}))
        engine.submit(JobSpec(name=name, vc=VC, member=member, members=view.max_replicas,
                              min_members=view.min_replicas, submit_time=view.submitted), now)
        engine.limit_growth(name, (max(pods, view.min_replicas),))  # the controller made pods for these
        self.live[view.name] = name
        self.pinned[view.name] = gpu_type

    def _build(self, nodes: Sequence[ClusterNode]) -> Engine:
        core = [make_node(node.name, cpu_milli=node.gpus * 16_000, memory_mib=node.gpus * 65_536,
                          gpu_count=node.gpus, gpu_model=node.gpu_type, gpu_memory_mib=GPU_MEMORY_MIB)
                for node in nodes]
        forest = CellForest(core)
        chain_of = {(chain.model, chain.node_gpus): name for name, chain in forest.chains.items()}
        cells = Counter(f"{chain_of[node.gpu_type, node.gpus]}/node" for node in nodes if node.gpus > 0)
        tenants = resolve_tenants({"virtualClusters": {VC: {"cells": dict(cells)}}}, forest)
        options = PRESETS["kubecell"]
        if self.resize_interval_seconds is not None:
            options = options.with_(resize_min_interval_seconds=self.resize_interval_seconds)
        self.engine = Engine(core, tenants, options, forest=forest)
        return self.engine

    def _types(self, engine: Engine, new: Sequence[ElasticJobView], nodes: Sequence[ClusterNode]) -> dict[str, str]:
        """The GPU type each new job is submitted on (``targets.start_type``), in submission order, each taking
        its minimum from the idle GPUs the next one sees."""
        book = engine.book
        idle: Counter[str] = Counter()
        for node in nodes:
            idle[node.gpu_type] += int(book.full_count[book.index[node.name]])
        above: Counter[str] = Counter()
        for job in engine.running.values():
            models = job.spec.member.gpu_models or frozenset()
            if len(models) == 1:
                above[next(iter(models))] += len(shrinkable(job))
        kinds = sorted({node.gpu_type for node in nodes})
        types: dict[str, str] = {}
        for view in sorted(new, key=lambda v: (v.submitted, v.name)):
            allowed = [t for t in kinds if view.gpu_types is None or t in view.gpu_types]
            best = start_type(allowed, idle, above, {t: view.estimate.goodput(t, 1, 1) for t in allowed},
                              view.min_replicas)
            idle[best] -= view.min_replicas
            types[view.name] = best
        return types

    def _sizing(self, engine: Engine, views: Mapping[str, ElasticJobView], kinds: Sequence[str],
                now: float) -> dict[str, GrowthChoice]:
        """What the cluster's sizer decides for the running and waiting jobs (``scheduler.elastic``, without its
        pods): each running job's size and, with ``moves``, the type every job should run on."""
        choices: dict[str, GrowthChoice] = {}
        candidates = []
        for name, view in views.items():
            job = engine.jobs[self.live[name]]
            gpu_type = self.pinned[name]
            allowed = [t for t in kinds if view.gpu_types is None or t in view.gpu_types]
            rooms = ({t: engine.queries.room_on(job.name, t, now) for t in allowed if t != gpu_type or
                      job.phase == JobPhase.PENDING} if self.moves else {})
            if job.phase == JobPhase.PENDING:
                if rooms:
                    candidates.append(replace(engine_candidate(
                        engine, job, "", 0, view.estimate, view.restart_seconds, now, rooms=rooms,
                        attained=view.attained_gpu_seconds), name=name))
                continue
            if job.phase != JobPhase.RUNNING:
                continue
            most = min(job.spec.members, job.size + engine.queries.headroom(job.name, now))
            priced = view.estimate.goodput(gpu_type, 1, job.size) > 0.0
            if not priced and most > job.size:
                choices[name] = take_the_room(job.size, most)
                continue
            # (without a model and without room it only gives, as on a cluster: ``scheduler.elastic.decide``)
            candidates.append(replace(engine_candidate(
                engine, job, gpu_type, most - job.size, view.estimate, view.restart_seconds, now,
                rooms=rooms if priced else None, attained=view.attained_gpu_seconds, priced=priced),
                name=name, last_resize=view.last_resize))
            # (the allocator knows a job by one name, and when it last changed, across its engine jobs)
        choices.update(plan_targets(self.sizers, now, candidates, options=self.options))
        return choices
