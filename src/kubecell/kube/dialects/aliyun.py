"""Aliyun gpushare's dialect: ``aliyun.com/gpu-mem``, memory of one GPU.

gpushare (``AliyunContainerService/gpushare-scheduler-extender``: ``pkg/utils/const.go`` names the
resources, ``pkg/utils/pod.go``'s ``GetGPUMemoryFromPodResource`` adds the containers' limits up) reads
``aliyun.com/gpu-mem`` as the memory the pod takes on one GPU, counted in GiB unless its device plugin runs
with ``--memory-unit=MiB`` (the pod cannot say which: ``DialectOptions.aliyun_memory_unit``).
``aliyun.com/gpu-count`` may only say 1: gpushare never placed memory shares on several GPUs (its
multi-GPU support is a known gap), and a count alone asks for nothing it reads. kubecell takes the pod's
total as kube-scheduler adds it (``resources.pod_totals``: requests, else limits, init containers too).
"""

from __future__ import annotations

from kubecell.kube import names
from kubecell.kube.dialects.resources import WHOLE_ASK_HINT, gpu_count, share_memory_mib, whole_number
from kubecell.kube.dialects.statement import GpuAsk, Reading, Statement


class Aliyun(Statement):
    """What gpushare's resources state."""

    dialect = "aliyun"

    def ask(self) -> GpuAsk | None:
        """A memory-only share of one GPU."""
        pod, totals = self.pod, self.reading.totals
        raw = totals.get(names.ALIYUN_GPU_MEM)
        raw_count = totals.get(names.ALIYUN_GPU_COUNT)
        count = gpu_count(pod, names.ALIYUN_GPU_COUNT, raw_count) if raw_count is not None else 0
        if raw is None:
            if count:
                raise pod.error(f"{names.ALIYUN_GPU_COUNT} {count}", f"asks for GPUs without "
                                f"{names.ALIYUN_GPU_MEM}; gpushare reads no ask from the count alone",
                                field=names.ALIYUN_GPU_COUNT, accepted=f"{names.ALIYUN_GPU_MEM} with "
                                f"{names.ALIYUN_GPU_COUNT} 1, or {WHOLE_ASK_HINT}")
            return None
        amount = whole_number(pod, names.ALIYUN_GPU_MEM, raw)
        unit = self.reading.options.aliyun_memory_unit
        where = f"{names.ALIYUN_GPU_MEM} {amount}"
        per_unit = names.GPU_MEMORY_MIB_PER_UNIT[names.ALIYUN_GPU_MEM] if unit == "GiB" else 1
        mib = share_memory_mib(pod, where, names.ALIYUN_GPU_MEM, amount * per_unit, self.reading.options, unit)
        if count > 1:
            raise pod.error(f"{where} with {names.ALIYUN_GPU_COUNT} {count}", f"asks for memory on each of {count} "
                            "GPUs; kubecell places a share on one GPU", field=names.ALIYUN_GPU_COUNT,
                            accepted=f"{names.ALIYUN_GPU_COUNT} 1, or {WHOLE_ASK_HINT}")
        return GpuAsk("aliyun", names.ALIYUN_GPU_MEM, where, 1, 0, mib)


def read(reading: Reading) -> Statement:
    """gpushare's dialect on the pod (read when asked)."""
    return Aliyun(reading)
