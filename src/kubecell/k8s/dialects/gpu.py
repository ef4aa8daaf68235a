"""GPU asks in every resource and label dialect, each turned into the one shape the core places.

The core knows three shapes (``kubecell.core.model.Request``): no GPU; a share of one GPU (milli-GPU of
its compute and/or MiB of its memory: ``gpu_count=1, gpu_milli<1000``, a memory-only share has
``gpu_milli=0``); N whole GPUs (``gpu_milli=1000``). Each reader below maps one dialect onto that, and
refuses what has no such shape (a fraction on each of several GPUs) or no meaning (a share of 0) with a
message naming the pod and the value. Where a pod carries two dialects, they must ask for the same
thing; a pod is never given the larger or the smaller of two contradicting asks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal

from kubecell.core.limits import MAX_GPUS_PER_NODE
from kubecell.core.model import MILLI_PER_GPU
from kubecell.k8s import names
from kubecell.k8s.dialects.demand import DialectOptions, PodMeta, show
from kubecell.k8s.dialects.resources import (
    DECIMAL_FORMS,
    QuantityError,
    container_amounts_of,
    containers_asking,
    number_text,
    parse_decimal,
)

WHOLE_ASK_HINT = "kubecell.io/gpu: N or nvidia.com/gpu: N for N whole GPUs"


@dataclass(frozen=True, slots=True)
class GpuAsk:
    """One dialect's GPU ask, per GPU: ``count`` GPUs with ``milli`` and ``memory_mib`` of each."""

    dialect: str
    field: str
    subject: str
    count: int
    milli: int
    memory_mib: int = 0

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.count, self.milli, self.memory_mib)

    def describe(self) -> str:
        if self.milli == MILLI_PER_GPU:
            return f"{self.count} whole GPU" + ("s" if self.count != 1 else "")
        parts = [f"{self.milli} milli"] if self.milli else []
        parts += [f"{self.memory_mib} MiB"] if self.memory_mib else []
        return " and ".join(parts) + " of one GPU"


def _whole_number(pod: PodMeta, name: str, value: Decimal) -> int:
    """A container resource amount that must be a whole number (every extended resource is)."""
    if value != value.to_integral_value():
        raise pod.error(f"{name} {number_text(value)}", "is not a whole number",
                        field=name, accepted="whole numbers (extended resources cannot be fractional)")
    return int(value)


def _gpu_count(pod: PodMeta, name: str, value: Decimal) -> int:
    count = _whole_number(pod, name, value)
    if count < 0:
        raise pod.error(f"{name} {count}", "asks for a negative number of GPUs", field=name,
                        accepted=f"0..{MAX_GPUS_PER_NODE}")
    if count > MAX_GPUS_PER_NODE:
        raise pod.error(f"{name} {count}", "asks for more GPUs than one node has", field=name,
                        accepted=f"0..{MAX_GPUS_PER_NODE} (a pod's GPUs sit on one node; use a group of pods)")
    return count


def _memory_mib(pod: PodMeta, subject: str, field: str, mib: int, options: DialectOptions, unit: str) -> int:
    if mib <= 0:
        raise pod.error(subject, "a share of no GPU memory is no share", field=field,
                        accepted=f"a positive amount in {unit}; none for a pod without GPUs")
    if mib > options.largest_gpu_memory_mib:
        raise pod.error(subject, f"asks {mib} MiB of one GPU, more than the largest GPU's "
                        f"{options.largest_gpu_memory_mib} MiB", field=field,
                        accepted=f"at most {options.largest_gpu_memory_mib} MiB, or {WHOLE_ASK_HINT}")
    return mib


