"""A node's GPUs from NVIDIA's GPU Feature Discovery labels, where no kubecell node agent runs.

A cluster can run kubecell's scheduler before (or without) its node agent; its GPU nodes then carry only
what NVIDIA's stack writes: GFD's labels ``nvidia.com/gpu.product``, ``gpu.memory`` (MiB per GPU) and
``gpu.count``, and NVIDIA's device plugin's ``nvidia.com/gpu`` capacity. That is enough to place work, with
less than an inventory gives: identical GPUs, no topology below the node, all assumed healthy. A count the
node does not advertise is cut to what it does (``kubecell.kube.advertised``).

Labels are text anyone who can edit a Node writes, so every number is ASCII digits with its length and range
checked before ``int`` reads it, and a bad one is an ``InvalidInputError`` naming the node and the label.
``catalog_model`` also maps NVML's product names for the node agent, which is why it lives here, with the
other reader of vendor names, rather than in the inventory schema. Split from ``kubecell.kube.inventory``,
which turns these GPUs into the node's view.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from kubecell.core.errors import InvalidInputError
from kubecell.core.limits import MAX_GPU_MEMORY_MIB, MAX_GPUS_PER_NODE
from kubecell.core.model import GPU_MODELS, UNKNOWN_GPU_MEMORY_MIB, Gpu
from kubecell.kube.advertised import advertised_gpus, advertised_resource, node_value_error
from kubecell.kube.dialects.resources import MAX_NUMBER_CHARS
from kubecell.kube.names import GFD_COUNT, GFD_MEMORY, GFD_PRODUCT, NVIDIA_GPU

_DIGITS = re.compile(r"[0-9]+")


def catalog_model(product: str, memory_mib: int | None = None) -> str:
    """Map a vendor product name (NVML or GFD) to the catalog's model name, else keep the product."""
    key = re.sub(r"[^A-Z0-9]", "", product.upper().replace("NVIDIA", "").replace("TESLA", ""))
    if key in {re.sub(r"[^A-Z0-9]", "", name.upper()) for name in GPU_MODELS}:
        return next(name for name in GPU_MODELS if re.sub(r"[^A-Z0-9]", "", name.upper()) == key)
    for family, large, small in (("A100", "A100-80G", "A100"), ("V100", "V100M32", "V100M16")):
        if family in key:
            big = "80" in key if family == "A100" else "32" in key
            if memory_mib:
                big = memory_mib > GPU_MODELS[small].memory_mib * 1.2
            return large if big else small
    for name in sorted(GPU_MODELS, key=len, reverse=True):
        if len(name) > 2 and re.sub(r"[^A-Z0-9]", "", name.upper()) in key:
            return name
    return product


def _label_number(name: str, labels: Mapping[str, Any], key: str, high: int, accepted: str) -> int | None:
    """A whole number in a GFD label: None where the label is absent or empty; ASCII digits, their length
    and range checked before ``int`` reads them."""
    raw = labels.get(key)
    if raw is None or raw == "":
        return None
    text = raw.strip() if isinstance(raw, str) else ""
    if len(text) > MAX_NUMBER_CHARS:
        raise node_value_error(name, f"label {key}", raw, f"is {len(text)} characters long, not a count", accepted)
    if not _DIGITS.fullmatch(text):
        raise node_value_error(name, f"label {key}", raw, "is not a whole number", accepted)
    digits = text.lstrip("0") or "0"
    if len(digits) > len(str(high)) or int(digits) > high:
        raise node_value_error(name, f"label {key}", raw, "is out of range", accepted)
    return int(digits)


def _gfd_memory(name: str, labels: Mapping[str, Any]) -> int | None:
    """``nvidia.com/gpu.memory`` (MiB per GPU); None where it is absent or not digits (GFD writes digits, and
    a label it did not write is left for the catalog's size, as before); digits beyond what a GPU may have
    are refused."""
    raw = labels.get(GFD_MEMORY, "")
    if not isinstance(raw, str) or not _DIGITS.fullmatch(raw):
        return None
    digits = raw.lstrip("0") or "0"
    if len(digits) > len(str(MAX_GPU_MEMORY_MIB)) or int(digits) > MAX_GPU_MEMORY_MIB:
        raise node_value_error(name, f"label {GFD_MEMORY}", raw, "is more MiB than a GPU may have",
                               f"0..{MAX_GPU_MEMORY_MIB} MiB")
    return int(digits)


def gfd_gpus(obj: Mapping[str, Any], name: str, labels: Mapping[str, Any]) -> tuple[tuple[Gpu, ...], str]:
    """The node's GPUs from GFD's labels (else the ``nvidia.com/gpu`` it advertises): identical, all healthy,
    indices 0..n-1; and the note saying what was cut when the labels count more GPUs than the node advertises
    (empty when nothing was). No GPUs where neither labels nor capacity count any."""
    # any count is read here: one beyond what the node advertises is cut to it before the node's limit applies
    label_count = _label_number(name, labels, GFD_COUNT, 2**63 - 1,
                                f"a whole number of GPUs in digits 0-9, at most {MAX_GPUS_PER_NODE} on a node")
    if label_count is not None:
        count, listing = label_count, f"label {GFD_COUNT}"
    else:
        plain = advertised_resource(name, obj, NVIDIA_GPU)
        count, listing = plain or 0, NVIDIA_GPU
    if not count:
        return (), ""
    note = ""
    advertised = advertised_gpus(name, obj, mig=False)
    if advertised is not None and advertised.count < count:
        note = (f"{listing} lists {count} GPUs but the node advertises {advertised.resource}: {advertised.count}; "
                f"using {advertised.count}")
        count = advertised.count
    if count > MAX_GPUS_PER_NODE:
        where = f"label {GFD_COUNT}" if label_count is not None else f"{NVIDIA_GPU} (allocatable, else capacity)"
        raise InvalidInputError(f"{count} GPUs are more than a node may have", location=f"node {name}: {where}",
                                accepted=f"0..{MAX_GPUS_PER_NODE} GPUs")
    if not count:
        return (), note
    product = labels.get(GFD_PRODUCT, "")
    product = product if isinstance(product, str) else ""
    label_memory = _gfd_memory(name, labels)
    model = catalog_model(product, label_memory) if product else "unknown"
    spec = GPU_MODELS.get(model)
    gpu_memory = label_memory if label_memory is not None else (spec.memory_mib if spec else UNKNOWN_GPU_MEMORY_MIB)
    return tuple(Gpu(i, model, gpu_memory) for i in range(count)), note
