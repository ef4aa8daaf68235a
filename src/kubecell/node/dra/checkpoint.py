"""The DRA plugin's checkpoint: the claims this node prepared, kept in one JSON file across agent restarts.

What the checkpoint keeps of each claim is what a repeated Prepare answers and what an Unprepare releases: its
devices as answered to the kubelet (with the physical GPU, whether each is held whole, and a share's compute and
memory, which the exclusivity checks and the overuse monitor read) and the GPUs whose MPS daemon it holds. It is
written with a rename; one that cannot be read (not JSON, too deep, too long, a field of the wrong type) is set
aside as ``checkpoint.corrupt`` and the agent starts empty, never crash-looping on it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubecell.node.dra import cdi
from kubecell.node.dra.exclusive import Holding
from kubecell.node.dra.slices import NodeDevice

log = logging.getLogger("kubecell.node.dra")

CHECKPOINT_VERSION = 1


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A claim as the kubelet names it."""

    namespace: str
    uid: str
    name: str


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One device of a prepared claim, as answered to the kubelet."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str | None = None
    gpu: str | None = None
    """The physical GPU's UUID (None in a checkpoint written before it was kept: read from the inventory)."""
    exclusive: bool | None = None
    """Held whole (None where not kept: taken as whole without a share ID)."""
    milli: int = 0
    memory_mib: int = 0
    """What a share takes (0 where not kept: counted as nothing)."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"requestNames": list(self.request_names), "poolName": self.pool,
                               "deviceName": self.device, "cdiDeviceIDs": list(self.cdi_ids)}
        if self.share_id is not None:
            out["shareID"] = self.share_id
        if self.gpu is not None:
            out["gpuUUID"] = self.gpu
        if self.exclusive is not None:
            out["exclusive"] = self.exclusive
        if self.milli or self.memory_mib:
            out["milli"], out["memoryMiB"] = self.milli, self.memory_mib
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PreparedDevice:
        share, gpu, exclusive = data.get("shareID"), data.get("gpuUUID"), data.get("exclusive")
        return cls(_texts(data["requestNames"]), str(data["poolName"]), str(data["deviceName"]),
                   _texts(data["cdiDeviceIDs"]), None if share is None else str(share),
                   None if gpu is None else str(gpu), exclusive if isinstance(exclusive, bool) else None,
                   _amount(data.get("milli")), _amount(data.get("memoryMiB")))

    def holding(self, table: Mapping[str, NodeDevice]) -> Holding | None:
        """What it takes of its GPU (None: a device the node no longer has, which holds nothing now)."""
        device = table.get(self.device)
        if device is None:
            return None
        exclusive = self.share_id is None if self.exclusive is None else self.exclusive
        return Holding(self.device, self.gpu or device.gpu.uuid, device.is_mig, self.share_id, exclusive,
                       self.milli, self.memory_mib)


def _texts(value: Any) -> tuple[str, ...]:
    """A kept list of names; TypeError for anything else (a string would be read as its characters)."""
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise TypeError(f"expected a list of strings, got {type(value).__name__}")
    return tuple(value)


def _amount(value: Any) -> int:
    """A kept share's milli-GPU or MiB (0 for anything that is not a count: unknown)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    """A claim this node prepared: its devices and the GPUs whose MPS daemon it holds."""

    ref: ClaimRef
    devices: tuple[PreparedDevice, ...]
    mps_gpus: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"namespace": self.ref.namespace, "name": self.ref.name,
                "devices": [d.to_json() for d in self.devices], "mpsGPUs": list(self.mps_gpus)}

    @classmethod
    def from_json(cls, uid: str, data: dict[str, Any]) -> PreparedClaim:
        return cls(ClaimRef(str(data["namespace"]), uid, str(data["name"])),
                   tuple(PreparedDevice.from_json(d) for d in data["devices"]), _texts(data.get("mpsGPUs") or []))


MAX_CHECKPOINT_BYTES = 16 * 2**20
"""The largest checkpoint read (a node's prepared claims are a few KiB each): a bigger one is set aside."""


@dataclass
class Checkpoint:
    """The prepared claims by UID, in one JSON file replaced atomically on every change."""

    path: Path
    claims: dict[str, PreparedClaim] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> Checkpoint:
        """The checkpoint at ``path``; none yet is empty, and an unreadable one is set aside (``.corrupt``)
        and empty (its claims' CDI files stay; Unprepare of an unknown claim still removes its file). What a
        writer killed before its rename left next to it is removed."""
        if path.parent.is_dir():
            cdi.remove_partials(path.parent, owned=True)
        try:
            if path.stat().st_size > MAX_CHECKPOINT_BYTES:
                raise ValueError(f"longer than {MAX_CHECKPOINT_BYTES // 2**20} MiB")
            raw = json.loads(path.read_text())
            if raw.get("version") != CHECKPOINT_VERSION:
                raise ValueError(f"version {raw.get('version')!r}, expected {CHECKPOINT_VERSION}")
            claims = {uid: PreparedClaim.from_json(uid, data) for uid, data in raw["claims"].items()}
        except FileNotFoundError:
            return cls(path)
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as error:
            log.error("DRA checkpoint %s cannot be read (%s); setting it aside and starting empty", path,
                      str(error)[:300])
            path.replace(path.with_suffix(".corrupt"))
            return cls(path)
        return cls(path, claims)

    def save(self) -> None:
        cdi.atomic_write_json(self.path, {"version": CHECKPOINT_VERSION,
                                          "claims": {uid: c.to_json() for uid, c in sorted(self.claims.items())}},
                              mode=0o600)