def kubecell_ask(pod: PodMeta, totals: Mapping[str, Decimal], options: DialectOptions) -> GpuAsk | None:
    """``kubecell.io/gpu`` (whole GPUs), ``kubecell.io/gpu-milli`` (1..1000 of one GPU's compute),
    ``kubecell.io/gpu-memory`` (MiB of one GPU); whole GPUs and a share are never mixed."""
    whole = totals.get(names.RESOURCE_GPU)
    milli_raw = totals.get(names.RESOURCE_GPU_MILLI)
    memory_raw = totals.get(names.RESOURCE_GPU_MEMORY)
    count = _gpu_count(pod, names.RESOURCE_GPU, whole) if whole is not None else 0
    if count:
        if milli_raw is not None or memory_raw is not None:
            other = names.RESOURCE_GPU_MILLI if milli_raw is not None else names.RESOURCE_GPU_MEMORY
            raise pod.error(f"{names.RESOURCE_GPU} {count} with {other}", "whole GPUs are exclusive, so a share "
                            "of each makes no sense", field=names.RESOURCE_GPU,
                            accepted=f"{names.RESOURCE_GPU} alone, or {names.RESOURCE_GPU_MILLI} and/or "
                            f"{names.RESOURCE_GPU_MEMORY} alone")
        return GpuAsk("kubecell", names.RESOURCE_GPU, f"{names.RESOURCE_GPU} {count}", count, MILLI_PER_GPU)
    if milli_raw is None and memory_raw is None:
        return None
    milli = 0
    subject = []
    if milli_raw is not None:
        milli = _whole_number(pod, names.RESOURCE_GPU_MILLI, milli_raw)
        where = f"{names.RESOURCE_GPU_MILLI} {milli}"
        subject.append(where)
        if milli <= 0:
            raise pod.error(where, "a share of 0 milli-GPU or less is no share", field=names.RESOURCE_GPU_MILLI,
                            accepted="1..999 for a share of one GPU, 1000 for one whole GPU")
        if milli > MILLI_PER_GPU:
            raise pod.error(where, "asks more than one GPU's compute; a share is a part of one GPU",
                            field=names.RESOURCE_GPU_MILLI, accepted=f"1..1000, or {WHOLE_ASK_HINT}")
    memory = 0
    if memory_raw is not None:
        memory_value = _whole_number(pod, names.RESOURCE_GPU_MEMORY, memory_raw)
        where = f"{names.RESOURCE_GPU_MEMORY} {memory_value}"
        subject.append(where)
        memory = _memory_mib(pod, where, names.RESOURCE_GPU_MEMORY, memory_value, options, "MiB")
    if milli == MILLI_PER_GPU and memory:
        raise pod.error(" with ".join(subject), "a whole GPU (1000 milli) is exclusive, so a memory share of it "
                        "makes no sense", field=names.RESOURCE_GPU_MEMORY,
                        accepted=f"{names.RESOURCE_GPU_MILLI} below 1000 with a memory share, or no memory")
    field = names.RESOURCE_GPU_MILLI if milli_raw is not None else names.RESOURCE_GPU_MEMORY
    return GpuAsk("kubecell", field, " with ".join(subject), 1, milli, memory)


_HAMI_SHARES = (names.HAMI_GPU_MEM, names.HAMI_GPU_MEM_PERCENTAGE, names.HAMI_GPU_CORES)


def _percent(pod: PodMeta, name: str, value: Decimal, *, low: int) -> int:
    percent = _whole_number(pod, name, value)
    if not low <= percent <= 100:
        raise pod.error(f"{name} {percent}", f"is outside {low}..100 percent", field=name,
                        accepted=f"{low}..100 (percent of one GPU)")
    return percent


def nvidia_ask(pod: PodMeta, totals: Mapping[str, Decimal], options: DialectOptions) -> GpuAsk | None:
    """Plain ``nvidia.com/gpu: N`` (N whole GPUs), or HAMi's vGPUs when a HAMi share is given.

    HAMi reads ``nvidia.com/gpu`` as the number of GPUs, each with ``gpumem`` MiB (which wins over
    ``gpumem-percentage``, as in HAMi) and ``gpucores`` percent of its compute. kubecell reads that as a
    share of one GPU: compute from the cores, memory from gpumem; a memory *percentage* cannot become MiB
    before a GPU is chosen (GPUs differ), so it is counted as that share of the GPU. 100 % of compute or
    of memory is the whole GPU. Without a share, ``nvidia.com/gpu`` means whole GPUs, as under NVIDIA's
    device plugin. HAMi shares are per container, so they must sit in one container.
    """
    asking = containers_asking(pod, _HAMI_SHARES)
    if not asking:
        raw = totals.get(names.NVIDIA_GPU)
        count = _gpu_count(pod, names.NVIDIA_GPU, raw) if raw is not None else 0
        if not count:
            return None
        return GpuAsk("nvidia", names.NVIDIA_GPU, f"{names.NVIDIA_GPU} {count}", count, MILLI_PER_GPU)
    gpu_containers = containers_asking(pod, (*_HAMI_SHARES, names.NVIDIA_GPU))
    if len(gpu_containers) > 1:
        raise pod.error(f"HAMi resources in containers {', '.join(gpu_containers)}",
                        "HAMi shares are per container, and kubecell gives a pod one share of one GPU",
                        field=names.HAMI_GPU_MEM, accepted="the GPU ask in one container of the pod")
    amounts = container_amounts_of(pod, asking[0])
    raw_count = amounts.get(names.NVIDIA_GPU)
    count = _gpu_count(pod, names.NVIDIA_GPU, raw_count) if raw_count is not None else 1  # HAMi's default
    subject = [f"{names.NVIDIA_GPU} {count}"] if raw_count is not None else []
    milli = 0
    if names.HAMI_GPU_CORES in amounts:
        cores = _percent(pod, names.HAMI_GPU_CORES, amounts[names.HAMI_GPU_CORES], low=0)
        subject.append(f"{names.HAMI_GPU_CORES} {cores}")
        milli = cores * 10
    memory = 0
    if names.HAMI_GPU_MEM in amounts:
        value = _whole_number(pod, names.HAMI_GPU_MEM, amounts[names.HAMI_GPU_MEM])
        where = f"{names.HAMI_GPU_MEM} {value}"
        subject.append(where)
        memory = _memory_mib(pod, where, names.HAMI_GPU_MEM, value, options, "MiB")
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


