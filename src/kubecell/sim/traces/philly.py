"""Philly job lists in the PCS per-VC format (``pcs_osdi24_per_vc_traces/trace_<vc>.csv``).

Columns ``app_id,submit_time,service,num_jobs,sleep_time,model_name``: one job per row in VC ``<vc>``;
``num_jobs`` GPUs; ``service`` GPU-seconds of work. ``submit_time`` counts from the first job *of that
VC*, so all VCs are aligned at their first job (time 0); the real Philly offsets between VCs are not
in these files. The column-to-job mapping is also written up in ``docs/dynamic.md``.
"""

from __future__ import annotations

import re
from pathlib import Path

from kubecell.core.engine.job import JobSpec
from kubecell.core.errors import InvalidInputError
from kubecell.core.limits import MAX_GANG_MEMBERS
from kubecell.inputs.csv_table import Row
from kubecell.sim.traces.jobs import MAX_TRACE_SECONDS, HostDefaults, JobFormat, ParsedJob, gang_shape

PCS_COLUMNS = ("app_id", "submit_time", "service", "num_jobs")

MAX_JOB_GPUS = MAX_GANG_MEMBERS
"""Most GPUs of one job: ``gang_shape`` may give each GPU its own member, so a job's GPUs are bounded
by the engine's largest gang."""


def pcs_vc(path: Path) -> str:
    """``trace_<vc>.csv`` holds the jobs of VC ``<vc>``; any other name is the VC itself."""
    match = re.fullmatch(r"trace_(.+)", path.stem)
    return match.group(1) if match else path.stem


def pcs_row(vc: str, row: Row, host: HostDefaults) -> ParsedJob:
    app_id = row.text("app_id")
    submit = row.number("submit_time", high=MAX_TRACE_SECONDS, unit="seconds")
    service = row.number("service", unit="GPU-seconds")
    gpus = row.count("num_jobs", high=MAX_JOB_GPUS, noun="GPUs")
    if service / gpus > MAX_TRACE_SECONDS:
        on = f"{gpus} GPU" + ("s" if gpus > 1 else "")
        raise InvalidInputError(f"{service:g} GPU-seconds on {on} is {service / gpus:g} seconds of work",
                                location=row.where, field="service",
                                accepted=f"at most {MAX_TRACE_SECONDS:.0f} seconds per GPU (10 years)")
    members, per_member, topology = gang_shape(gpus)
    name = f"{vc}-{app_id}"
    labels: tuple[tuple[str, str], ...] = (("trace", "philly-pcs"),)
    model = row.optional("model_name").strip()
    if model:
        labels += (("model", model),)

    def spec() -> JobSpec:
        return JobSpec(name=name, vc=vc, member=host.member(name, per_member), members=members, topology=topology,
                       submit_time=submit, work=service / gpus, labels=labels)

    return ParsedJob(name, submit, spec)


PHILLY_PCS = JobFormat("philly-pcs", PCS_COLUMNS, pcs_vc, pcs_row)
