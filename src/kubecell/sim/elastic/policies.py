"""The elastic policies the simulator can run, by name, and the rigid baseline.

A registry entry says how to build the policy and how its jobs behave: ``tuned_jobs`` jobs keep the workload's
``num_replicas`` and ``batch_size`` (the TunedJobs setting of Sia's Table 3 for schedulers that cannot resize),
others may be given any size and run at the batch their goodput model advises; ``estimate`` is the goodput
model each job carries (``estimates.py``). ``kubecell`` is the path a cluster runs (the core engine with the
allocator sizing, ``engine_policy``); the ``kubecell-*`` runs are diagnostics of it. They are looked up when
asked for, so the simulator and its tests run without them.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from kubecell.core.elastic.types import ClusterNode, ElasticJobView, ElasticPolicy
from kubecell.core.errors import InvalidInputError
from kubecell.sim.elastic.gavel import ROUND_SECONDS as GAVEL_ROUND_SECONDS
from kubecell.sim.elastic.gavel import GavelPolicy

if TYPE_CHECKING:
    from kubecell.core.elastic.allocator import ElasticOptions

Estimate = Literal["oracle", "online", "online-true-noise"]


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """How to build one policy and run its jobs."""

    name: str
    summary: str
    make: Callable[[], ElasticPolicy]
    tuned_jobs: bool
    """Jobs keep the workload's size (min = max = num_replicas) and global batch."""
    estimate: Estimate
    requires: str | None = None
    """A module that must be importable for the policy to exist."""
    round_seconds: float | None = None
    """Its own scheduling interval, which the simulator then runs at (None: the simulator's, 60 s)."""
    restart_on_move: bool = True
    """False: a job moved to other nodes of its GPU type with the same replicas per node does not restart
    (Sia's ``Cluster`` charges Gavel's jobs this way: only a changed placement shape restarts them)."""
    make_with: Callable[[ElasticOptions], ElasticPolicy] | None = None
    """Builds the policy with other ``ElasticOptions`` (kubecell's policies; None: a policy without them)."""

    def available(self) -> bool:
        return self.requires is None or importlib.util.find_spec(self.requires) is not None


class RigidPolicy:
    """FIFO with backfill of fixed-size jobs, never resized or preempted: our stand-in for Gavel+TunedJobs.

    Why it stands for Gavel+TunedJobs: in Sia's Table 3 that row is Gavel (heterogeneity-aware, given every
    job's true throughput on every GPU type) running each job at the GPU count and batch size the workload
    file gives (TunedJobs: sizes tuned to run well, never changed). This policy keeps exactly those job
    sizes and batches, never mixes GPU types in a job, and is heterogeneity-aware the same way: among the GPU
    types where a job fits now, it takes the one where the job's true goodput is highest.

    How it differs: Gavel solves a max-sum-throughput LP over all jobs every 6 minutes and time-slices the
    cluster to follow it, so jobs are preempted and moved (Sia's README reports 7.4 restarts per job on
    Saturn, 205 for ImageNet, each costing a checkpoint-restore). Here a job, once started, runs to
    completion where it started; the queue is served in arrival order and any later job that fits in what
    is free starts at once (backfill without reservations, so a large job can wait behind a stream of small
    ones). Placement: on the fewest nodes possible (the fullest free nodes first, the remainder on the
    best-fitting node), which is Gavel's consolidated placement when the cluster is not fragmented.
    """

    name = "rigid"

    def allocate(self, now: float, jobs: Sequence[ElasticJobView],
                 nodes: Sequence[ClusterNode]) -> Mapping[str, tuple[str, ...]]:
        free = {node.name: node.gpus for node in nodes}
        for job in jobs:
            for name in job.current:
                free[name] -= 1
        order = {node.name: index for index, node in enumerate(nodes)}
        by_type: dict[str, list[str]] = {}
        for node in nodes:
            by_type.setdefault(node.gpu_type, []).append(node.name)
        decisions: dict[str, tuple[str, ...]] = {}
        for job in sorted((j for j in jobs if not j.current), key=lambda j: (j.submitted, j.name)):
            size = job.max_replicas
            best: tuple[float, tuple[str, ...]] | None = None
            for gpu_type, names in by_type.items():
                if job.gpu_types is not None and gpu_type not in job.gpu_types:
                    continue
                chosen = pack(size, names, free, order)
                if chosen is None:
                    continue
                value = job.estimate.goodput(gpu_type, len(set(chosen)), size)
                if best is None or value > best[0]:
                    best = (value, chosen)
            if best is None:
                continue
            for name in best[1]:
                free[name] -= 1
            decisions[job.name] = best[1]
        return decisions


