"""Process -> pod: which pod a GPU process belongs to, from its cgroup (``/proc/<pid>/cgroup``, cgroup v1 or v2,
systemd or cgroupfs driver). The kubelet puts every container under a ``pod<uid>`` directory, so the path names the
pod's UID and no container runtime needs to be asked. Used by the overuse monitor (:mod:`kubecell.node.overuse`)."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("kubecell.node.overuse")

# systemd driver: .../kubepods-burstable.slice/kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope
# (also kind's kubelet-kubepods-... and Guaranteed pods' kubepods-pod<uid>.slice)
_SYSTEMD = re.compile(r"kubepods(?:-burstable|-besteffort)?-pod(?P<uid>[0-9a-fA-F_]{32,36})\.slice(?:/|$)")
# cgroupfs driver: /kubepods/burstable/pod<uid>/<container> (and /kubepods/pod<uid>/... for Guaranteed)
_CGROUPFS = re.compile(r"(?:^|/)kubepods(?:/burstable|/besteffort)?/pod(?P<uid>[0-9a-fA-F-]{32,36})(?:/|$)")


def pod_uid_of_cgroup(text: str) -> str | None:
    """The pod UID a ``/proc/<pid>/cgroup`` file names (lower case, dashed), or None for a process outside
    ``kubepods``. Every line is read, so cgroup v1 (one line per hierarchy) and v2 (``0::<path>``) both work."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        match = _SYSTEMD.search(path) or _CGROUPFS.search(path)
        if match:
            return match["uid"].replace("_", "-").lower()
    return None


@dataclass(frozen=True, slots=True)
class ProcCgroups:
    """Process -> pod UID through ``<proc_root>/<pid>/cgroup``; tests point ``proc_root`` at a temp dir.

    The agent runs with the host's PID namespace (``hostPID``), so the pids NVML reports are its own."""

    proc_root: Path = Path("/proc")

    def pod_uid(self, pid: int) -> str | None:
        """None for a host process and for a process that exited (or cannot be read) since NVML listed it."""
        try:
            text = (self.proc_root / str(pid) / "cgroup").read_text(errors="replace")
        except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
            return None
        except PermissionError:
            log.warning("cannot read %s: the agent needs hostPID and root", self.proc_root / str(pid) / "cgroup")
            return None
        return pod_uid_of_cgroup(text)

    def own_pod_uid(self) -> str | None:
        """The pod this agent runs in, from ``<proc_root>/self/cgroup`` (with ``hostPID`` the host's ``/proc``
        resolves ``self`` to the agent), or None outside a pod."""
        try:
            return pod_uid_of_cgroup((self.proc_root / "self" / "cgroup").read_text(errors="replace"))
        except OSError:
            return None
