"""The allocation record: every placement decision, written on the pod before it is bound.

kubecell's scheduler keeps no state of its own that the API server does not hold. Each pod it binds
carries one versioned JSON annotation, ``kubecell.io/allocation`` (schema ``kubecell.io/allocation/v1``),
written before or with the Binding, that says exactly what the pod holds::

    {"schema": "kubecell.io/allocation/v1", "allocationId": "5f0c...-0", "podUID": "5f0c...", "attempt": 0,
     "node": "n1", "gpus": [{"index": 2, "uuid": "GPU-6f1c...", "milli": 500, "memoryMiB": 0}],
     "cpuMilli": 4000, "memoryMiB": 16384, "isolation": "accounting", "job": "team-a/train-1",
     "vc": "team-a", "class": "borrowed", "member": 3, "batch": 4, "scheduler": "kubecell/scheduler-0",
     "createdAt": "2026-11-23T12:00:00Z"}

The scheduler rebuilds its allocation book from these records on start; the node agent reads the
record of the pod it serves (never guessing, as gpushare's device plugin must) and injects the GPU
environment below. A record that is malformed, of an unknown version or written for another pod (an
annotation copied with a manifest) is refused with the pod, the field and what would be accepted; it
is never half-read.

``allocationId`` is ``<pod UID>-<attempt>``: unique (a UID is never reused) and deterministic, so a
scheduler that restarts in the middle of a bind writes the same id again and every write is idempotent.

Anyone who can edit a pod can write this annotation, so it is read with bounds: the text's length before
JSON reads it, every number's digits before Python converts it (``int`` raises ``ValueError`` beyond 4,300
digits), every amount within what the allocation book holds (``kubecell.core.limits``), every text within
what the name it carries may be (a node's name, a VC's, a group key). What is out of bounds is a
``RecordError`` like any other bad record.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, field_serializer

from kubecell.core.engine.job import JobClass
from kubecell.core.errors import InvalidInputError
from kubecell.core.limits import (
    AMOUNT_BITS,
    MAX_CPU_MILLI,
    MAX_GANG_MEMBERS,
    MAX_GPU_MEMORY_MIB,
    MAX_GPUS_PER_NODE,
    MAX_MEMORY_MIB,
)
from kubecell.core.model import MILLI_PER_GPU, Allocation
from kubecell.core.shown import shown
from kubecell.core.validation import explain_validation_error, key_path
from kubecell.kube.annotation_json import AnnotationJsonError, load_annotation_json
from kubecell.kube.dialects.demand import MAX_NAME_CHARS
from kubecell.kube.inventory import NodeView
from kubecell.kube.inventory_schema import MAX_UUID_CHARS
from kubecell.kube.names import ANNOTATION_ALLOCATION, ISOLATION_MODES

ALLOCATION_SCHEMA: Final = "kubecell.io/allocation/v1"
_SCHEMA_FAMILY = "kubecell.io/allocation/"

MAX_RECORD_CHARS = 64 * 1024
"""The longest annotation read: a record of 64 GPUs with every text at its longest is under 24 KiB."""
MAX_ATTEMPT = 1 << AMOUNT_BITS
"""The most placements of one pod a record may count (a count of preemptions: never near it)."""
MAX_UID_CHARS = 128
"""A pod's UID (Kubernetes writes a 36-character UUID)."""
MAX_JOB_CHARS = 63 + 1 + MAX_NAME_CHARS
"""A group key or a pod's key, ``<namespace>/<name>``: a namespace has at most 63 characters, a name 253."""
MAX_IDENTITY_CHARS = 512
"""A scheduler's leader-election identity (kubecell's default is ``<host name>-<pid>``; a host name has at most
253 characters)."""


class RecordError(InvalidInputError):
    """An allocation record that cannot be trusted: malformed, of an unknown version, inconsistent, or
    written for another pod. The pod's allocation is then unknown, never guessed."""


