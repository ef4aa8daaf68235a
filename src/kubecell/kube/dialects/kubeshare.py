"""KubeShare 2.0's dialect: pod labels for a share, a GPU model, a priority and a gang.

KubeShare (``NTHU-LSALAB/KubeShare``) reads pod labels only: ``pkg/scheduler/pod.go`` the share
(``sharedgpu/gpu_request``, a fraction of a GPU's time, above 1 a whole number of GPUs;
``sharedgpu/gpu_limit``, its burst ceiling; ``sharedgpu/gpu_mem``, bytes of one GPU), the model
(``sharedgpu/gpu_model``, the product name with dashes) and the priority (``sharedgpu/priority``: 0
opportunistic, 1..100 guaranteed), ``pkg/scheduler/pod_group.go`` the gang (``sharedgpu/group_name``,
``group_headcount``, and ``group_threshold``, the fraction of the headcount that must start together:
the minimum is ``floor(threshold x headcount + 0.5)``, rounded half up).

kubecell reserves the request (the limit where no request is given) and only checks the limit;
fractions finer than 1/1000 round up, bytes round up to MiB, and a ``gpu_mem`` beside a whole GPU adds
nothing (a whole GPU is exclusive). Without a priority label the pod keeps its own priority (KubeShare
would make it opportunistic). KubeShare's README names the group label ``sharedgpu/pod_group_name``, which
its code never reads: kubecell refuses it with that reason rather than ignore a gang the user meant.
"""

from __future__ import annotations

import math
import re
from decimal import ROUND_HALF_UP, Decimal

from kubecell.core.limits import MAX_GPUS_PER_NODE
from kubecell.core.model import MILLI_PER_GPU
from kubecell.kube import names
from kubecell.kube.dialects.demand import OPPORTUNISTIC, PodMeta, show
from kubecell.kube.dialects.models import bounded, model_filter
from kubecell.kube.dialects.resources import (
    DECIMAL_FORMS,
    MAX_NUMBER_CHARS,
    QuantityError,
    count_text,
    parse_decimal,
    share_memory_mib,
)
from kubecell.kube.dialects.statement import GpuAsk, GroupClaim, Reading, Stated, Statement, group_name


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


