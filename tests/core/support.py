"""Builders shared by the tenancy and engine unit tests: small clusters, tenants, jobs and engines.

Everything is built in code (no YAML files); the vocabulary is the one of ``docs/tenancy.md`` and the
conformance scenarios (``kubecell.testing.scenarios``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import combinations
from typing import Any

from kubecell.core.engine.engine import Engine
from kubecell.core.engine.job import Job, JobPhase, JobSpec
from kubecell.core.engine.options import PRESETS
from kubecell.core.model import MILLI_PER_GPU, Node, Request, TopologyLevel, make_node
from kubecell.core.tenancy.config import Tenants, resolve_tenants
from kubecell.core.tenancy.feasibility import free_cells
from kubecell.core.topology import Cell, CellForest

CPU_MILLI = 128_000
MEMORY_MIB = 1 << 20
GENERIC_REASONS = ("not yet considered", "submitted; waiting for the next scheduling cycle")


def make_nodes(count: int, *, gpus: int = 8, model: str = "V100M32", racks_of: int = 0, prefix: str = "n",
               rack_prefix: str = "rack", nvlink_groups: Sequence[Sequence[int]] = ()) -> list[Node]:
    """``count`` identical nodes ``<prefix>0..``; with ``racks_of`` they sit in racks of that many nodes."""
    return [make_node(f"{prefix}{i}", cpu_milli=CPU_MILLI, memory_mib=MEMORY_MIB, gpu_count=gpus, gpu_model=model,
                      nvlink_groups=nvlink_groups, rack=f"{rack_prefix}{i // racks_of}" if racks_of else "")
            for i in range(count)]


def tenants(forest: CellForest, vcs: Mapping[str, Any], **top: Any) -> Tenants:
    """``resolve_tenants`` of ``{virtualClusters: vcs, **top}``."""
    return resolve_tenants({"virtualClusters": dict(vcs), **top}, forest)


def whole(name: str, vc: str, gpus: int = 8, *, members: int = 1, min_members: int | None = None,
          priority: int = 0, topology: TopologyLevel | None = None, models: Iterable[str] | None = None) -> JobSpec:
    """A gang of ``members`` identical members of ``gpus`` whole GPUs each."""
    member = Request(name=name, gpu_count=gpus, gpu_milli=MILLI_PER_GPU,
                     gpu_models=None if models is None else frozenset(models))
    return JobSpec(name=name, vc=vc, member=member, members=members, min_members=min_members, priority=priority,
                   topology=topology)


def engine(nodes: Sequence[Node], vcs: Mapping[str, Any], policy: str = "kubecell",
           **options: Any) -> Engine:
    forest = CellForest(nodes)
    opts = PRESETS[policy].with_(**options) if options else PRESETS[policy]
    return Engine(nodes, tenants(forest, vcs), opts, forest=forest)


def gpus_of(eng: Engine, job: Job) -> set[tuple[int, int]]:
    """(node index, GPU index) of every GPU the job holds."""
    book = eng.book
    return {(book.index[book.allocations[a].node], g) for a in job.running_members
            for g in book.allocations[a].gpu_indices}


def nodes_of(eng: Engine, job: Job) -> set[str]:
    return {eng.book.allocations[a].node for a in job.running_members}


def allocations_by_job(eng: Engine) -> dict[str, frozenset[tuple[str, tuple[int, ...]]]]:
    """What every job holds in the book: (node, GPU indices) per member."""
    out: dict[str, frozenset[tuple[str, tuple[int, ...]]]] = {}
    for job in eng.jobs.values():
        out[job.name] = frozenset((eng.book.allocations[a].node, tuple(eng.book.allocations[a].gpu_indices))
                                  for a in job.running_members)
    return out


def check_engine(eng: Engine) -> None:
    """The engine's own invariants (the same check the conformance scenarios run after every step)."""
    eng.check_invariants()


def pending_reason(eng: Engine, name: str) -> str:
    """``eng.queries.explain(name)`` for a job that waits with nothing running and a reason more specific than the
    generic ones (the assertions fail otherwise)."""
    job = eng.jobs[name]
    assert job.phase == JobPhase.PENDING, eng.queries.explain(name)
    assert not job.running_members
    assert job.wait_reason, name
    assert job.wait_reason not in GENERIC_REASONS, eng.queries.explain(name)
    return eng.queries.explain(name)


# ---------------------------------------------------------------------------------------- feasibility oracle
def count_free(forest: CellForest, blocked: Iterable[Cell]) -> dict[tuple[str, int], int]:
    """Free cells per (chain, level), from scratch (every (chain, level) present, zeros included)."""
    counts = {(chain.name, level): 0 for chain in forest.chains.values() for level in range(len(chain.kinds))}
    for cell in free_cells(forest, list(blocked)):
        counts[(cell.chain.name, cell.level)] += 1
    return counts


def brute_force_fits(forest: CellForest, blocked: Iterable[Cell], demand: Mapping[tuple[str, int], int]) -> bool:
    """Is there a set of pairwise disjoint free cells with ``demand[(chain, level)]`` cells of each type?
    Exhaustive search, top level first (for tiny forests only): an oracle independent of the counting
    argument of ``feasibility.shortfalls``."""
    free = free_cells(forest, list(blocked))
    wanted = sorted(((key, n) for key, n in demand.items() if n > 0), key=lambda item: (item[0][0], -item[0][1]))

    def search(index: int, used: frozenset[Cell]) -> bool:
        if index == len(wanted):
            return True
        (chain_name, level), count = wanted[index]
        pool = [c for c in free if c.chain.name == chain_name and c.level == level
                and c not in used and not any(a in used for a in c.ancestors())]
        if len(pool) < count:
            return False
        for chosen in combinations(sorted(pool, key=lambda c: c.id), count):
            taken = set(used)
            for cell in chosen:
                taken.update(cell.walk())
            if search(index + 1, frozenset(taken)):
                return True
        return False

    return search(0, frozenset())