class GpuGrant(BaseModel):
    """One GPU the pod holds: ``milli`` of its compute and ``memoryMiB`` of its memory (for a whole GPU,
    the GPU's own memory, 0 where the node did not report it)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)
    index: int = Field(ge=0, lt=MAX_GPUS_PER_NODE)
    uuid: str = Field(min_length=1, max_length=MAX_UUID_CHARS)
    milli: int = Field(ge=0, le=MILLI_PER_GPU)
    memory_mib: int = Field(ge=0, le=MAX_GPU_MEMORY_MIB, alias="memoryMiB")


class AllocationRecord(BaseModel):
    """The ``kubecell.io/allocation`` annotation, schema ``kubecell.io/allocation/v1``."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)
    schema_: Literal["kubecell.io/allocation/v1"] = Field(default=ALLOCATION_SCHEMA, alias="schema")
    allocation_id: str = Field(min_length=1, max_length=MAX_UID_CHARS + 1 + len(str(MAX_ATTEMPT)),
                               alias="allocationId")
    pod_uid: str = Field(min_length=1, max_length=MAX_UID_CHARS, alias="podUID")
    attempt: int = Field(ge=0, le=MAX_ATTEMPT)
    node: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    gpus: list[GpuGrant] = Field(default_factory=list, max_length=MAX_GPUS_PER_NODE)
    cpu_milli: int = Field(ge=0, le=MAX_CPU_MILLI, alias="cpuMilli")
    memory_mib: int = Field(ge=0, le=MAX_MEMORY_MIB, alias="memoryMiB")
    isolation: Literal["accounting", "mps", "mig"] = "accounting"
    job: str = Field(min_length=1, max_length=MAX_JOB_CHARS)
    vc: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    job_class: Literal["guaranteed", "borrowed", "opportunistic"] = Field(alias="class")
    member: int = Field(ge=0, lt=MAX_GANG_MEMBERS)
    batch: int = Field(ge=1, le=MAX_GANG_MEMBERS)
    """How many members were placed together in this decision (1 for a pod alone). A restarted scheduler
    finds a gang's records complete (bind the rest) or short of ``batch`` (roll back): records are all
    written before the first Binding."""
    scheduler: str = Field(min_length=1, max_length=MAX_IDENTITY_CHARS)
    created_at: AwareDatetime = Field(alias="createdAt")

    @field_serializer("created_at")
    def _rfc3339(self, value: datetime) -> str:
        """RFC 3339 in UTC with a ``Z``, as Kubernetes writes times (seconds unless finer is given)."""
        spec = "seconds" if value.microsecond == 0 else "microseconds"
        return value.astimezone(UTC).isoformat(timespec=spec).replace("+00:00", "Z")

    def to_annotation(self) -> str:
        """The annotation's value: compact JSON with the schema's own key names."""
        return json.dumps(self.model_dump(by_alias=True, mode="json"), separators=(",", ":"))

    @property
    def gpu_milli(self) -> int:
        """Compute per GPU (the same on every GPU of a record), 0 without GPUs."""
        return self.gpus[0].milli if self.gpus else 0

    @property
    def gpu_memory_mib(self) -> int:
        return self.gpus[0].memory_mib if self.gpus else 0


def allocation_id(pod_uid: str, attempt: int) -> str:
    """``<pod UID>-<attempt>``: the same decision always gets the same id, a new attempt a new one."""
    if not pod_uid:
        raise InvalidInputError("an allocation id needs the pod's UID", field="podUID")
    if attempt < 0:
        raise InvalidInputError(f"attempt {attempt} is negative", field="attempt", accepted="0, 1, 2, ...")
    return f"{pod_uid}-{attempt}"


def _where(pod: str) -> str:
    return f"pod {pod}: annotation {ANNOTATION_ALLOCATION}"


