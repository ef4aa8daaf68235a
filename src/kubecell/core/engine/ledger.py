"""The usage ledger: what each virtual cluster holds, by class, and who holds what where.

Every rule that compares usage with a limit reads it here: guarantee room, borrowing limits, fair
share, priority preemption (which priorities a VC's guaranteed work has), reclaim (which borrowed and
opportunistic jobs sit on a node) and cell release (which GPUs still carry guaranteed work). The ledger
changes only through ``add`` and ``remove`` of a whole running job, so it cannot drift from the jobs.
GPU units and CPU are counted per member (``Job.held_gpu_milli``, ``Job.held_cpu_milli``): each member of
a heterogeneous gang counts its own group's request.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from kubecell.core.book import AllocationBook, IntArray
from kubecell.core.engine.job import Job, JobClass
from kubecell.core.topology import Cell


@dataclass(slots=True)
class VcUsage:
    guaranteed_milli: int = 0
    borrowed_milli: int = 0
    opportunistic_milli: int = 0
    cpu_milli: int = 0
    admitted_milli: int = 0  # quota held by admitted jobs that are not placed yet (quota policy)

    @property
    def total_milli(self) -> int:
        return self.guaranteed_milli + self.borrowed_milli + self.opportunistic_milli


class UsageLedger:
    def __init__(self, book: AllocationBook, vc_names: Iterable[str]) -> None:
        self.book = book
        self.usage: dict[str, VcUsage] = {name: VcUsage() for name in vc_names}
        self.guaranteed_use: IntArray = np.zeros((book.size, book.max_gpus), np.int64)
        """Guaranteed allocations per GPU: a bound cell whose GPUs all read 0 is idle and can be released."""
        self._holders: dict[JobClass, dict[int, set[str]]] = {JobClass.BORROWED: {}, JobClass.OPPORTUNISTIC: {}}
        self._guaranteed_priorities: dict[str, Counter[int]] = {}
        self._guaranteed_of: dict[str, set[str]] = {}
        self._released: list[tuple[int, int]] = []  # GPUs that lost guaranteed work since the last take
        self._total_gpu = max(book.total_gpu_milli, 1)
        self._total_cpu = max(int(book.cpu_capacity.sum()), 1)
        self._shares: dict[str, float] = {}  # dominant shares since the VC's usage last changed
        self.changes: Counter[str] = Counter()  # per VC, how often its usage changed (for order caches)

    def of(self, vc: str) -> VcUsage:
        return self.usage.setdefault(vc, VcUsage())

    def add(self, job: Job) -> None:
        self._change(job, +1)

    def remove(self, job: Job) -> None:
        self._change(job, -1)

    def _gpus(self, job: Job) -> list[tuple[int, int]]:
        book = self.book
        return [(book.index[book.allocations[name].node], gpu) for name in job.running_members
                for gpu in book.allocations[name].gpu_indices]

    def _change(self, job: Job, sign: int) -> None:
        self._shares.pop(job.vc, None)
        self.changes[job.vc] += 1
        usage = self.of(job.vc)
        milli = job.held_gpu_milli * sign
        usage.cpu_milli += job.held_cpu_milli * sign
        if job.job_class == JobClass.GUARANTEED:
            usage.guaranteed_milli += milli
            members = self._guaranteed_of.setdefault(job.vc, set())
            priorities = self._guaranteed_priorities.setdefault(job.vc, Counter())
            if sign > 0:
                members.add(job.name)
                priorities[job.spec.priority] += 1
            else:
                members.discard(job.name)
                priorities[job.spec.priority] -= 1
            gpus = self._gpus(job)
            for node, gpu in gpus:
                self.guaranteed_use[node, gpu] += sign
            if sign < 0:
                self._released.extend(gpus)
            return
        if job.job_class == JobClass.BORROWED:
            usage.borrowed_milli += milli
        else:
            usage.opportunistic_milli += milli
        index = self._holders[JobClass.BORROWED if job.job_class == JobClass.BORROWED else JobClass.OPPORTUNISTIC]
        for name in job.running_members:
            holders = index.setdefault(self.book.index[self.book.allocations[name].node], set())
            if sign > 0:
                holders.add(job.name)
            else:
                holders.discard(job.name)

    # ------------------------------------------------------------------ queries
    def holders(self, job_class: JobClass, nodes: Iterable[int] | None) -> set[str]:
        """Running jobs of a class (borrowed or opportunistic) with members on ``nodes`` (None: anywhere)."""
        index = self._holders[job_class]
        names: set[str] = set()
        for node in (index if nodes is None else nodes):
            names |= index.get(node, set())
        return names

    def guaranteed_jobs(self, vc: str) -> set[str]:
        return self._guaranteed_of.get(vc, set())

    def has_guaranteed_below(self, vc: str, priority: int) -> bool:
        """Does the VC run guaranteed work of a priority lower than ``priority``?"""
        return any(count > 0 and p < priority for p, count in self._guaranteed_priorities.get(vc, Counter()).items())

    def cell_has_guaranteed(self, cell: Cell) -> bool:
        return any(self.guaranteed_use[node, gpu] > 0 for node, gpu in cell.gpus)

    def take_released(self) -> list[tuple[int, int]]:
        released, self._released = self._released, []
        return released

    def dominant_share(self, vc: str, weight: float) -> float:
        """Weighted dominant-resource share: the larger of the VC's GPU and CPU fractions over its weight
        (remembered until the VC's usage changes: the queue asks for it at every comparison)."""
        share = self._shares.get(vc)
        if share is None:
            usage = self.usage.get(vc)
            if usage is None:
                return float("inf")
            share = max(usage.total_milli / self._total_gpu, usage.cpu_milli / self._total_cpu)
            self._shares[vc] = share
        return share / weight

    def consistent_with(self, running: Iterable[Job]) -> list[str]:
        """Differences between the ledger and the running jobs (empty when they agree)."""
        expected: dict[str, VcUsage] = {}
        guaranteed = np.zeros_like(self.guaranteed_use)
        holders: dict[JobClass, dict[int, set[str]]] = {JobClass.BORROWED: {}, JobClass.OPPORTUNISTIC: {}}
        for job in running:
            usage = expected.setdefault(job.vc, VcUsage())
            usage.cpu_milli += job.held_cpu_milli
            if job.job_class == JobClass.GUARANTEED:
                usage.guaranteed_milli += job.held_gpu_milli
                for node, gpu in self._gpus(job):
                    guaranteed[node, gpu] += 1
                continue
            if job.job_class == JobClass.BORROWED:
                usage.borrowed_milli += job.held_gpu_milli
            else:
                usage.opportunistic_milli += job.held_gpu_milli
            for name in job.running_members:
                node = self.book.index[self.book.allocations[name].node]
                holders[job.job_class or JobClass.OPPORTUNISTIC].setdefault(node, set()).add(job.name)
        problems = []
        for vc, usage in self.usage.items():
            want = expected.get(vc, VcUsage())
            got = (usage.guaranteed_milli, usage.borrowed_milli, usage.opportunistic_milli, usage.cpu_milli)
            need = (want.guaranteed_milli, want.borrowed_milli, want.opportunistic_milli, want.cpu_milli)
            if got != need:
                problems.append(f"VC {vc} usage (guaranteed, borrowed, opportunistic milli-GPU, CPU milli) {got} "
                                f"differs from its running jobs {need}")
        for vc in set(expected) - set(self.usage):
            problems.append(f"VC {vc} runs jobs the ledger does not know")
        if not np.array_equal(guaranteed, self.guaranteed_use):
            problems.append("guaranteed use per GPU differs from the running guaranteed jobs")
        for job_class, index in self._holders.items():
            actual = {node: names for node, names in index.items() if names}
            if actual != holders[job_class]:
                problems.append(f"the index of {job_class.value} jobs per node differs from the running jobs")
        return problems
