"""The node agent's inventory annotation, ``kubecell.io/gpu-inventory`` (schema v1): its records and their
reading with every field's length and range checked (the agent, an operator or a device plugin writes it, so
it is untrusted input). The node agent writes it with these classes; the scheduler reads it with
``parse_inventory`` and turns it into a node through ``kubecell.kube.inventory``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kubecell.core.errors import InvalidInputError
from kubecell.core.limits import MAX_GPU_MEMORY_MIB, MAX_GPUS_PER_NODE
from kubecell.core.shown import shown
from kubecell.kube.annotation_json import AnnotationJsonError, load_annotation_json
from kubecell.kube.names import ANNOTATION_INVENTORY

INVENTORY_SCHEMA = "kubecell.io/gpu-inventory/v1"

MAX_INVENTORY_CHARS = 256 * 1024
"""The longest inventory annotation read: the API server's limit for all of an object's annotations together,
so no Node the API server accepted carries a longer one (an inventory of 64 GPUs with seven MIG instances each
is about 100 KiB)."""
MAX_UUID_CHARS = 128
"""A GPU or MIG instance UUID (NVML's are 40 characters: ``GPU-`` or ``MIG-`` and a UUID)."""
MAX_PRODUCT_CHARS = 128
"""A model or product name (NVML's device name buffer holds 96 bytes)."""
MAX_TEXT_CHARS = 253
"""Other text of an inventory (the agent's name and version, the heartbeat)."""
MAX_GPU_INDEX = 255
MAX_NUMA_NODE = 1023
"""Linux numbers NUMA nodes below 1024 (``CONFIG_NODES_SHIFT`` is at most 10)."""
MAX_MIG_SLICE = 255
"""A MIG instance's placement in memory slices (8 on an A100 or H100), bounded so a sort key stays small."""

class MigInstanceRecord(BaseModel):
    """One MIG device of a GPU in MIG mode: profile, UUID, memory and placement (in memory slices)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    uuid: str = Field(min_length=1, max_length=MAX_UUID_CHARS)
    profile: str = Field(min_length=1, max_length=MAX_PRODUCT_CHARS)
    memory_mib: int = Field(ge=0, le=MAX_GPU_MEMORY_MIB, alias="memoryMiB")
    start: int = Field(ge=0, le=MAX_MIG_SLICE)
    size: int = Field(ge=1, le=MAX_MIG_SLICE)


class GpuRecord(BaseModel):
    """One GPU as the node agent reports it. ``migInstances`` is optional (absent before MIG support, and
    left out of the annotation when empty, so schedulers that predate it keep reading MIG-less nodes)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    index: int = Field(ge=0, le=MAX_GPU_INDEX)
    uuid: str = Field(min_length=1, max_length=MAX_UUID_CHARS)
    model: str = Field(min_length=1, max_length=MAX_PRODUCT_CHARS)
    product: str = Field(default="", max_length=MAX_PRODUCT_CHARS)
    memory_mib: int = Field(ge=0, le=MAX_GPU_MEMORY_MIB, alias="memoryMiB")
    numa_node: int | None = Field(default=None, ge=0, le=MAX_NUMA_NODE, alias="numaNode")
    nvlink_peers: list[Annotated[int, Field(ge=0, le=MAX_GPU_INDEX)]] = Field(
        default_factory=list, max_length=MAX_GPU_INDEX + 1, alias="nvlinkPeers")
    healthy: bool = True
    mig_mode: Literal["disabled", "enabled"] = Field(default="disabled", alias="migMode")
    mig_instances: list[MigInstanceRecord] = Field(default_factory=list, max_length=MAX_GPUS_PER_NODE,
                                                   alias="migInstances")


IsolationMode = Literal["accounting", "mps", "mig"]


def _accounting_only() -> list[IsolationMode]:
    return ["accounting"]


class NodeInventory(BaseModel):
    """The ``kubecell.io/gpu-inventory`` annotation (schema ``kubecell.io/gpu-inventory/v1``)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    schema_: Literal["kubecell.io/gpu-inventory/v1"] = Field(default="kubecell.io/gpu-inventory/v1", alias="schema")
    agent: str = Field(default="", max_length=MAX_TEXT_CHARS)
    heartbeat: str = Field(default="", max_length=MAX_TEXT_CHARS)
    gpus: list[GpuRecord] = Field(default_factory=list, max_length=MAX_GPU_INDEX + 1)
    isolation: list[IsolationMode] = Field(default_factory=_accounting_only, max_length=16)
    """The isolation modes the node can give a share (``accounting`` always; ``mps`` where the agent manages
    MPS control daemons; ``mig`` where MIG is enabled): a pod asking for another mode is not placed here."""
    device_plugin: bool = Field(default=False, alias="devicePlugin")
    """kubecell's device plugin serves this node: its ``Allocate`` reads the allocation record of the one
    pod bound to the node and not yet acknowledged, so the scheduler binds GPU pods here one at a time,
    each after the agent acknowledged the previous (never making the agent guess)."""

    def to_annotation(self) -> str:
        data = self.model_dump(by_alias=True, exclude_defaults=False)
        for gpu in data["gpus"]:
            if not gpu["migInstances"]:
                del gpu["migInstances"]
        # Fields added after the first schedulers shipped are written only when they say something, so a
        # scheduler that predates them (extra="forbid") still reads every node that does not use them.
        if data["isolation"] == ["accounting"]:
            del data["isolation"]
        if not data["devicePlugin"]:
            del data["devicePlugin"]
        return json.dumps(data, separators=(",", ":"))


def _dotted(path: Sequence[str | int]) -> str:
    """A key path as pydantic writes it (``gpus.0.memoryMiB``), each key cut when long."""
    return ".".join(str(part) if len(str(part)) <= 60 else shown(str(part)) for part in path)


_RANGES = {
    "gpus.*.index": f"0..{MAX_GPU_INDEX}",
    "gpus.*.memoryMiB": f"0..{MAX_GPU_MEMORY_MIB}",
    "gpus.*.numaNode": f"0..{MAX_NUMA_NODE}",
    "gpus.*.nvlinkPeers.*": f"0..{MAX_GPU_INDEX}",
    "gpus.*.migInstances.*.memoryMiB": f"0..{MAX_GPU_MEMORY_MIB}",
    "gpus.*.migInstances.*.start": f"0..{MAX_MIG_SLICE}",
    "gpus.*.migInstances.*.size": f"1..{MAX_MIG_SLICE}",
}
"""Each number's range, for a number whose digits alone put it out of range (never converted)."""


def parse_inventory(text: str, *, node: str) -> NodeInventory:
    """Parse the annotation, with an error naming the node and the problem (never a pydantic dump)."""
    where = f"node {node}: annotation {ANNOTATION_INVENTORY}"
    try:
        raw = load_annotation_json(text, max_chars=MAX_INVENTORY_CHARS)
    except json.JSONDecodeError as error:
        raise InvalidInputError(f"not JSON ({error.msg} at char {error.pos})", location=where) from None
    except AnnotationJsonError as error:
        message = f"{_dotted(error.path)}: {error.message}" if error.path else error.message
        pattern = ".".join("*" if isinstance(part, int) else part for part in error.path)
        raise InvalidInputError(message, location=where, accepted=_RANGES.get(pattern, error.accepted)) from None
    if isinstance(raw, dict) and raw.get("schema") not in (None, INVENTORY_SCHEMA):
        raise InvalidInputError(f"unsupported schema {shown(raw.get('schema'))}", location=where,
                                accepted=INVENTORY_SCHEMA)
    try:
        inventory = NodeInventory.model_validate(raw)
    except ValidationError as error:
        first = error.errors()[0]
        raise InvalidInputError(f"{_dotted(first['loc'])}: {first['msg']}", location=where) from None
    indices = [gpu.index for gpu in inventory.gpus]
    if sorted(indices) != list(range(len(indices))):
        raise InvalidInputError(f"GPU indices {sorted(indices)} are not 0..{len(indices) - 1}", location=where)
    return inventory