def _inconsistency(record: AllocationRecord) -> tuple[str, str, str | None] | None:
    """What in a well-typed record contradicts itself: (key path, problem, accepted), or None."""
    expected = allocation_id(record.pod_uid, record.attempt)
    if record.allocation_id != expected:
        return ("allocationId", f"is {shown(record.allocation_id)} but podUID and attempt give {shown(expected)}",
                "<podUID>-<attempt>")
    indices = [gpu.index for gpu in record.gpus]
    if len(set(indices)) != len(indices):
        return ("gpus", f"names GPU indices {indices} with repeats", "each GPU once")
    uuids = [gpu.uuid for gpu in record.gpus]
    if len(set(uuids)) != len(uuids):
        return ("gpus", "names one GPU UUID twice", "each GPU once")
    for position, gpu in enumerate(record.gpus):
        if len(record.gpus) > 1 and gpu.milli != MILLI_PER_GPU:
            return (f"gpus[{position}].milli", f"is {gpu.milli} on a record of {len(record.gpus)} GPUs",
                    "1000 on every GPU of a multi-GPU record (shares sit on one GPU)")
        if gpu.milli == 0 and gpu.memory_mib == 0:
            return (f"gpus[{position}]", "holds neither compute nor memory of the GPU",
                    "milli 1..1000 and/or memoryMiB > 0")
    return None


def _check_time(raw: Mapping[str, Any], where: str) -> None:
    """``createdAt`` read before pydantic, so its problems are told in plain words."""
    value = raw.get("createdAt")
    if not isinstance(value, str):
        return  # missing or not text: the model reports it
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise RecordError(f"createdAt: {shown(value)} is not a time with a zone", location=where,
                          accepted="RFC 3339, e.g. 2026-11-23T12:00:00Z")


def _text(most: int) -> str:
    return f"non-empty text of at most {most} characters"


_COUNT = "a whole number >= 0"
"""Numbers are told as whole numbers; a number above its field's bound is told the bound in the message
(``must be at most 1099511627776, got ...``)."""
_ACCEPTED = {
    "isolation": ", ".join(ISOLATION_MODES),
    "class": ", ".join(kind.value for kind in JobClass),
    "gpus": f"a list of at most {MAX_GPUS_PER_NODE} {{index, uuid, milli, memoryMiB}}",
    "gpus.*": "{index, uuid, milli, memoryMiB}",
    "gpus.*.index": f"0..{MAX_GPUS_PER_NODE - 1}",
    "gpus.*.uuid": f"the GPU's UUID, at most {MAX_UUID_CHARS} characters",
    "gpus.*.milli": f"0..{MILLI_PER_GPU}",
    "gpus.*.memoryMiB": _COUNT,
    **dict.fromkeys(("attempt", "cpuMilli", "memoryMiB", "member"), _COUNT),
    "batch": "a whole number >= 1",
    "allocationId": "<podUID>-<attempt>",
    "podUID": _text(MAX_UID_CHARS),
    "node": _text(MAX_NAME_CHARS),
    "job": _text(MAX_JOB_CHARS),
    "vc": _text(MAX_NAME_CHARS),
    "scheduler": _text(MAX_IDENTITY_CHARS),
    "createdAt": "RFC 3339, e.g. 2026-11-23T12:00:00Z",
}
_RANGES = {
    "gpus.*.index": f"0..{MAX_GPUS_PER_NODE - 1}",
    "gpus.*.milli": f"0..{MILLI_PER_GPU}",
    "gpus.*.memoryMiB": f"0..{MAX_GPU_MEMORY_MIB}",
    "attempt": f"0..{MAX_ATTEMPT}",
    "cpuMilli": f"0..{MAX_CPU_MILLI}",
    "memoryMiB": f"0..{MAX_MEMORY_MIB}",
    "member": f"0..{MAX_GANG_MEMBERS - 1}",
    "batch": f"1..{MAX_GANG_MEMBERS}",
}
"""Each number's range, for a number whose digits alone put it out of range (never converted)."""
_YAML_HINT = " (YAML reads yes, no, on and off as true and false)"
"""The shared formatter's hint for booleans in YAML input; a record is JSON, where it would mislead."""
_KEYS = ("schema, allocationId, podUID, attempt, node, gpus, cpuMilli, memoryMiB, isolation, job, vc, class, member, "
         "batch, scheduler, createdAt")