def pack(size: int, names: Sequence[str], free: Mapping[str, int], order: Mapping[str, int]) -> tuple[str, ...] | None:
    """``size`` replicas on the fewest of ``names``: whole free capacity of the fullest-free nodes, the rest on
    the node that fits it most tightly; None when they do not have ``size`` free GPUs in all."""
    if size <= 0 or sum(free[name] for name in names) < size:
        return None
    candidates = sorted((name for name in names if free[name] > 0), key=lambda n: (-free[n], order[n]))
    chosen: list[str] = []
    left = size
    while left > 0:
        fits = [name for name in candidates if name not in chosen and free[name] >= left]
        if fits:
            tightest = min(fits, key=lambda n: (free[n], order[n]))
            chosen.extend([tightest] * left)
            break
        largest = next(name for name in candidates if name not in chosen)
        chosen.extend([largest] * free[largest])
        left -= free[largest]
    return tuple(sorted(chosen, key=lambda n: order[n]))


def _allocator(options: ElasticOptions | None = None) -> ElasticPolicy:
    """kubecell's allocator with the authority of the whole cluster (a diagnostic, imported only when asked for:
    runs of the other policies do not depend on it)."""
    from kubecell.core.elastic.allocator import KubecellElasticPolicy

    return KubecellElasticPolicy(options)


class _Builder(Protocol):
    def __call__(self, options: ElasticOptions | None = None) -> ElasticPolicy: ...


def _cluster_path(*, moves: bool = True) -> _Builder:
    """The cluster's decision path: the core engine admits, places and takes back, the allocator sizes, moves
    and chooses where jobs start (``engine_policy``)."""
    def make(options: ElasticOptions | None = None) -> ElasticPolicy:
        from kubecell.sim.elastic.engine_policy import EngineSizedPolicy

        return EngineSizedPolicy(moves=moves, options=options)
    return make


_CORE = "kubecell.sim.elastic.engine_policy"
_PATH, _PATH_NO_MOVES = _cluster_path(), _cluster_path(moves=False)
"""Each builds its policy with the defaults (``make``) or with other options (``make_with``)."""
POLICIES: dict[str, PolicySpec] = {
    "kubecell": PolicySpec(
        "kubecell", "kubecell as a cluster runs it: the core engine admits, places and takes back members of "
        "elastic gangs, the allocator sizes them, moves them between GPU types and chooses where they start, on "
        "goodput learned online from their step reports", _PATH, tuned_jobs=False, estimate="online",
        requires=_CORE, make_with=_PATH),
    "kubecell-no-moves": PolicySpec(
        "kubecell-no-moves", "diagnostic: kubecell with every job kept on the GPU type it was given when it was "
        "submitted (what moves between types are worth)", _PATH_NO_MOVES, tuned_jobs=False,
        estimate="online", requires=_CORE, make_with=_PATH_NO_MOVES),
    "kubecell-allocator": PolicySpec(
        "kubecell-allocator", "diagnostic: kubecell's allocator alone with the authority of the whole cluster "
        "(no engine: every job sized, placed and moved by it)", _allocator, tuned_jobs=False, estimate="online",
        requires="kubecell.core.elastic.allocator", make_with=_allocator),
    "kubecell-true-noise": PolicySpec(
        "kubecell-true-noise", "diagnostic: kubecell with the throughput learned online but the true gradient "
        "noise", _PATH, tuned_jobs=False, estimate="online-true-noise", requires=_CORE, make_with=_PATH),
    "kubecell-oracle": PolicySpec(
        "kubecell-oracle", "diagnostic: kubecell given every job's true goodput (the bound a perfect goodput "
        "model reaches)", _PATH, tuned_jobs=False, estimate="oracle", requires=_CORE, make_with=_PATH),
    "rigid": PolicySpec("rigid", "FIFO with backfill at the workload's GPU count and batch (TunedJobs), never resized;"
                        " stands for Gavel+TunedJobs", RigidPolicy, tuned_jobs=True, estimate="oracle"),
    "gavel": PolicySpec("gavel", "Gavel+TunedJobs as Sia runs it: max-sum-throughput LP over true throughputs every "
                        "6 minutes, jobs time-sliced (preempted, moved) at the workload's GPU count and batch",
                        GavelPolicy, tuned_jobs=True, estimate="oracle", round_seconds=GAVEL_ROUND_SECONDS,
                        restart_on_move=False),
}
DEFAULT_POLICIES = ("kubecell", "rigid")


