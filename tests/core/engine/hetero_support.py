"""Builders for the heterogeneous-gang tests: GPU nodes beside CPU nodes, launchers and workers."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kubecell.core.engine.engine import Engine
from kubecell.core.engine.job import Job, JobSpec, MemberGroup, member_index
from kubecell.core.model import MILLI_PER_GPU, Node, Request, TopologyLevel, make_node
from tests.core.support import engine

WORKER_CPU = 8000
LAUNCHER_CPU = 4000


def worker(gpus: int = 8, cpu: int = WORKER_CPU, **kwargs: Any) -> Request:
    return Request("worker", cpu_milli=cpu, gpu_count=gpus, gpu_milli=MILLI_PER_GPU, **kwargs)


def launcher(cpu: int = LAUNCHER_CPU) -> Request:
    return Request("launcher", cpu_milli=cpu)


def mpi(name: str, vc: str, workers: int = 2, *, worker_min: int | None = None, launcher_min: int = 1,
        gpus: int = 8, worker_cpu: int = WORKER_CPU, launcher_cpu: int = LAUNCHER_CPU,
        min_members: int | None = None, topology: TopologyLevel | None = None,
        nodes: Iterable[str] | None = None, priority: int = 0) -> JobSpec:
    """One launcher without GPUs and ``workers`` workers of ``gpus`` whole GPUs each."""
    groups = [MemberGroup("launcher", launcher(launcher_cpu), 1, launcher_min),
              MemberGroup("worker", worker(gpus, worker_cpu), workers, workers if worker_min is None else worker_min)]
    return JobSpec.gang(name, vc, groups, min_members=min_members, topology=topology, priority=priority,
                        nodes=None if nodes is None else frozenset(nodes))


def cluster(gpu_nodes: int = 2, cpu_nodes: int = 1, *, gpu_cpu: int = 64000, cpu_cpu: int = 32000,
            racks_of: int = 0) -> list[Node]:
    """``n0..`` with 8 V100 GPUs and ``gpu_cpu`` milli-CPU (in racks of ``racks_of``), then ``c0..`` without
    GPUs (no rack)."""
    nodes = [make_node(f"n{i}", cpu_milli=gpu_cpu, memory_mib=1 << 18, gpu_count=8, gpu_model="V100M32",
                       rack=f"rack{i // racks_of}" if racks_of else "") for i in range(gpu_nodes)]
    nodes += [make_node(f"c{i}", cpu_milli=cpu_cpu, memory_mib=1 << 16) for i in range(cpu_nodes)]
    return nodes


def hetero_engine(vcs: dict[str, Any], policy: str = "kubecell", **kwargs: Any) -> Engine:
    options = {k: kwargs.pop(k) for k in list(kwargs) if k not in ("gpu_nodes", "cpu_nodes", "gpu_cpu", "cpu_cpu",
                                                                    "racks_of")}
    return engine(cluster(**kwargs), vcs, policy, **options)


def running_indices(job: Job) -> list[int]:
    return sorted(member_index(name) for name in job.running_members)


def node_of(eng: Engine, job: Job, index: int) -> str:
    return eng.book.allocations[f"{job.name}/{index}"].node