def _keys_at(parts: Any) -> str:
    return "index, uuid, milli, memoryMiB" if len(parts) >= 2 and parts[0] == "gpus" else _KEYS


def _validated(raw: Mapping[str, Any], where: str) -> AllocationRecord:
    try:
        record = AllocationRecord.model_validate(raw, strict=True)
    except ValidationError as error:
        told = explain_validation_error(error, raw, lambda parts: f"{where}: {key_path(parts)}" if parts else where,
                                        accepted=_ACCEPTED, keys=_keys_at)
        raise RecordError(told.message.replace(_YAML_HINT, ""), location=told.location,
                          accepted=told.accepted) from None
    problem = _inconsistency(record)
    if problem is not None:
        path, message, accepted = problem
        raise RecordError(f"{path}: {message}", location=where, accepted=accepted)
    return record


def parse_record(text: str, *, pod: str, uid: str | None = None) -> AllocationRecord:
    """Read the annotation of pod ``pod`` (``namespace/name``, for messages); with ``uid``, also check the
    record was written for this very pod and not copied with its manifest from another."""
    where = _where(pod)
    try:
        raw = load_annotation_json(text, max_chars=MAX_RECORD_CHARS, unique_keys=True)
    except json.JSONDecodeError as error:
        raise RecordError(f"is not JSON ({error.msg} at character {error.pos})", location=where) from None
    except AnnotationJsonError as error:
        path = tuple("*" if isinstance(part, int) else part for part in error.path)
        message = f"{key_path(error.path)}: {error.message}" if error.path else error.message
        accepted = _RANGES.get(".".join(str(part) for part in path)) or error.accepted
        raise RecordError(message, location=where, accepted=accepted) from None
    if not isinstance(raw, dict):
        raise RecordError("is not a JSON object", location=where, accepted=f"an object with schema {ALLOCATION_SCHEMA}")
    schema = raw.get("schema")
    if schema != ALLOCATION_SCHEMA:
        if schema is None:
            message = "has no schema"
        elif isinstance(schema, str) and schema.startswith(_SCHEMA_FAMILY):
            message = f"schema {shown(schema)} is not a version this kubecell reads"
        else:
            message = f"schema {shown(schema)} is not an allocation record"
        raise RecordError(message, location=where, accepted=ALLOCATION_SCHEMA)
    _check_time(raw, where)
    if isinstance(raw.get("createdAt"), str):
        raw["createdAt"] = datetime.fromisoformat(raw["createdAt"].replace("Z", "+00:00"))
    record = _validated(raw, where)
    if uid is not None and record.pod_uid != uid:
        raise RecordError(f"podUID: was written for pod UID {shown(record.pod_uid)}, not this pod ({shown(uid)}); an "
                          "annotation copied from another pod is never trusted", location=where,
                          accepted="a record written by the scheduler for this pod")
    return record


