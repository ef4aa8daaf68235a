"""Sia workloads (``<trace>/workload-<n>.csv``, columns ``name,time,application,num_replicas,batch_size``).

The Philly, Helios-Saturn and newTrace job lists behind Sia's Table 3; one 1-GPU member per replica.
Their durations are not in the files (see ``SIA_GPU_HOURS``), so results are not comparable with Sia's
numbers. The column-to-job mapping is also written up in ``docs/dynamic.md``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from kubecell.core.engine.job import JobSpec
from kubecell.core.errors import InvalidInputError
from kubecell.core.limits import MAX_GANG_MEMBERS
from kubecell.core.model import TopologyLevel
from kubecell.inputs.csv_table import Row
from kubecell.sim.traces.jobs import GPUS_PER_MACHINE, MAX_TRACE_SECONDS, HostDefaults, JobFormat, ParsedJob

SIA_COLUMNS = ("name", "time", "application", "num_replicas")

SIA_GPU_HOURS: Mapping[str, tuple[str, float]] = {
    "cifar10": ("Small (0-1 GPU h)", 0.5),
    "bert": ("Medium (1-10 GPU h)", 3.0),
    "deepspeech2": ("Medium (1-10 GPU h)", 3.0),
    "yolov3": ("Large (10-100 GPU h)", 30.0),
    "imagenet": ("XL (> 100 GPU h)", 300.0),
}
"""Total work of a Sia job, in GPU-hours, by application. ASSUMPTION, not data: Sia replaced each
trace job by a model of its GPU-time bucket (Small 0-1 h: ResNet18/CIFAR-10; Medium 1-10 h: BERT or
DeepSpeech2; Large 10-100 h: YOLOv3; XL > 100 h: ResNet50/ImageNet) and ran it until it reached its
target accuracy under Pollux/Sia's goodput model (throughput and statistical-efficiency curves per
model), which is not available here. We use one representative value per bucket: the arithmetic
midpoint of Small, the geometric (decade) midpoints of Medium and Large, and 3x the bound for XL.
On the Philly workloads this averages ~8 GPU-hours per job, the same order as Sia's Gavel+TunedJobs
figure (9.0 +- 6.3), but job completion times from these files are NOT comparable with Sia's Table 3."""

MAX_REPLICAS = MAX_GANG_MEMBERS
"""Most replicas of one job: each replica is one gang member."""


def sia_vc(path: Path) -> str:
    """``philly/workload-1.csv`` is VC ``philly-w1``: one VC per workload file, named after its trace."""
    match = re.fullmatch(r"workload-(\d+)", path.stem)
    suffix = f"w{match.group(1)}" if match else path.stem
    return f"{path.parent.name}-{suffix}" if path.parent.name else suffix


def sia_row(vc: str, row: Row, host: HostDefaults) -> ParsedJob:
    job = row.text("name")
    submit = row.number("time", high=MAX_TRACE_SECONDS, unit="seconds")
    application = row.text("application").lower()
    if application not in SIA_GPU_HOURS:
        raise InvalidInputError(f"unknown application {application!r}", location=row.where, field="application",
                                accepted=", ".join(SIA_GPU_HOURS))
    replicas = row.count("num_replicas", high=MAX_REPLICAS, noun="replicas")
    topology = TopologyLevel.NODE if replicas <= GPUS_PER_MACHINE else TopologyLevel.RACK
    work = SIA_GPU_HOURS[application][1] * 3600.0 / replicas
    name = f"{vc}-{job}"
    labels: tuple[tuple[str, str], ...] = (("trace", "sia"), ("application", application))
    batch = row.optional("batch_size").strip()
    if batch:
        labels += (("batch_size", batch),)

    def spec() -> JobSpec:
        return JobSpec(name=name, vc=vc, member=host.member(name, 1), members=replicas,
                       topology=topology if replicas > 1 else None, submit_time=submit, work=work, labels=labels)

    return ParsedJob(name, submit, spec)


SIA = JobFormat("sia", SIA_COLUMNS, sia_vc, sia_row)
