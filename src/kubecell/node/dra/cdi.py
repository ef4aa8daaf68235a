"""CDI specs of prepared claims: how a DRA claim's environment reaches the container.

A DRA driver does not answer the kubelet with an environment (the device plugin's ``Allocate`` did): it
names CDI devices (``gpu.kubecell.io/claim=<name>``), and the container runtime applies the edits a CDI spec
file in ``/var/run/cdi`` gives them (Container Device Interface, ``cdiVersion`` 0.6.0: env, mounts). So for
each prepared claim the plugin writes one file, ``gpu.kubecell.io-<claim uid>.json``, with a device per
allocated device, and removes it when the claim is unprepared.

Each device's edits carry the environment of the *request* it was allocated for (all of that request's
devices: ``NVIDIA_VISIBLE_DEVICES`` lists every GPU of a two-GPU request), because a runtime applies the
edits of every CDI device a container gets and a later variable of the same name replaces an earlier one:
identical values per request make that harmless. A container that uses several requests of one claim gets
one request's variables; one request per container (or one claim per request) is the supported use.

Files are written to a temporary name and renamed, so a runtime never reads half a spec. The temporary name
does not end in ``.json`` (runtimes read every ``*.json`` and ``*.yaml`` of the directory, hidden ones too):
a plugin killed before the rename would otherwise leave a second spec with the claim's devices, which the
runtime's CDI cache drops as defined twice, and the claim's containers would never start. What a killed
writer left is removed at the next start (:func:`remove_partials`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubecell.kube import dra_names as names
from kubecell.node.deviceplugin import ContainerAllocation

log = logging.getLogger("kubecell.node.dra")

CDI_DIR = Path("/var/run/cdi")
CDI_VERSION = "0.6.0"
FILE_PREFIX = f"{names.DRIVER}-"
_INVALID = re.compile(r"[^A-Za-z0-9_.:-]+")
PARTIAL_PREFIX = f".{names.DRIVER}-partial-"
PARTIAL_SUFFIX = ".tmp"
"""A file being written is ``<PARTIAL_PREFIX><random><PARTIAL_SUFFIX>``: not a name a CDI runtime reads."""
LEGACY_PARTIAL = ".partial-*.json"
"""How files being written were named before (a runtime reads them as specs)."""


@dataclass(frozen=True, slots=True)
class CdiDevice:
    """One device of a claim's spec: its name and what a container using it gets."""

    name: str
    edits: ContainerAllocation

    @property
    def qualified(self) -> str:
        """The CDI device ID the kubelet passes to the runtime: ``gpu.kubecell.io/claim=<name>``."""
        return f"{names.CDI_KIND}={self.name}"


def device_name(claim_uid: str, request: str, device: str) -> str:
    """``<claim uid>-<request>-<device>`` with what CDI does not allow in a name (``/`` of a subrequest)
    replaced by ``-``: unique per claim, readable in the runtime's log."""
    return _INVALID.sub("-", f"{claim_uid}-{request}-{device}").strip("-") or claim_uid


def spec_path(directory: Path, claim_uid: str) -> Path:
    return directory / f"{FILE_PREFIX}{_INVALID.sub('-', claim_uid)}.json"


def container_edits(edits: ContainerAllocation) -> dict[str, Any]:
    """CDI ``containerEdits`` for the environment, mounts and device nodes of one allocation."""
    out: dict[str, Any] = {"env": [f"{key}={value}" for key, value in sorted(edits.envs.items())]}
    if edits.mounts:
        out["mounts"] = [{"hostPath": m.host_path, "containerPath": m.container_path,
                          "options": ["rbind", "ro" if m.read_only else "rw"]} for m in edits.mounts]
    if edits.devices:
        out["deviceNodes"] = [{"path": d.container_path, "hostPath": d.host_path, "permissions": d.permissions}
                              for d in edits.devices]
    return out


def claim_spec(devices: Sequence[CdiDevice]) -> dict[str, Any]:
    """The CDI spec of one claim's devices."""
    return {"cdiVersion": CDI_VERSION, "kind": names.CDI_KIND,
            "devices": [{"name": d.name, "containerEdits": container_edits(d.edits)} for d in devices]}


def atomic_write_json(path: Path, data: Any, mode: int = 0o644) -> None:
    """Write JSON to ``path`` through a temporary file in the same directory, fsync and rename: a reader sees
    the old content or the new, never a part (CDI specs for the runtime, the plugin's checkpoint)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=PARTIAL_PREFIX, suffix=PARTIAL_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=2)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(partial, mode)
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


def remove_partials(directory: Path, *, owned: bool = False) -> list[Path]:
    """Remove the temporary files a writer killed before its rename left in ``directory`` (call it before
    anything writes there: the plugin is the only writer of its files). Files named the way they were before
    (``.partial-*.json``) go too where ``owned`` (the plugin's own directory) or where they hold a spec of
    ours; another vendor's files stay. Returns what was removed."""
    found = list(directory.glob(f"{PARTIAL_PREFIX}*{PARTIAL_SUFFIX}"))
    for path in directory.glob(LEGACY_PARTIAL):
        if owned or f'"kind": "{names.CDI_KIND}"' in _head(path, 4096):
            found.append(path)
    removed = []
    for path in found:
        try:
            path.unlink(missing_ok=True)
            removed.append(path)
        except OSError as error:
            log.warning("cannot remove %s, left by a writer that was killed: %s", path, error)
    if removed:
        log.warning("removed %s, left half-written by a writer that was killed", ", ".join(p.name for p in removed))
    return removed


def _head(path: Path, limit: int) -> str:
    """The first ``limit`` bytes of a regular file, "" for anything else. The CDI directory is shared with other
    vendors' tools: a file there may be huge, a link to ``/dev/zero``, or a FIFO that blocks a reader for ever
    (before, it was read whole, and a FIFO hung the agent at every start)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        return os.read(fd, limit).decode(errors="replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


def write_spec(directory: Path, claim_uid: str, spec: dict[str, Any]) -> Path:
    """Write a claim's spec atomically; returns its path (readable by all: runtimes and tools read it)."""
    path = spec_path(directory, claim_uid)
    atomic_write_json(path, spec)
    return path


def remove_spec(directory: Path, claim_uid: str) -> None:
    spec_path(directory, claim_uid).unlink(missing_ok=True)


def read_spec(directory: Path, claim_uid: str) -> dict[str, Any] | None:
    """A claim's spec as written, or None (tests, and a check that a checkpointed claim still has one)."""
    try:
        loaded: dict[str, Any] = json.loads(spec_path(directory, claim_uid).read_text())
    except (OSError, ValueError):
        return None
    return loaded


def env_of(spec: dict[str, Any], name: str) -> dict[str, str]:
    """The environment one device of a spec gives (``KEY=VALUE`` entries as a dict)."""
    for device in spec.get("devices") or []:
        if device.get("name") == name:
            return dict(entry.split("=", 1) for entry in device["containerEdits"].get("env") or [])
    raise KeyError(name)
