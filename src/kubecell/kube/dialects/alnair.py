"""Alnair's vGPU dialect: ``alnair/vgpu-memory`` (GiB of one GPU) and ``alnair/vgpu-compute`` (percent).

Alnair (``CentaurusInfra/alnair``) advertises each GPU as chunks of two extended resources
(``alnair-device-plugin/pkg/devicepluginserver/server.go``): ``alnair/vgpu-memory``, one device per GiB
of the GPU's memory (``gpuMemoryChunkSize``), and ``alnair/vgpu-compute``, 100 devices per GPU, one per
percent of its compute. Its scheduler plugin adds the containers' ``vgpu-memory`` limits up
(``autonomous-scheduler/vGPUScheduler/pkg/utils/nodeinfo.go``, ``GetGPUMemoryFromPodResource``) and fits
the sum on one GPU, so the pod's total counts here too.

Either resource alone is a share of that alone, both a share of both. ``vgpu-compute`` must be below 100:
Alnair shares GPUs, and a whole GPU is asked for as whole GPUs. Alnair enforces the share with its CUDA
interception library; under kubecell the pod's ``kubecell.io/isolation`` applies instead.
"""

from __future__ import annotations

from kubecell.kube import names
from kubecell.kube.dialects.resources import WHOLE_ASK_HINT, share_memory_mib, whole_number
from kubecell.kube.dialects.statement import GpuAsk, Reading, Statement


class Alnair(Statement):
    """What Alnair's vGPU resources state."""

    dialect = "alnair"

    def ask(self) -> GpuAsk | None:
        """A share of one GPU: compute from ``vgpu-compute``, memory from ``vgpu-memory``."""
        pod, totals = self.pod, self.reading.totals
        memory_raw = totals.get(names.ALNAIR_VGPU_MEMORY)
        compute_raw = totals.get(names.ALNAIR_VGPU_COMPUTE)
        if memory_raw is None and compute_raw is None:
            return None
        subject, milli, mib = [], 0, 0
        if compute_raw is not None:
            percent = whole_number(pod, names.ALNAIR_VGPU_COMPUTE, compute_raw)
            where = f"{names.ALNAIR_VGPU_COMPUTE} {percent}"
            subject.append(where)
            if not 1 <= percent <= 99:
                raise pod.error(where, "is not a percent of one GPU below 100", field=names.ALNAIR_VGPU_COMPUTE,
                                accepted=f"1..99 (Alnair's vGPUs share a GPU), or {WHOLE_ASK_HINT}")
            milli = percent * 10
        if memory_raw is not None:
            amount = whole_number(pod, names.ALNAIR_VGPU_MEMORY, memory_raw)
            where = f"{names.ALNAIR_VGPU_MEMORY} {amount}"
            subject.append(where)
            per_unit = names.GPU_MEMORY_MIB_PER_UNIT[names.ALNAIR_VGPU_MEMORY]
            mib = share_memory_mib(pod, where, names.ALNAIR_VGPU_MEMORY, amount * per_unit, self.reading.options, "GiB")
        field = names.ALNAIR_VGPU_MEMORY if memory_raw is not None else names.ALNAIR_VGPU_COMPUTE
        return GpuAsk("alnair", field, " with ".join(subject), 1, milli, mib)


def read(reading: Reading) -> Statement:
    """Alnair's dialect on the pod (read when asked)."""
    return Alnair(reading)
