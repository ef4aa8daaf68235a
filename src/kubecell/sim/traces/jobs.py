"""What the job-list formats share: host resources the traces do not record, gang shapes, the format
interface.

The public multi-tenant traces we have are not raw cluster logs but job lists other research groups
derived from them (see ``shared/data/*/SOURCE.md``), each with its own columns and units. Each format
module (``philly.py``, ``sia.py``) maps its rows onto the engine's jobs (gangs of identical members
with a topology constraint and an amount of work) and states its assumptions as named constants; the
assumptions every format needs live here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kubecell.core.engine.job import JobSpec
from kubecell.core.model import MILLI_PER_GPU, Request, TopologyLevel
from kubecell.inputs.csv_table import Row

SECONDS_PER_DAY = 86_400.0

MAX_TRACE_SECONDS = 10 * 365 * SECONDS_PER_DAY
"""Latest submission time and longest job (its work at full size) accepted from a job list: 10 years.
The traces span months (Philly PCS: 129 days, longest job 1.1 GPU-years of service), and the simulator
samples the cluster every hour until the last job ends, so a time like 1e300 seconds is a typo that
would keep it sampling forever; 10 years is at most 87,600 samples."""

CPU_MILLI_PER_GPU = 5_000
"""Host CPU a job asks for per GPU (5 vCPU). Neither trace records CPU; Philly's 8-GPU servers have
about 48 vCPU, so 5 per GPU lets an 8-GPU member fit one server with room for system daemons."""

MEMORY_MIB_PER_GPU = 40_000
"""Host memory a job asks for per GPU (MiB). Not in the traces; 8 x 40,000 MiB fits a 384 GiB server."""

GPUS_PER_MACHINE = 8
"""Largest gang member (GPUs on one Philly server). Jobs wider than this become several members."""


def gang_shape(gpus: int) -> tuple[int, int, TopologyLevel | None]:
    """(members, GPUs per member, topology) of a rigid job asking for ``gpus`` GPUs.

    Up to one machine's worth: one member holding all its GPUs (one node by construction). Wider jobs
    span machines: 8-GPU members when the count is a multiple of 8 (Philly's data-parallel jobs used
    whole servers), else 4-GPU members when a multiple of 4, else 1-GPU members; all inside one rack,
    because multi-server jobs on Philly were placed rack-locally (InfiniBand within a rack).
    """
    if gpus <= GPUS_PER_MACHINE:
        return 1, gpus, None
    for per_member in (GPUS_PER_MACHINE, 4):
        if gpus % per_member == 0:
            return gpus // per_member, per_member, TopologyLevel.RACK
    return gpus, 1, TopologyLevel.RACK


@dataclass(frozen=True, slots=True)
class HostDefaults:
    """Host resources per GPU given to every job (the traces do not record them)."""

    cpu_milli_per_gpu: int = CPU_MILLI_PER_GPU
    memory_mib_per_gpu: int = MEMORY_MIB_PER_GPU

    def member(self, name: str, gpus: int) -> Request:
        return Request(name=name, cpu_milli=gpus * self.cpu_milli_per_gpu, memory_mib=gpus * self.memory_mib_per_gpu,
                       gpu_count=gpus, gpu_milli=MILLI_PER_GPU)


@dataclass(frozen=True, slots=True)
class ParsedJob:
    """One validated row, before the time window and the duplicate check decide whether it is kept;
    ``spec`` builds the job only then (most rows of a long trace fall outside a short window)."""

    name: str
    submit: float
    spec: Callable[[], JobSpec]


@dataclass(frozen=True, slots=True)
class JobFormat:
    """A job-list format: its name, the columns that identify it, and how a file and a row map to jobs."""

    name: str
    columns: tuple[str, ...]
    vc_of: Callable[[Path], str]
    """The virtual cluster of a file's jobs (the formats have one VC per file, named by the file)."""
    row: Callable[[str, Row, HostDefaults], ParsedJob]
    """Parse one row of a file of VC ``vc``; raises ``InvalidInputError`` naming ``file:line`` and column."""
