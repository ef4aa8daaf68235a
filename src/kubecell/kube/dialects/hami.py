"""HAMi's vGPU dialect: a share of each GPU written as container resources, and GPU type filters.

HAMi (``Project-HAMi/HAMi``, ``pkg/device/nvidia/device.go``) reads, per container
(``GenerateResourceRequests``): ``nvidia.com/gpu`` as the number of GPUs, each with ``nvidia.com/gpumem``
MiB (which wins over ``nvidia.com/gpumem-percentage``) and ``nvidia.com/gpucores`` percent of its
compute; its webhook (``mutateContainerResource``) gives a container with a share but no count one GPU
(``DefaultGPUNum``). Pod annotations ``nvidia.com/use-gputype`` and ``nvidia.com/nouse-gputype`` are comma
lists matched against the GPU type as case-insensitive substrings (``checkGPUtype``).

kubecell reads one GPU with a share as a share of one GPU: compute from the cores, memory from gpumem. A
memory *percentage* cannot become MiB before a GPU is chosen (GPUs differ), so it is counted as that share
of the GPU (percent x 10 milli). 100 % of compute or of memory is the whole GPU, and so is a share of nothing
(``gpucores: 0`` and HAMi's default of all of a GPU's memory). N > 1 GPUs with a share has no core shape
and is refused, as are shares in several containers (kubecell gives a pod one share of one GPU).

Without any HAMi share ``nvidia.com/gpu`` is plain whole GPUs, read by ``nvidia``; with one, this module
reads it and ``nvidia`` stands aside (``carries_share``).
"""

from __future__ import annotations

from decimal import Decimal

from kubecell.core.model import MILLI_PER_GPU
from kubecell.kube import names
from kubecell.kube.dialects.demand import PodMeta, show
from kubecell.kube.dialects.models import bounded, model_filter, split_list
from kubecell.kube.dialects.resources import (
    container_amounts_of,
    containers_asking,
    gpu_count,
    share_memory_mib,
    whole_number,
)
from kubecell.kube.dialects.statement import GpuAsk, Reading, Stated, Statement

SHARES = (names.HAMI_GPU_MEM, names.HAMI_GPU_MEM_PERCENTAGE, names.HAMI_GPU_CORES)
"""HAMi's share resources: any of them on a container makes its ``nvidia.com/gpu`` a HAMi vGPU count."""


def carries_share(reading: Reading) -> bool:
    """Whether any container (init containers included) states a HAMi share. The pod's totals name every
    resource any container names, so most pods are answered without looking at their containers."""
    return any(name in reading.totals for name in SHARES) and bool(containers_asking(reading.pod, SHARES))


def _percent(pod: PodMeta, name: str, value: Decimal, *, low: int) -> int:
    percent = whole_number(pod, name, value)
    if not low <= percent <= 100:
        raise pod.error(f"{name} {percent}", f"is outside {low}..100 percent", field=name,
                        accepted=f"{low}..100 (percent of one GPU)")
    return percent


class Hami(Statement):
    """What HAMi's share resources and GPU type annotations state."""

    dialect = "hami"

    def ask(self) -> GpuAsk | None:
        """The HAMi share of the one container that states one, as a share of one GPU or whole GPUs."""
        pod = self.pod
        if not carries_share(self.reading):
            return None
        asking = containers_asking(pod, SHARES)
        gpu_containers = containers_asking(pod, (*SHARES, names.NVIDIA_GPU))
        if len(gpu_containers) > 1:
            raise pod.error(f"HAMi resources in containers {', '.join(gpu_containers)}",
                            "HAMi shares are per container, and kubecell gives a pod one share of one GPU",
                            field=names.HAMI_GPU_MEM, accepted="the GPU ask in one container of the pod")
        amounts = container_amounts_of(pod, asking[0])
        raw_count = amounts.get(names.NVIDIA_GPU)
        count = gpu_count(pod, names.NVIDIA_GPU, raw_count) if raw_count is not None else 1  # HAMi's default
        subject = [f"{names.NVIDIA_GPU} {count}"] if raw_count is not None else []
        milli = 0
        if names.HAMI_GPU_CORES in amounts:
            cores = _percent(pod, names.HAMI_GPU_CORES, amounts[names.HAMI_GPU_CORES], low=0)
            subject.append(f"{names.HAMI_GPU_CORES} {cores}")
            milli = cores * 10
        memory = 0
        if names.HAMI_GPU_MEM in amounts:
            value = whole_number(pod, names.HAMI_GPU_MEM, amounts[names.HAMI_GPU_MEM])
            where = f"{names.HAMI_GPU_MEM} {value}"
            subject.append(where)
            memory = share_memory_mib(pod, where, names.HAMI_GPU_MEM, value, self.reading.options, "MiB")
        elif names.HAMI_GPU_MEM_PERCENTAGE in amounts:
            percent = _percent(pod, names.HAMI_GPU_MEM_PERCENTAGE, amounts[names.HAMI_GPU_MEM_PERCENTAGE], low=1)
            subject.append(f"{names.HAMI_GPU_MEM_PERCENTAGE} {percent}")
            milli = max(milli, percent * 10)
        text = " with ".join(subject)
        if milli >= MILLI_PER_GPU or (milli == 0 and memory == 0):
            # all of a GPU's compute or memory (or gpucores 0 and HAMi's default of all its memory): whole GPUs
            return GpuAsk("hami", names.NVIDIA_GPU, text, count, MILLI_PER_GPU) if count else None
        if count == 0:
            raise pod.error(text, "asks for a share of zero GPUs", field=names.NVIDIA_GPU,
                            accepted=f"{names.NVIDIA_GPU}: 1 with a HAMi share")
        if count > 1:
            raise pod.error(text, f"asks for a share of each of {count} GPUs; kubecell places a share on one GPU, "
                            "or whole GPUs", field=names.NVIDIA_GPU,
                            accepted=f"{names.NVIDIA_GPU}: 1 with a share, or {names.NVIDIA_GPU}: {count} without one")
        return GpuAsk("hami", names.NVIDIA_GPU, text, 1, milli, memory)

    def models(self) -> list[Stated[frozenset[str]]]:
        """``use-gputype`` (the models it selects) and ``nouse-gputype`` (the models it does not), each a
        filter of its own; blank ones say nothing."""
        notes, filters = self.pod.annotations, []
        for key, exclude in ((names.HAMI_USE_GPU_TYPE, False), (names.HAMI_NOUSE_GPU_TYPE, True)):
            if notes.get(key, "").strip():
                subject = f"annotation {key} {show(notes[key])}"
                filters.append(model_filter(self.pod, self.reading.options.known_models, "hami", key, subject,
                                            split_list(bounded(self.pod, key, subject, notes[key])), "substring",
                                            exclude=exclude))
        return filters


def read(reading: Reading) -> Statement:
    """HAMi's dialect on the pod (read when asked)."""
    return Hami(reading)
