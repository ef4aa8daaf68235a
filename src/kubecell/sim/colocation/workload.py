"""A seeded synthetic workload of one-GPU jobs that may share GPUs, drawn from measured job configurations.

Why synthetic: no public trace records which jobs shared a GPU and at what speed, while the pair table
measures 40 configurations against each other. So jobs are drawn (uniformly) from the configurations that
appear in the pair table, where every pair the simulation can form has a measured speed.

Every job asks for ``gpu_milli=500``: capacity alone would put two on a GPU, which is what blind packing
does; the admission rule under test decides which pairs may really share. Its GPU memory request is its solo
memory, and it carries its solo profile, as a job with history would.

Work (solo duration) is lognormal with a median of ``median_hours`` (1 h) and ``sigma`` (1.0: mean about
1.65 h, 1 % of jobs above 10 h), clipped to [2 min, 24 h]: heavy-tailed like the job durations of
production traces (Philly, Helios), where most jobs are short and a few long ones hold most GPU-time.

Arrivals are Poisson. ``load`` is the offered GPU demand over the GPUs: the arrival rate is set so that,
with every job alone on a GPU, the jobs would ask for ``load`` times the cluster's GPUs on average (computed
from the drawn works, so it holds for the sample, not only in expectation). Above 1 the queue grows while
jobs arrive unless sharing adds throughput. One VC owns the whole cluster.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from kubecell.core.engine.job import JobSpec
from kubecell.core.errors import InvalidInputError
from kubecell.core.interference import JobKey, SharedRun, SoloProfile
from kubecell.core.model import Request

VC = "shared"
SHARE_MILLI = 500
MIN_WORK = 120.0
MAX_WORK = 24 * 3600.0


@dataclass(frozen=True)
class WorkloadSpec:
    jobs: int = 400
    load: float = 1.0
    gpus: int = 32
    median_hours: float = 1.0
    sigma: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.jobs < 1 or self.gpus < 1:
            raise InvalidInputError("needs at least one job and one GPU", field="jobs")
        for name in ("load", "median_hours"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise InvalidInputError(f"must be a finite number above 0, got {value}", field=name)
        if not math.isfinite(self.sigma) or self.sigma < 0:
            raise InvalidInputError(f"must be a finite number >= 0, got {self.sigma}", field="sigma")


def paired_configurations(runs: Sequence[SharedRun], solos: Mapping[JobKey, SoloProfile]) -> list[SoloProfile]:
    """The solo profiles of the configurations that appear in a measured run, in a stable order."""
    keys = {key for run in runs for key in run.jobs}
    missing = sorted(str(key) for key in keys if key not in solos)
    if missing:
        raise InvalidInputError(f"no solo profile for {', '.join(missing)}", field="solos")
    return [solos[key] for key in sorted(keys)]


def share_job(name: str, profile: SoloProfile, submit: float, work: float) -> JobSpec:
    request = Request(name, gpu_count=1, gpu_milli=SHARE_MILLI, gpu_memory_mib=max(1, math.ceil(profile.memory_mib)),
                      profile=profile)
    return JobSpec(name=name, vc=VC, member=request, submit_time=submit, work=work)


def make_workload(configurations: Sequence[SoloProfile], spec: WorkloadSpec) -> list[JobSpec]:
    if not configurations:
        raise InvalidInputError("no job configurations to draw from", field="configurations")
    rng = np.random.default_rng(spec.seed)
    works = np.clip(rng.lognormal(math.log(spec.median_hours * 3600.0), spec.sigma, spec.jobs), MIN_WORK, MAX_WORK)
    rate = spec.load * spec.gpus / float(works.mean())  # arrivals per second
    submits = np.cumsum(rng.exponential(1.0 / rate, spec.jobs))
    picks = rng.integers(0, len(configurations), spec.jobs)
    return [share_job(f"job-{index:05d}", configurations[int(pick)], round(float(submit), 3), float(work))
            for index, (pick, submit, work) in enumerate(zip(picks, submits, works, strict=True))]


def controller_as_compute(jobs: Sequence[JobSpec]) -> list[JobSpec]:
    """The jobs as a scheduler sees them without a memory-controller series: each profile's controller
    utilization taken as its compute's (``HistoryKnowledge``'s fallback where no exporter gives it). What the
    admission rules read changes; the jobs' speeds do not (the pair table keys them by configuration)."""
    changed = []
    for job in jobs:
        profile = job.member.profile
        if profile is not None:
            profile = dataclasses.replace(profile, gmem_util=profile.gpu_util)
            job = dataclasses.replace(job, member=dataclasses.replace(job.member, profile=profile))
        changed.append(job)
    return changed