def aliyun_ask(pod: PodMeta, totals: Mapping[str, Decimal], options: DialectOptions) -> GpuAsk | None:
    """gpushare: ``aliyun.com/gpu-mem`` is memory of one GPU (the pod's total, in GiB unless the device
    plugin counts MiB), ``aliyun.com/gpu-count`` may only say 1: gpushare never placed memory shares
    on several GPUs (its multi-GPU support is a known gap)."""
    raw = totals.get(names.ALIYUN_GPU_MEM)
    raw_count = totals.get(names.ALIYUN_GPU_COUNT)
    count = _gpu_count(pod, names.ALIYUN_GPU_COUNT, raw_count) if raw_count is not None else 0
    if raw is None:
        if count:
            raise pod.error(f"{names.ALIYUN_GPU_COUNT} {count}", f"asks for GPUs without {names.ALIYUN_GPU_MEM}; "
                            "gpushare reads no ask from the count alone", field=names.ALIYUN_GPU_COUNT,
                            accepted=f"{names.ALIYUN_GPU_MEM} with {names.ALIYUN_GPU_COUNT} 1, or {WHOLE_ASK_HINT}")
        return None
    amount = _whole_number(pod, names.ALIYUN_GPU_MEM, raw)
    unit = options.aliyun_memory_unit
    where = f"{names.ALIYUN_GPU_MEM} {amount}"
    mib = _memory_mib(pod, where, names.ALIYUN_GPU_MEM, amount * (1024 if unit == "GiB" else 1), options, unit)
    if count > 1:
        raise pod.error(f"{where} with {names.ALIYUN_GPU_COUNT} {count}", f"asks for memory on each of {count} "
                        "GPUs; kubecell places a share on one GPU", field=names.ALIYUN_GPU_COUNT,
                        accepted=f"{names.ALIYUN_GPU_COUNT} 1, or {WHOLE_ASK_HINT}")
    return GpuAsk("aliyun", names.ALIYUN_GPU_MEM, where, 1, 0, mib)


def alnair_ask(pod: PodMeta, totals: Mapping[str, Decimal], options: DialectOptions) -> GpuAsk | None:
    """Alnair's vGPU resources: ``alnair/vgpu-memory`` is memory of one GPU in GiB (its device plugin's chunk is
    one GiB), ``alnair/vgpu-compute`` is percent of one GPU's compute and below 100 (Alnair shares GPUs; a whole
    GPU is asked for as whole GPUs). Either alone is a share of that alone; both, a share of both. The pod's
    total counts, as Alnair's scheduler adds its containers' limits."""
    memory_raw = totals.get(names.ALNAIR_VGPU_MEMORY)
    compute_raw = totals.get(names.ALNAIR_VGPU_COMPUTE)
    if memory_raw is None and compute_raw is None:
        return None
    subject, milli, mib = [], 0, 0
    if compute_raw is not None:
        percent = _whole_number(pod, names.ALNAIR_VGPU_COMPUTE, compute_raw)
        where = f"{names.ALNAIR_VGPU_COMPUTE} {percent}"
        subject.append(where)
        if not 1 <= percent <= 99:
            raise pod.error(where, "is not a percent of one GPU below 100", field=names.ALNAIR_VGPU_COMPUTE,
                            accepted=f"1..99 (Alnair's vGPUs share a GPU), or {WHOLE_ASK_HINT}")
        milli = percent * 10
    if memory_raw is not None:
        amount = _whole_number(pod, names.ALNAIR_VGPU_MEMORY, memory_raw)
        where = f"{names.ALNAIR_VGPU_MEMORY} {amount}"
        subject.append(where)
        mib = _memory_mib(pod, where, names.ALNAIR_VGPU_MEMORY, amount * 1024, options, "GiB")
    field = names.ALNAIR_VGPU_MEMORY if memory_raw is not None else names.ALNAIR_VGPU_COMPUTE
    return GpuAsk("alnair", field, " with ".join(subject), 1, milli, mib)


