"""The node agent's record of faulted GPUs on its Node, and the operator's request to clear them.

A critical XID takes a GPU out of service until an operator has reset or replaced it. The driver keeps no
"this GPU is broken" state that NVML could be asked for after the fact, so the agent's own memory of the XID was
the only record: a restarted agent (a rolling update, a crash, an eviction of its pod) published every GPU
healthy again, and work was placed on a GPU that had fallen off the bus. So the agent keeps the faults on its Node:

* ``kubecell.io/gpu-faults``, written by the agent beside the inventory: ``{"<GPU UUID>": {"xid": 79, "at":
  "2026-12-03T13:00:00Z"}, ...}``. A restarted agent reads it before it publishes anything. It is not trusted
  for more than it can do: an entry only ever takes a GPU *out* of service, which whoever can write a Node can
  do anyway (a cordon, a taint), and it is read with bounds on length, count and every field.
* ``kubecell.io/gpu-fault-clear``, written by an operator after a reset: ``all``, or GPU UUIDs separated by
  commas. The agent clears those faults, rewrites the record and removes the request, in one write conditional
  on the Node's ``resourceVersion`` (a request changed in between is read again, never lost).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from kubecell.core.shown import shown
from kubecell.kube.annotation_json import AnnotationJsonError, load_annotation_json
from kubecell.kube.clock import is_api_time

MAX_FAULTS: Final = 256
"""Faulted GPUs remembered per node: as many GPUs as a node's inventory holds. Past that the oldest go (a GPU
replaced long ago)."""
MAX_UUID_CHARS: Final = 128
MAX_FAULTS_CHARS: Final = 64 * 1024
"""256 entries of a 128-character UUID, an XID and a time are under 64 KiB."""
MAX_CLEAR_CHARS: Final = 64 * 1024
MAX_XID: Final = 2**31 - 1
CLEAR_ALL: Final = "all"

XID_MEANINGS: Mapping[int, str] = {  # the XIDs :mod:`kubecell.node.xid` names, as NVIDIA's XID catalog has them
    13: "graphics engine exception", 31: "GPU memory page fault", 43: "GPU stopped processing",
    45: "preemptive cleanup", 48: "double-bit ECC error", 62: "internal micro-controller halt",
    63: "ECC page retirement / row remap pending", 64: "ECC page retirement / row remap failure",
    68: "video processor exception", 74: "NVLink error", 79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate", 94: "contained ECC error", 95: "uncontained ECC error",
    119: "GSP RPC timeout", 120: "GSP error",
}


def describe(code: int) -> str:
    """``"XID 79 (GPU has fallen off the bus)"``: what an Event or log line says."""
    meaning = XID_MEANINGS.get(code)
    return f"XID {code} ({meaning})" if meaning else f"XID {code}"


@dataclass(frozen=True, slots=True)
class RecordedFault:
    """One faulted GPU as the record holds it: the XID that took it out and when (epoch seconds)."""

    xid: int
    at: float

    def __str__(self) -> str:
        """``"XID 79 (GPU has fallen off the bus) at 2026-12-03T13:00:00Z"``."""
        return f"{describe(self.xid)} at {_time(self.at)}"


class GpuFaultsError(ValueError):
    """An annotation of this module that cannot be read as a whole (not JSON, not an object, too long)."""


def faults_annotation(faults: Mapping[str, RecordedFault]) -> str | None:
    """The record's text, newest ``MAX_FAULTS`` only, sorted by UUID; None for no faults (the annotation is
    removed)."""
    if not faults:
        return None
    kept = sorted(faults.items(), key=lambda item: item[1].at, reverse=True)[:MAX_FAULTS]
    return json.dumps({uuid: {"xid": fault.xid, "at": _time(fault.at)} for uuid, fault in sorted(kept)},
                      separators=(",", ":"))


def _time(epoch: float) -> str:
    """RFC 3339; a time no date holds (a driver's or a test's odd clock) is written as the epoch, never raised
    out of every publish."""
    try:
        return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, ValueError, OSError):
        return "1970-01-01T00:00:00Z"


def parse_faults(text: object) -> tuple[dict[str, RecordedFault], list[str]]:
    """The faults a record holds, and what was wrong with each entry left out (a reason per entry, for the
    log). Raises ``GpuFaultsError`` where the text as a whole cannot be read."""
    try:
        raw = load_annotation_json(text, max_chars=MAX_FAULTS_CHARS, unique_keys=True)
    except (AnnotationJsonError, json.JSONDecodeError) as error:
        raise GpuFaultsError(f"is not a fault record: {getattr(error, 'message', None) or error}") from None
    if not isinstance(raw, dict):
        raise GpuFaultsError(f"is a JSON {type(raw).__name__}, not an object of GPU UUIDs")
    faults: dict[str, RecordedFault] = {}
    skipped: list[str] = []
    for uuid, entry in list(raw.items())[:MAX_FAULTS]:
        problem = _entry_problem(uuid, entry)
        if problem:
            skipped.append(f"{shown(uuid[:MAX_UUID_CHARS])}: {problem}")
            continue
        at = datetime.datetime.fromisoformat(entry["at"].upper().replace("Z", "+00:00")).timestamp()
        faults[uuid] = RecordedFault(entry["xid"], at)
    if len(raw) > MAX_FAULTS:
        skipped.append(f"{len(raw) - MAX_FAULTS} entries past the first {MAX_FAULTS}")
    return faults, skipped


def _entry_problem(uuid: str, entry: object) -> str:
    if not 0 < len(uuid) <= MAX_UUID_CHARS or not uuid.isprintable():
        return f"a GPU UUID must be 1 to {MAX_UUID_CHARS} printable characters"
    if not isinstance(entry, dict) or set(entry) != {"xid", "at"}:
        return 'an entry is {"xid": <XID>, "at": <RFC 3339 time>}'
    xid = entry["xid"]
    if isinstance(xid, bool) or not isinstance(xid, int) or not 0 <= xid <= MAX_XID:
        return f"xid must be a whole number from 0 to {MAX_XID}"
    if not is_api_time(entry["at"]):
        return "at must be an RFC 3339 time with a zone"
    return ""


def parse_clear(text: object) -> set[str] | None:
    """The GPUs an operator's clear request names, or None for ``all``. Raises ``GpuFaultsError`` for text that
    names nothing readable (the request stays for the operator to see, and is logged)."""
    if not isinstance(text, str) or len(text) > MAX_CLEAR_CHARS:
        raise GpuFaultsError(f"must be {CLEAR_ALL!r} or GPU UUIDs separated by commas, at most {MAX_CLEAR_CHARS} "
                             "characters")
    if text.strip().lower() == CLEAR_ALL:
        return None
    named = {part.strip() for part in text.split(",") if part.strip()}
    bad = sorted(uuid for uuid in named if len(uuid) > MAX_UUID_CHARS or not uuid.isprintable())
    if not named or bad:
        raise GpuFaultsError(f"must be {CLEAR_ALL!r} or GPU UUIDs separated by commas"
                             + (f"; not a UUID: {shown(bad[0][:MAX_UUID_CHARS])}" if bad else ""))
    return named
