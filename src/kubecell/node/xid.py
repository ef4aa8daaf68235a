"""Which XID errors take a GPU out of service, and the agent's record of the GPUs they hit.

The NVIDIA driver reports GPU faults as numbered XID events. Most are about one application (an illegal
memory access, a kernel that hung) and leave the GPU usable; a few mean the GPU itself is broken until it is
reset or replaced, and the scheduler must stop placing work on it. kubecell keeps an explicit *allow-list*
of those ("critical" XIDs), taken from NVIDIA's XID documentation (docs.nvidia.com/deploy/xid-errors:
the catalog's resolution buckets RESET_GPU / RESTART_BM / RMA) for the codes a datacenter GPU reports:

====  =====================================================================================
XID   meaning
====  =====================================================================================
48    double-bit (uncorrectable) ECC error
62    internal micro-controller halt
63    ECC page retirement / row remapping recorded: pending until the GPU is reset
64    ECC page retirement / row remapping failed
74    NVLink error
79    GPU has fallen off the bus
92    high single-bit ECC error rate
94    contained ECC error (the memory is suspect; NVIDIA advises a reset soon)
95    uncontained ECC error
119   GSP RPC timeout
120   GSP error
====  =====================================================================================

NVIDIA's own device plugin uses the opposite rule (every XID is critical except the application errors
13, 31, 43, 45 and 68); :data:`APPLICATION_XIDS` keeps that list so an operator can see the difference, and
:class:`HealthTracker` takes the critical set as a parameter for sites that prefer the stricter rule.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kubecell.kube.gpu_faults import RecordedFault

CRITICAL_XIDS: frozenset[int] = frozenset({48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120})
"""XIDs after which a GPU takes no new work until an operator clears it (a reset, a replacement)."""

APPLICATION_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68})
"""XIDs caused by one application; the GPU stays healthy (NVIDIA's device plugin skips these too)."""



@dataclass(frozen=True, slots=True)
class XidEvent:
    """One XID reported for one GPU; ``at`` is wall-clock seconds (``time.time()``)."""

    index: int
    uuid: str
    code: int
    at: float


class HealthTracker:
    """GPU health as the agent publishes it: healthy unless a critical XID hit it.

    Health is not read back from NVML: the driver has no "this GPU is broken" query, only the event
    stream. So the agent remembers each hit (by UUID, which survives re-enumeration), keeps it on its Node so
    that a restart does not forget it (:mod:`kubecell.kube.gpu_faults`), and only an operator's ``clear``
    (after a reset) makes the GPU healthy again. Thread-safe: the XID waiter writes, the publisher reads."""

    def __init__(self, critical: Iterable[int] = CRITICAL_XIDS) -> None:
        self.critical = frozenset(critical)
        self._faults: dict[str, RecordedFault] = {}
        self._lock = threading.Lock()

    def record(self, event: XidEvent) -> bool:
        """Note an XID; True when it made a healthy GPU unhealthy (the caller publishes at once)."""
        if event.code not in self.critical:
            return False
        with self._lock:
            if event.uuid in self._faults:
                return False
            self._faults[event.uuid] = RecordedFault(event.code, event.at or time.time())
            return True

    def restore(self, faults: Mapping[str, RecordedFault]) -> list[str]:
        """Take back faults recorded before a restart (the agent's record on its Node); a GPU already faulted
        keeps its own. Returns the UUIDs that became unhealthy."""
        with self._lock:
            added = [uuid for uuid in faults if uuid not in self._faults]
            self._faults.update((uuid, faults[uuid]) for uuid in added)
            return added

    def clear(self, uuid: str) -> bool:
        """Forget a GPU's fault (an operator reset it); True when it was unhealthy."""
        with self._lock:
            return self._faults.pop(uuid, None) is not None

    def healthy(self, uuid: str) -> bool:
        with self._lock:
            return uuid not in self._faults

    def faults(self) -> dict[str, RecordedFault]:
        """A copy of the unhealthy GPUs, by UUID."""
        with self._lock:
            return dict(self._faults)