def record_for(allocation: Allocation, view: NodeView, *, pod: str, pod_uid: str, attempt: int, job: str, vc: str,
               job_class: JobClass, member: int, scheduler: str, created_at: datetime, batch: int = 1,
               isolation: Literal["accounting", "mps", "mig"] = "accounting") -> AllocationRecord:
    """The record of a core ``Allocation`` on the node ``view`` (whose inventory gives the GPUs' UUIDs).

    Whole GPUs record each GPU's own memory (the pod may use all of it); shares record what the
    allocation took. Raises ``RecordError`` where the node cannot name the GPUs it would hand out."""
    where = _where(pod)
    if created_at.tzinfo is None:
        raise RecordError(f"createdAt: {created_at.isoformat()} has no time zone", location=where,
                          accepted="an aware datetime, e.g. datetime.now(UTC)")
    if view.name != allocation.node or view.node is None:
        raise RecordError(f"the allocation is on node {allocation.node!r} but the node given is {view.name!r}"
                          + ("" if view.node is not None else f", which is excluded ({view.excluded})"),
                          location=where)
    gpus = []
    for index in allocation.gpu_indices:
        if index >= len(view.uuids) or index >= len(view.node.gpus):
            raise RecordError(f"node {view.name} reports no UUID for GPU {index} (inventory source: {view.source})",
                              location=where, accepted="nodes whose kubecell node agent publishes the GPU inventory")
        whole = allocation.gpu_milli == MILLI_PER_GPU
        memory = view.node.gpus[index].memory_mib if whole else allocation.gpu_memory_mib
        gpus.append({"index": index, "uuid": view.uuids[index], "milli": allocation.gpu_milli, "memoryMiB": memory})
    raw = {"schema": ALLOCATION_SCHEMA, "allocationId": allocation_id(pod_uid, attempt), "podUID": pod_uid,
           "attempt": attempt, "node": view.name, "gpus": gpus, "cpuMilli": allocation.request.cpu_milli,
           "memoryMiB": allocation.request.memory_mib, "isolation": isolation, "job": job, "vc": vc,
           "class": job_class.value, "member": member, "batch": batch, "scheduler": scheduler,
           "createdAt": created_at}
    return _validated(raw, where)


def gpu_environment(record: AllocationRecord) -> dict[str, str]:
    """The environment the node agent injects into the pod's GPU containers.

    Accounting (the default) names the GPUs by UUID (``NVIDIA_VISIBLE_DEVICES`` for the container
    runtime, ``CUDA_VISIBLE_DEVICES`` for CUDA) and states the budget for cooperative limiting
    (``KUBECELL_GPU_MILLI``, ``KUBECELL_GPU_MEMORY_MIB``, absent when no memory was granted or a whole
    GPU's size is unknown). MPS adds NVIDIA's per-client limits: ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``
    (the share, rounded down, at least 1) and ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (the memory share,
    on the container's device 0); whole GPUs get no limit. A record without GPUs hides every GPU
    (``void``), since CUDA images default to all of them. MIG names the one MIG instance by its UUID
    (``MIG-...``), which both the container runtime and CUDA accept; the hardware enforces its size.
    """
    if not record.gpus:
        return {"NVIDIA_VISIBLE_DEVICES": "void"}
    if record.isolation == "mig" and (len(record.gpus) != 1 or not record.gpus[0].uuid.startswith("MIG-")):
        raise RecordError(f"isolation mig names {', '.join(gpu.uuid for gpu in record.gpus)}",
                          location=f"allocation {record.allocation_id}", accepted="one MIG instance (MIG-<uuid>)")
    uuids = ",".join(gpu.uuid for gpu in record.gpus)
    env = {
        "NVIDIA_VISIBLE_DEVICES": uuids,
        "CUDA_VISIBLE_DEVICES": uuids,
        "KUBECELL_GPU_UUIDS": uuids,
        "KUBECELL_GPU_MILLI": str(record.gpu_milli),
        "KUBECELL_ALLOCATION_ID": record.allocation_id,
        "KUBECELL_ISOLATION": record.isolation,
    }
    if record.gpu_memory_mib:
        env["KUBECELL_GPU_MEMORY_MIB"] = str(record.gpu_memory_mib)
    share = record.gpu_milli < MILLI_PER_GPU
    if record.isolation == "mps" and share:
        if record.gpu_milli:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, record.gpu_milli // 10))
        if record.gpu_memory_mib:
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={record.gpu_memory_mib}M"
    return env
