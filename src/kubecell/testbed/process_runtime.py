"""What the process kubelet keeps around each host process: its pid file, its live log, the shared runtime
settings, and one container's state between its attempts.

A container of the process kubelet is a host process in a session of its own. Every process of a container's
run carries :data:`CONTAINER_MARKER` in its environment, so that killing the container reaches the processes
that left its session too (:func:`signal_container`). The pid registry lets ``kill_leftovers`` end a process
whose kubelet died (checked against the process's start time, so a reused pid is never signalled); the live
logs tell ``kubectl logs -f`` which files are still being written; ``Runtime`` is what every
:class:`~kubecell.testbed.process_pod.PodWorker` of one kubelet shares.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubecell.core.digits import decimal_digits
from kubecell.kube.rest import Kube

CONTAINER_ID_SCHEME = "process://"
"""``containerID`` is ``process://<pid>``: the host process the container is."""


CONTAINER_MARKER = "KUBECELL_PROCESS_CONTAINER"
"""Set in the environment of each run of a container to a value of that run alone (pod UID, container name,
attempt). Every descendant inherits it, also one that leaves the container's process group: torchrun starts
each training process in a session of its own, so signalling the agent's group would leave the training
processes running, orphaned, after the pod is gone. A container's PID namespace ending kills them all; here
:func:`signal_container` finds them by this variable."""


def marked_processes(marker: str) -> list[int]:
    """The pids of the processes whose environment (as they were started) holds :data:`CONTAINER_MARKER`
    with the value ``marker``; those of other users, unreadable, are skipped (none of ours is among them)."""
    needle = f"{CONTAINER_MARKER}={marker}\0".encode()
    found: list[int] = []
    for entry in os.listdir("/proc"):
        if not decimal_digits(entry):
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if environ.startswith(needle) or b"\0" + needle in environ:
            found.append(int(entry))
    return found


def signal_container(pgid: int, marker: str, sig: signal.Signals) -> None:
    """Signal a container's process group and, where ``marker`` is given, every process marked as the
    container's (those that started sessions of their own included)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
    for pid in marked_processes(marker) if marker else ():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def process_start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22), which tells a
    process from a later one that reused its pid; None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None


class PidRegistry:
    """One file per running container process (``<pid>.json``: its process group, start time, pod and
    container), removed once the process is reaped: what ``kill_leftovers`` reads when the kubelet that
    started the processes died without stopping them."""

    def __init__(self, directory: Path, owner: str) -> None:
        self.directory = directory
        self.owner = owner
        """Which kubelet (``<pid>-<id>``: several may run in one process, as in tests) started them."""
        directory.mkdir(parents=True, exist_ok=True)

    def add(self, pid: int, *, pod: str, container: str, argv0: str, marker: str = "") -> None:
        entry = {"pid": pid, "pgid": pid, "start": process_start_time(pid), "pod": pod, "container": container,
                 "argv0": argv0, "kubelet": self.owner, "marker": marker}
        partial = self.directory / f".{pid}.partial"
        partial.write_text(json.dumps(entry))
        os.replace(partial, self.directory / f"{pid}.json")

    def remove(self, pid: int) -> None:
        (self.directory / f"{pid}.json").unlink(missing_ok=True)


class LiveLogs:
    """The log files whose process still runs: ``kubectl logs -f`` follows a file while it is listed."""

    def __init__(self) -> None:
        self._paths: set[Path] = set()
        self._lock = threading.Lock()

    def add(self, path: Path) -> None:
        with self._lock:
            self._paths.add(path)

    def discard(self, path: Path) -> None:
        with self._lock:
            self._paths.discard(path)

    def __contains__(self, path: object) -> bool:
        with self._lock:
            return path in self._paths


@dataclass
class Runtime:
    """What every worker of one process kubelet shares."""

    kube: Kube
    stop: threading.Event
    root: Path
    """``<testbed dir>/process-kubelet``: pods' directories, logs, pid files, the serving certificate."""
    api_url: str
    host_env: Mapping[str, str]
    pids: PidRegistry
    live_logs: LiveLogs
    backoff_initial: float = 1.0
    backoff_max: float = 30.0
    max_grace: float = 30.0
    shutdown_grace: float = 5.0
    ca_cert: Path | None = None
    """The API server's CA, for the pods' kubeconfigs (None: pods get no credentials)."""

    def pod_directory(self, namespace: str, name: str, uid: str) -> Path:
        """As the kubelet's ``/var/log/pods/<namespace>_<name>_<uid>``."""
        return self.root / "pods" / f"{namespace}_{name}_{uid}"


@dataclass
class Container:
    """One container of the pod and its current process (None between runs)."""

    spec: dict[str, Any]
    kind: str
    """``init``, ``sidecar`` (an init container with ``restartPolicy: Always``) or ``main``."""
    policy: str
    state: dict[str, Any]
    restart_count: int = 0
    attempts: int = 0
    process: subprocess.Popen[bytes] | None = None
    pid: int = 0
    marker: str = ""
    """The current run's :data:`CONTAINER_MARKER` value."""
    log: Path | None = None
    started_at: str = ""
    started_mono: float = 0.0
    last_state: dict[str, Any] = field(default_factory=dict)
    next_start: float | None = None
    backoff: float = 0.0
    exit_code: int | None = None
    done: bool = False
    """Terminated for good: exited and not to be restarted."""

    @property
    def name(self) -> str:
        return str(self.spec.get("name", ""))

    @property
    def running(self) -> bool:
        return self.process is not None

    def status(self) -> dict[str, Any]:
        ready = self.running or (self.kind == "init" and self.done and self.exit_code == 0)
        body: dict[str, Any] = {"name": self.name, "image": str(self.spec.get("image") or ""), "imageID": "",
                                "ready": ready, "started": self.running, "restartCount": self.restart_count,
                                "state": self.state, "lastState": self.last_state}
        if self.pid:
            body["containerID"] = f"{CONTAINER_ID_SCHEME}{self.pid}"
        return body


def exit_code_of(returncode: int) -> int:
    """A container's exit code: a process killed by signal N exits 128 + N (137 for SIGKILL)."""
    return returncode if returncode >= 0 else 128 - returncode