class Kubeshare(Statement):
    """What KubeShare's labels state."""

    dialect = "kubeshare"

    def ask(self) -> GpuAsk | None:
        """``gpu_request`` / ``gpu_limit`` / ``gpu_mem`` as a share of one GPU, or whole GPUs above 1."""
        pod = self.pod
        request = _label_number(pod, names.KUBESHARE_GPU_REQUEST)
        limit = _label_number(pod, names.KUBESHARE_GPU_LIMIT)
        memory_bytes = _label_number(pod, names.KUBESHARE_GPU_MEM)
        if request is None and limit is None and memory_bytes is None:
            return None
        share_name = names.KUBESHARE_GPU_REQUEST if request is not None else names.KUBESHARE_GPU_LIMIT
        share = request if request is not None else (limit if limit is not None else Decimal(0))
        subject = [f"label {name} {show(pod.labels[name])}" for name in
                   (names.KUBESHARE_GPU_REQUEST, names.KUBESHARE_GPU_LIMIT, names.KUBESHARE_GPU_MEM)
                   if name in pod.labels]
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
                raise pod.label_error(names.KUBESHARE_GPU_MEM, "is not a whole number of bytes",
                                      "bytes, e.g. 4294967296")
            mib = math.ceil(memory_bytes / 2**20)
            memory = share_memory_mib(pod, f"label {names.KUBESHARE_GPU_MEM} "
                                      f"{show(pod.labels[names.KUBESHARE_GPU_MEM])}", names.KUBESHARE_GPU_MEM, mib,
                                      self.reading.options, "bytes")
        if milli == 0 and memory == 0:
            raise pod.error(text, "asks for nothing of a GPU: a share of 0 and no memory", field=share_name,
                            accepted="gpu_request above 0 and/or gpu_mem above 0; no labels for a pod without GPUs")
        return GpuAsk("kubeshare", share_name if milli else names.KUBESHARE_GPU_MEM, text, 1, milli, memory)

    def models(self) -> list[Stated[frozenset[str]]]:
        """``gpu_model``: one product name, matched as the same model in the catalog's spelling."""
        text = self.pod.labels.get(names.KUBESHARE_GPU_MODEL, "")
        if not text.strip():
            return []
        subject = f"label {names.KUBESHARE_GPU_MODEL} {show(text)}"
        wanted = [bounded(self.pod, names.KUBESHARE_GPU_MODEL, subject, text).strip()]
        return [model_filter(self.pod, self.reading.options.known_models, "kubeshare", names.KUBESHARE_GPU_MODEL,
                             subject, wanted, "product")]

    def groups(self) -> list[GroupClaim]:
        """``group_name``, ``group_headcount`` and ``group_threshold``: all three or none."""
        pod, labels = self.pod, self.pod.labels
        if names.KUBESHARE_README_GROUP_NAME in labels:
            raise pod.label_error(names.KUBESHARE_README_GROUP_NAME, "is named in KubeShare's README but KubeShare "
                                  f"reads {names.KUBESHARE_GROUP_NAME}", f"label {names.KUBESHARE_GROUP_NAME}")
        name = labels.get(names.KUBESHARE_GROUP_NAME)
        if name is None:
            for extra in (names.KUBESHARE_GROUP_HEADCOUNT, names.KUBESHARE_GROUP_THRESHOLD):
                if extra in labels:
                    raise pod.label_error(extra, f"is set without {names.KUBESHARE_GROUP_NAME}",
                                          f"{names.KUBESHARE_GROUP_NAME} naming the group, or neither")
            return []
        group = group_name(pod, name, f"label {names.KUBESHARE_GROUP_NAME} {show(name)}", names.KUBESHARE_GROUP_NAME)
        for needed in (names.KUBESHARE_GROUP_HEADCOUNT, names.KUBESHARE_GROUP_THRESHOLD):
            if needed not in labels:
                raise pod.label_error(names.KUBESHARE_GROUP_NAME, f"names a group without {needed} (KubeShare then "
                                      "ignores the group)", f"both {names.KUBESHARE_GROUP_HEADCOUNT} and "
                                      f"{names.KUBESHARE_GROUP_THRESHOLD}")
        head_text = labels[names.KUBESHARE_GROUP_HEADCOUNT]
        size = count_text(pod, head_text, f"label {names.KUBESHARE_GROUP_HEADCOUNT} {show(head_text)}",
                          names.KUBESHARE_GROUP_HEADCOUNT, 1)
        try:
            threshold = parse_decimal(labels[names.KUBESHARE_GROUP_THRESHOLD],
                                      "a fraction of the headcount in (0, 1], e.g. 0.5")
        except QuantityError as error:
            raise pod.label_error(names.KUBESHARE_GROUP_THRESHOLD, error.reason, error.accepted) from None
        if not 0 < threshold <= 1:
            raise pod.label_error(names.KUBESHARE_GROUP_THRESHOLD, "is not a fraction of the headcount",
                                  "a number in (0, 1], e.g. 0.5")
        minimum = int((threshold * size).quantize(Decimal(1), rounding=ROUND_HALF_UP))
        if minimum < 1:
            raise pod.label_error(names.KUBESHARE_GROUP_THRESHOLD, f"of {size} pods rounds to no pod at all",
                                  f"at least {Decimal(1) / (2 * size):.3g} for a headcount of {size}")
        return [GroupClaim("kubeshare", names.KUBESHARE_GROUP_NAME,
                           f"label {names.KUBESHARE_GROUP_NAME} {show(name)}", group, size, minimum)]

    def priority(self) -> Stated[int] | None:
        """``priority``: 0 (or -1) is opportunistic, 1..100 that priority."""
        if names.KUBESHARE_PRIORITY not in self.pod.labels:
            return None
        value = self.pod.labels[names.KUBESHARE_PRIORITY].strip()
        # ASCII digits (``\d`` would read "١" as 1), and never thousands of them (``int`` refuses > 4,300)
        number = int(value) if len(value) <= MAX_NUMBER_CHARS and re.fullmatch(r"-?[0-9]+", value) else None
        if number is None or not -1 <= number <= 100:
            raise self.pod.label_error(names.KUBESHARE_PRIORITY, "is not a KubeShare priority",
                                       "0 (opportunistic) or 1..100 (guaranteed)")
        return Stated("kubeshare", names.KUBESHARE_PRIORITY, f"label {names.KUBESHARE_PRIORITY} {show(value)}",
                      OPPORTUNISTIC if number <= 0 else number)


def read(reading: Reading) -> Statement:
    """KubeShare's dialect on the pod (read when asked)."""
    return Kubeshare(reading)