def policy_spec(name: str) -> PolicySpec:
    """A registered policy that can run here, or a clear error."""
    spec = POLICIES.get(name.strip().lower())
    if spec is None:
        raise InvalidInputError(f"unknown elastic policy {name!r}", field="policy", accepted=", ".join(POLICIES))
    if not spec.available():
        raise InvalidInputError(f"policy {spec.name!r} is not available in this build ({spec.requires} is missing)",
                                field="policy", accepted=", ".join(n for n, s in POLICIES.items() if s.available()))
    return spec


def parse_policies(text: str) -> list[PolicySpec]:
    """``"kubecell,rigid"`` -> their specs, in order, each once."""
    names = [name.strip().lower() for name in text.split(",") if name.strip()]
    if not names:
        raise InvalidInputError("no policy given", field="policy", accepted=", ".join(POLICIES))
    return [policy_spec(name) for name in dict.fromkeys(names)]


def with_options(spec: PolicySpec, overrides: Sequence[str]) -> PolicySpec:
    """``spec`` with some of kubecell's ``ElasticOptions`` replaced (``["fifo_decay=0.85"]``), named after them
    (``kubecell fifo_decay=0.85``): how a knob is measured against the defaults, on the same path. Each value is
    read as the type of the knob's default and checked by ``ElasticOptions``."""
    if not overrides:
        return spec
    if spec.make_with is None:
        raise InvalidInputError(f"policy {spec.name!r} has no ElasticOptions to set", field="option",
                                accepted=", ".join(n for n, s in POLICIES.items() if s.make_with is not None))
    from kubecell.core.elastic.allocator import ElasticOptions

    defaults = ElasticOptions()
    known = {f.name: getattr(defaults, f.name) for f in dataclasses.fields(ElasticOptions)}
    values: dict[str, Any] = {}
    for override in overrides:
        key, sep, text = override.partition("=")
        key, text = key.strip(), text.strip()
        if not sep or key not in known:
            raise InvalidInputError(f"option {override!r} is not KEY=VALUE of a known knob", field="option",
                                    accepted=", ".join(sorted(known)))
        values[key] = _value_as(known[key], text, key)
    options = dataclasses.replace(defaults, **values)
    make_with = spec.make_with
    name = " ".join((spec.name, *(f"{key}={value}" for key, value in values.items())))
    return dataclasses.replace(spec, name=name, make=lambda: make_with(options))


def _value_as(default: object, text: str, key: str) -> Any:
    kind = "true or false" if isinstance(default, bool) else "an integer" if isinstance(default, int) else "a number"
    try:
        if isinstance(default, bool):
            if text.lower() not in ("true", "false"):
                raise ValueError(text)
            return text.lower() == "true"
        if isinstance(default, int):
            return int(text)
        return float(text)
    except ValueError:
        raise InvalidInputError(f"option {key}={text!r} is not {kind}", field="option",
                                accepted=f"{key}=<{kind}>") from None
