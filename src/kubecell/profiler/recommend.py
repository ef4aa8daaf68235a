"""Right-sizing from the job history: each family's finished jobs become usage profiles per GPU, and the core's
rule (:mod:`kubecell.core.rightsizing`) says what share the family needs.

Why per GPU: the profiler stores a pod's utilization summed over its GPUs (two busy GPUs read 2.0) and its GPU
memory summed likewise, while a share is asked per GPU. A job's pooled distribution is divided by the GPUs each
of its pods asked for; a share (one GPU, some milli-GPU) is per GPU already. Jobs that asked for no GPU, and
jobs without both GPU series, say nothing about GPU needs and are left out (counted, so the table says so).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kubecell.core.model import MILLI_PER_GPU
from kubecell.core.rightsizing import Recommendation, SizingRule, UsageProfile, recommend
from kubecell.profiler.history import JobRecord, Outcome

GPU_UTILIZATION = "gpu_utilization"
GPU_MEMORY = "gpu_memory"
MIB = 2**20


@dataclass(frozen=True)
class FamilyAdvice:
    """A family's recommendation beside what its jobs asked for (the most common request per pod)."""

    family: str
    namespace: str
    asked_gpus: int
    asked_milli: int
    advice: Recommendation
    without_series: int

    @property
    def saved_milli_per_pod(self) -> int | None:
        """GPU compute a pod of the family would give back at the recommended share per GPU (None: no advice)."""
        if self.advice.milli is None:
            return None
        return self.asked_gpus * max(0, self.asked_milli - self.advice.milli)


def usage_profile(record: JobRecord) -> UsageProfile | None:
    """The job's use per GPU, or None where it asked for no GPU or lacks a GPU series."""
    gpus = max(record.gpus_per_pod, 1) if record.milli_gpu_per_pod >= MILLI_PER_GPU else 1
    util, memory = record.metrics.get(GPU_UTILIZATION), record.metrics.get(GPU_MEMORY)
    if record.gpus_per_pod <= 0 or util is None or memory is None:
        return None
    return UsageProfile(
        f"{record.namespace}/{record.owner_name}",
        tuple(min(1.0, max(0.0, value / gpus)) for value in util.deciles),
        tuple(max(0.0, value / gpus / MIB) for value in memory.deciles),
        max(record.seconds or 0.0, 0.0),  # a finish before the start (a kubelet's clock stepped back): unknown
    )


def _most_common(values: Iterable[tuple[int, int]]) -> tuple[int, int]:
    counts: dict[tuple[int, int], int] = defaultdict(int)
    for value in values:
        counts[value] += 1
    return max(counts, key=lambda value: (counts[value], value))


def advise(records: Sequence[JobRecord], rule: SizingRule | None = None) -> list[FamilyAdvice]:
    """One recommendation per (namespace, family) over the finished jobs of ``records``."""
    finished = (Outcome.SUCCEEDED, Outcome.FAILED)
    groups: dict[tuple[str, str], list[JobRecord]] = defaultdict(list)
    for record in records:
        if record.outcome in finished and record.gpus_per_pod > 0:
            groups[(record.namespace, record.family)].append(record)
    advice = []
    for (namespace, family), jobs in sorted(groups.items()):
        profiles = [profile for profile in (usage_profile(job) for job in jobs) if profile is not None]
        gpus, milli = _most_common((job.gpus_per_pod, job.milli_gpu_per_pod) for job in jobs)
        advice.append(FamilyAdvice(family, namespace, gpus, milli, recommend(family, profiles, rule),
                                   len(jobs) - len(profiles)))
    return advice
