"""The cluster's decision path in the elastic simulator (``kubecell-engine``): the core ``Engine`` admits, places
and shrinks the jobs as elastic gangs, and ``core.elastic.targets`` sizes them, as the Kubernetes scheduler
does with ElasticJobs (``scheduler.elastic``). The ``kubecell`` run measures the allocator with all of its
authority; this one measures what a cluster runs, so the gap between the two is a number, not a guess.

What it reproduces: an ElasticJob is a gang of one-GPU members whose headcount is its maximum and whose
minimum is its minimum; it starts with pods for its minimum (``Engine.limit_growth``). Every round the
running jobs are sized by the allocator as the cluster's sizer does: grown into the engine's headroom and into
members other jobs of the VC give up for them (their controllers delete the newest workers at once here:
``Engine.release_members``); a job without a goodput model takes the room. A job that needs its minimum takes
back members others grew (the engine's rule). The engine's resize interval holds. One VC holds the whole
cluster. Each job's restart cost is its own, as an ElasticJob states it in ``spec.restartSeconds`` (without
it the cluster charges 30 s, which here resizes ImageNet and YOLOv3 jobs too often: 21.7 restarts per job
instead of 16.0, and avg JCT 0.75 h instead of 0.66 h on philly 1).

What it leaves out: pods and their controller (a raised target is bound in the same round: creating and
binding pods takes seconds, a round is 60 s; a raise the engine cannot place binds nothing and is not kept),
and step reports (each job's model is fed by the simulator, as for ``kubecell``).

GPU type: Sia's job model runs a job on one GPU type, and an ElasticJob names its type in its template. Here
each job is given one when it is submitted, as a user who looks at the cluster would pick it (``_types``);
the engine then keeps the job on that type for its whole life: a cluster does not move a job between types.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from kubecell.core.elastic.allocator import KubecellElasticPolicy
from kubecell.core.elastic.targets import GrowthChoice, engine_candidate, plan_targets, take_the_room
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

    name = "kubecell-engine"

    def __init__(self, resize_interval_seconds: float | None = None) -> None:
        self.resize_interval_seconds = resize_interval_seconds
        """The engine's ``resize_min_interval_seconds`` (None: the preset's, as a cluster runs it)."""
        self.engine: Engine | None = None
        self.sizers: dict[str, KubecellElasticPolicy] = {}
        """Size the running jobs per VC, as the cluster's sizer does (each keeps restart counts and prices)."""
        self.last_reasons: dict[str, str] = {}

    def allocate(self, now: float, jobs: Sequence[ElasticJobView],
                 nodes: Sequence[ClusterNode]) -> Mapping[str, tuple[str, ...]]:
        engine = self.engine or self._build(nodes)
        views = {view.name: view for view in jobs}
        for name in [name for name, job in engine.jobs.items() if name not in views
                     and job.phase in (JobPhase.RUNNING, JobPhase.RESERVED)]:
            engine.finish(name, now)
        new = [view for view in jobs if view.name not in engine.jobs]
        if new:
            types = self._types(engine, new, nodes)
            for view in sorted(new, key=lambda v: (v.submitted, v.name)):
                member = Request(name=view.name, gpu_count=1, gpu_milli=MILLI_PER_GPU,
                                 gpu_models=frozenset({types[view.name]}))
                engine.submit(JobSpec(name=view.name, vc=VC, member=member, members=view.max_replicas,
                                      min_members=view.min_replicas, submit_time=view.submitted), now)
                engine.limit_growth(view.name, (view.min_replicas,))  # the controller made pods for its minimum
        for name, choice in self._growth(engine, views, now).items():
            self.last_reasons[name] = choice.reason
            job = engine.jobs[name]
            if choice.target < job.size:  # its controller deletes its newest workers at once
                engine.release_members(name, job.running_members[choice.target:], now, choice.reason)
            engine.limit_growth(name, (max(choice.target - job.size, 0),))
        engine.schedule(now)
        for job in list(engine.running.values()):
            if job.phase == JobPhase.RESERVED:  # the preempted members' pods are gone at once here
                engine.confirm(job.name, now)
        decision: dict[str, tuple[str, ...]] = {}
        for name in views:
            job = engine.jobs[name]
            decision[name] = (tuple(a.node for a in engine.allocations_of(name))
                              if job.phase == JobPhase.RUNNING else ())
            if job.phase == JobPhase.RUNNING:
                engine.limit_growth(name, (0,))  # pods the cycle did not bind are given back
        return decision

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
        """The GPU type each new job is given (see the module), in submission order: of the types with idle
        GPUs for its minimum, the one where its model prices a GPU highest; when none has room, the type whose
        running jobs hold the most members above their minimums (what a job that needs its minimum takes back
        soonest), ties to the better price. (Choosing by comparative advantage instead, as the allocator
        admits jobs, was worse: 1.24 / 1.41 h avg JCT on Philly / Helios where this rule gave 0.86 / 1.13 h,
        since a job that cannot move later had better start where it is fast.)"""
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
            price = {t: view.estimate.goodput(t, 1, 1) for t in allowed}
            roomy = [t for t in allowed if idle[t] >= view.min_replicas]
            best = (max(roomy, key=lambda t: (price[t], t)) if roomy
                    else max(allowed, key=lambda t: (above[t], price[t], t)))
            idle[best] -= view.min_replicas
            types[view.name] = best
        return types

    def _growth(self, engine: Engine, views: Mapping[str, ElasticJobView], now: float) -> dict[str, GrowthChoice]:
        """What the cluster's sizer decides for the running jobs (``scheduler.elastic``, without its pods)."""
        choices: dict[str, GrowthChoice] = {}
        candidates = []
        for name, view in views.items():
            job = engine.jobs[name]
            if job.phase != JobPhase.RUNNING:
                continue
            most = min(job.spec.members, job.size + engine.headroom(name, now))
            models = job.spec.member.gpu_models or frozenset()
            gpu_type = next(iter(models), "")
            if view.estimate.goodput(gpu_type, 1, job.size) <= 0.0:
                if most > job.size:
                    choices[name] = take_the_room(job.size, most)
                continue
            candidates.append(engine_candidate(engine, job, gpu_type, most - job.size, view.estimate,
                                               view.restart_seconds, now))
        choices.update(plan_targets(self.sizers, now, candidates))
        return choices