def _label_number(pod: PodMeta, name: str) -> Decimal | None:
    text = pod.labels.get(name)
    if text is None:
        return None
    try:
        value = parse_decimal(text, DECIMAL_FORMS)
    except QuantityError as error:
        raise pod.label_error(name, error.reason, error.accepted) from None
    if value < 0:
        raise pod.label_error(name, "is negative", "a number >= 0")
    return value


def kubeshare_ask(pod: PodMeta, options: DialectOptions) -> GpuAsk | None:
    """KubeShare's labels: ``gpu_request`` (fraction of a GPU's time, > 1 whole GPUs), ``gpu_limit`` (its
    burst ceiling, only checked: kubecell reserves the request), ``gpu_mem`` (bytes of one GPU).

    The share is the request (the limit where no request is given); fractions finer than 1/1000 round
    up; bytes round up to MiB. A whole GPU is exclusive, so a ``gpu_mem`` beside it adds nothing."""
    request = _label_number(pod, names.KUBESHARE_GPU_REQUEST)
    limit = _label_number(pod, names.KUBESHARE_GPU_LIMIT)
    memory_bytes = _label_number(pod, names.KUBESHARE_GPU_MEM)
    if request is None and limit is None and memory_bytes is None:
        return None
    share_name = names.KUBESHARE_GPU_REQUEST if request is not None else names.KUBESHARE_GPU_LIMIT
    share = request if request is not None else (limit if limit is not None else Decimal(0))
    subject = [f"label {name} {show(pod.labels[name])}" for name in
               (names.KUBESHARE_GPU_REQUEST, names.KUBESHARE_GPU_LIMIT, names.KUBESHARE_GPU_MEM) if name in pod.labels]
    text = " with ".join(subject)
    if limit is not None and share > limit:
        raise pod.error(text, "the request is above the limit", field=names.KUBESHARE_GPU_REQUEST,
                        accepted="gpu_request <= gpu_limit <= 1, or gpu_request = gpu_limit for whole GPUs")
    if share > 1:
        if share != share.to_integral_value() or (limit is not None and limit != share):
            raise pod.label_error(share_name, "asks for more than one GPU but not a whole number of GPUs "
                                  "(or a different limit)", "a fraction up to 1, or a whole number of GPUs "
                                  "with gpu_limit equal to it")
        count = int(share)
        if count > MAX_GPUS_PER_NODE:
            raise pod.label_error(share_name, "asks for more GPUs than one node has",
                                  f"at most {MAX_GPUS_PER_NODE} (a pod's GPUs sit on one node)")
        return GpuAsk("kubeshare", share_name, text, count, MILLI_PER_GPU)
    if limit is not None and limit > 1:
        raise pod.label_error(names.KUBESHARE_GPU_LIMIT, "is above 1 for a share of one GPU",
                              "gpu_request <= gpu_limit <= 1")
    milli = math.ceil(share * MILLI_PER_GPU)
    if milli == MILLI_PER_GPU:
        return GpuAsk("kubeshare", share_name, text, 1, MILLI_PER_GPU)
    memory = 0
    if memory_bytes is not None:
        if memory_bytes != memory_bytes.to_integral_value():
            raise pod.label_error(names.KUBESHARE_GPU_MEM, "is not a whole number of bytes", "bytes, e.g. 4294967296")
        mib = math.ceil(memory_bytes / 2**20)
        memory = _memory_mib(pod, f"label {names.KUBESHARE_GPU_MEM} {show(pod.labels[names.KUBESHARE_GPU_MEM])}",
                             names.KUBESHARE_GPU_MEM, mib, options, "bytes")
    if milli == 0 and memory == 0:
        raise pod.error(text, "asks for nothing of a GPU: a share of 0 and no memory", field=share_name,
                        accepted="gpu_request above 0 and/or gpu_mem above 0; no labels for a pod without GPUs")
    return GpuAsk("kubeshare", share_name if milli else names.KUBESHARE_GPU_MEM, text, 1, milli, memory)


def merge_asks(pod: PodMeta, asks: list[GpuAsk]) -> GpuAsk | None:
    """The pod's one GPU ask: dialects that agree are accepted together, any disagreement is refused."""
    if not asks:
        return None
    first = asks[0]
    for other in asks[1:]:
        if other.shape != first.shape:
            raise pod.error(f"{first.subject} and {other.subject}",
                            f"{first.dialect} asks for {first.describe()} but {other.dialect} asks for "
                            f"{other.describe()}", field=first.field,
                            accepted="one GPU ask, or the same ask in every dialect on the pod")
    return first
