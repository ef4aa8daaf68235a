"""The MPS control daemons of a node: one per GPU that serves ``mps`` pods, and only while it does.

A pod in ``mps`` isolation gets the pipe and log directories of its GPU's MPS control daemon
(:meth:`kubecell.node.isolation.NodeIsolation.mps_dirs`, mounted into the container) and NVIDIA's per-client
limits in its environment; the limits are only enforced if a control daemon listens on that pipe. So the
agent runs the daemon, per GPU, exactly like NVIDIA documents it::

    CUDA_VISIBLE_DEVICES=<uuid> CUDA_MPS_PIPE_DIRECTORY=<root>/<uuid>/pipe \\
    CUDA_MPS_LOG_DIRECTORY=<root>/<uuid>/log nvidia-cuda-mps-control -d      # start
    echo quit | <same environment> nvidia-cuda-mps-control                    # stop

One daemon per GPU (not one for the node) keeps a GPU's clients apart from another's: a daemon that dies
takes down only the clients of its GPU. Each daemon is held by the allocations (``allocationId``) of the
mps pods served on its GPU: started when the first one is acquired, stopped when the last is released;
acquiring twice for one allocation is one hold, and a daemon found dead is started again on the next
acquire or :meth:`MpsDaemons.reconcile`. The daemon forks and its starter exits, so whether it runs is
read from ``/proc``: a process of this binary started with ``-d`` whose environment names this GPU's pipe
directory (the agent runs with ``hostPID`` and as root, so it can read that).

What is not done here: putting the GPU in ``EXCLUSIVE_PROCESS`` compute mode (an administrator's choice,
``nvidia-smi -c EXCLUSIVE_PROCESS``; without it non-MPS processes can still share the GPU), and MPS on
MIG instances.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

from kubecell.core.digits import decimal_digits
from kubecell.core.errors import KubecellError
from kubecell.kube import pods
from kubecell.kube.records import RecordError
from kubecell.node.isolation import NodeIsolation
from kubecell.node.nvml import GpuBackend, NvmlBackend

log = logging.getLogger("kubecell.node.mps")

MPS_CONTROL = "nvidia-cuda-mps-control"
DEFAULT_TIMEOUT = 10.0
"""Seconds a start or a stop may take (the binary's run, and the daemon appearing or leaving)."""
_POLL = 0.05
_SAFE_UUID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,127}$")
_INHERITED_OUT = ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY",
                  "NVIDIA_VISIBLE_DEVICES")
"""Variables of the agent's own environment the daemon must not inherit (it gets its GPU's values)."""


class MpsError(KubecellError):
    """An MPS control daemon could not be started or stopped: which GPU, which binary, and what it said."""


def mps_holders(listed: Iterable[Mapping[str, Any]], node: str,
                gpus: Collection[str] | None = None) -> dict[str, set[str]]:
    """GPU UUID -> allocation ids of the pods on ``node`` that hold it in ``mps`` isolation (what
    :meth:`MpsDaemons.reconcile` wants). Finished pods hold nothing; a pod whose record cannot be trusted
    was refused by the allocator and holds nothing either. With ``gpus`` (the UUIDs the node has), a GPU
    outside it holds nothing: a record is written by whoever can write the pod, and each UUID it names would
    otherwise be a daemon started for it."""
    holders: dict[str, set[str]] = {}
    for pod in listed:
        if pods.is_done(pod) or pods.node_of(pod) != node:
            continue
        try:
            record = pods.record_of(pod)
        except RecordError:
            continue
        if record is None or record.isolation != "mps" or record.node != node:
            continue
        for gpu in record.gpus:
            if gpus is None or gpu.uuid in gpus:
                holders.setdefault(gpu.uuid, set()).add(record.allocation_id)
    return holders


class MpsDaemons:
    """The MPS control daemons of one node, refcounted per GPU by the allocations that use them.

    ``binary`` is a name looked up on ``PATH`` or a path; ``real_gpus`` says whether the GPUs are real
    (a fake NVML backend has no driver to run MPS on: see :meth:`for_backend`); ``proc_root`` is where
    running daemons are looked for. Thread-safe: the allocator and a reconciler may call at once."""

    def __init__(self, isolation: NodeIsolation, *, binary: str | Path = MPS_CONTROL, real_gpus: bool = True,
                 proc_root: Path = Path("/proc"), timeout: float = DEFAULT_TIMEOUT) -> None:
        self.isolation = isolation
        self.binary = str(binary)
        self.real_gpus = real_gpus
        self.proc_root = proc_root
        self.timeout = timeout
        self.holders: dict[str, set[str]] = {}
        """GPU UUID -> the allocation ids holding its daemon."""
        self.starts = 0
        """Daemons started (restarts of dead ones included), for tests and metrics."""
        self._lock = threading.RLock()
        self._generation = 0
        self._acquired: dict[str, dict[str, int]] = {}
        """GPU UUID -> holder -> the generation it was acquired at, until a ``reconcile`` reads past it."""

    @classmethod
    def for_backend(cls, isolation: NodeIsolation, backend: GpuBackend, **options: Any) -> MpsDaemons:
        """Daemons for the GPUs ``backend`` reads: real only when it is NVML itself."""
        return cls(isolation, real_gpus=isinstance(backend, NvmlBackend), **options)

    # ------------------------------------------------------------------ questions
    def resolved(self) -> str | None:
        """The binary's path, or None when it is not installed (or not executable)."""
        if os.sep in self.binary:
            return self.binary if os.access(self.binary, os.X_OK) and Path(self.binary).is_file() else None
        return shutil.which(self.binary)

    def available(self) -> bool:
        """Whether this node can offer ``mps``: real GPUs and the control binary installed. A node that
        cannot must not advertise it, so the scheduler refuses mps pods instead of running them unlimited."""
        return self.real_gpus and self.resolved() is not None

    def environment(self, uuid: str) -> dict[str, str]:
        """The daemon's (and its control client's) environment for GPU ``uuid``."""
        pipe, log_dir = self.isolation.mps_dirs(self._checked(uuid))
        env = {key: value for key, value in os.environ.items() if key not in _INHERITED_OUT}
        env.update({"CUDA_VISIBLE_DEVICES": uuid, "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
                    "CUDA_MPS_LOG_DIRECTORY": str(log_dir)})
        return env

    def daemon_pids(self, uuid: str) -> list[int]:
        """The running control daemons of GPU ``uuid``: processes of this binary started with ``-d`` whose
        environment names the GPU's pipe directory (one expected; more means someone else started one)."""
        pipe, _ = self.isolation.mps_dirs(self._checked(uuid))
        wanted = f"CUDA_MPS_PIPE_DIRECTORY={pipe}".encode()
        name = os.path.basename(self.binary)
        found = []
        try:
            entries = list(self.proc_root.iterdir())
        except OSError as error:
            raise MpsError(f"cannot list processes in {self.proc_root}: {error}") from None
        for entry in entries:
            if not decimal_digits(entry.name):
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                if b"-d" not in argv or not any(os.path.basename(arg.decode(errors="replace")) == name
                                                for arg in argv):
                    continue
                if wanted in (entry / "environ").read_bytes().split(b"\0"):
                    found.append((int(entry.name), _parent(entry)))
            except OSError:  # exited meanwhile, or not ours to read
                continue
        pids = {pid for pid, _ in found}
        # a process the daemon forked has its command line and environment until it execs: the same daemon
        return sorted(pid for pid, parent in found if parent not in pids)

    def running(self, uuid: str) -> bool:
        return bool(self.daemon_pids(uuid))

    # ------------------------------------------------------------------ holding
    def acquire(self, uuid: str, holder: str) -> None:
        """``holder`` (an allocation id) uses GPU ``uuid`` in mps: its daemon runs when this returns.
        Idempotent; a daemon that died since is started again. ``MpsError`` if it cannot be started (the
        hold is then not taken, so the pod is refused rather than run without its limits)."""
        with self._lock:
            if not self.running(uuid):
                self._start(uuid)
            self.holders.setdefault(uuid, set()).add(holder)
            self._generation += 1
            self._acquired.setdefault(uuid, {})[holder] = self._generation

    def token(self) -> int:
        """Take before reading who holds what for ``reconcile(since=...)``: a hold acquired after it is one the
        reading may have missed."""
        with self._lock:
            return self._generation

    def release(self, uuid: str, holder: str) -> None:
        """``holder`` no longer uses GPU ``uuid``; the daemon is stopped when nobody holds it. Idempotent."""
        with self._lock:
            held = self.holders.get(uuid)
            if held is None:
                return
            held.discard(holder)
            self._acquired.get(uuid, {}).pop(holder, None)
            if not held:
                del self.holders[uuid]
                self._stop(uuid)

    def reconcile(self, wanted: Mapping[str, Iterable[str]], *, since: int | None = None) -> list[str]:
        """Make the daemons match ``wanted`` (GPU UUID -> holders, e.g. :func:`mps_holders` of the node's
        pods): start the missing or dead ones, stop those nobody holds, including daemons a previous agent
        left running under the MPS root. ``since``: the ``token`` taken before ``wanted`` was read; holds
        acquired after it are kept too (a pod admitted, a claim prepared, while the node's pods were listed:
        before, its daemon was stopped under it, and it ran without its limits until the next pass). Returns the
        problems met (each GPU is tried; one failing GPU does not keep another's daemon from starting or
        stopping)."""
        problems = []
        with self._lock:
            desired = {uuid: set(held) for uuid, held in wanted.items() if held}
            if since is not None:
                for uuid, stamps in list(self._acquired.items()):
                    fresh = {holder for holder, stamp in stamps.items() if stamp > since}
                    if fresh:
                        desired.setdefault(uuid, set()).update(fresh)
                    self._acquired[uuid] = {holder: stamps[holder] for holder in fresh}  # the rest: as read
                    if not fresh:
                        del self._acquired[uuid]
            for uuid in sorted(set(self.holders) | self._leftover()):
                if uuid not in desired:
                    self.holders.pop(uuid, None)
                    try:
                        self._stop(uuid)
                    except MpsError as error:
                        problems.append(str(error))
            for uuid, held in sorted(desired.items()):
                try:
                    if not self.running(uuid):
                        self._start(uuid)
                    self.holders[uuid] = held
                except MpsError as error:
                    problems.append(str(error))
        for problem in problems:
            log.warning("%s", problem)
        return problems

    def stop_all(self) -> None:
        """Stop every daemon this node runs (the agent's shutdown)."""
        self.reconcile({})

    # ------------------------------------------------------------------ internals
    def _checked(self, uuid: str) -> str:
        if not _SAFE_UUID.match(uuid):
            raise MpsError(f"{uuid!r} is not a GPU UUID (accepted: letters, digits and '-', as NVML's "
                           "GPU-... and MIG-... UUIDs)")
        return uuid

    def _leftover(self) -> set[str]:
        """GPUs under the MPS root whose daemon runs though nobody here holds it (a restarted agent)."""
        root = self.isolation.mps_root
        if not root.is_dir():
            return set()
        return {entry.name for entry in root.iterdir()
                if entry.is_dir() and _SAFE_UUID.match(entry.name) and self.running(entry.name)}

    def _binary(self, uuid: str) -> str:
        path = self.resolved()
        if path is None:
            raise MpsError(f"GPU {uuid}: cannot run an MPS control daemon: {self.binary} is not installed or not "
                           "executable (install the NVIDIA driver's utilities, or do not offer isolation mps)")
        if not self.real_gpus:
            raise MpsError(f"GPU {uuid}: cannot run an MPS control daemon on a fake GPU backend (isolation mps "
                           "needs real GPUs)")
        return path

    def _start(self, uuid: str) -> None:
        binary = self._binary(uuid)
        pipe, log_dir = self.isolation.mps_dirs(uuid)
        try:
            pipe.mkdir(parents=True, exist_ok=True)
            log_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise MpsError(f"GPU {uuid}: cannot create the MPS directories under {self.isolation.mps_root}: "
                           f"{error}") from None
        output = log_dir / "kubecell-control.out"
        offset = output.stat().st_size if output.exists() else 0
        # The daemon's stdio goes to a file, not a pipe: a forked daemon that kept a pipe open would make the
        # agent wait for the pipe's end until the timeout.
        with output.open("ab") as sink:
            try:
                result = subprocess.run([binary, "-d"], env=self.environment(uuid), stdin=subprocess.DEVNULL,
                                        stdout=sink, stderr=sink, timeout=self.timeout, check=False)
            except subprocess.TimeoutExpired:
                raise MpsError(f"GPU {uuid}: {binary} -d did not return in {self.timeout:g} s") from None
            except OSError as error:
                raise MpsError(f"GPU {uuid}: cannot run {binary}: {error}") from None
        if result.returncode != 0:
            raise MpsError(f"GPU {uuid}: {binary} -d exited with {result.returncode}: {_tail(output, offset)}")
        if not self._wait(lambda: self.running(uuid)):
            raise MpsError(f"GPU {uuid}: {binary} -d returned but no daemon runs for pipe directory {pipe} after "
                           f"{self.timeout:g} s (see {log_dir}/control.log): {_tail(output, offset)}")
        self.starts += 1
        log.info("MPS control daemon for GPU %s started (pipe %s)", uuid, pipe)

    def _stop(self, uuid: str) -> None:
        """``quit`` through the control client; a daemon that does not leave in time is terminated, since it
        holds the GPU for nobody."""
        if not self.running(uuid):
            return
        binary = self.resolved()
        if binary is None:
            raise MpsError(f"GPU {uuid}: cannot stop its MPS control daemon: {self.binary} is not installed")
        try:
            result = subprocess.run([binary], env=self.environment(uuid), input=b"quit\n", capture_output=True,
                                    timeout=self.timeout, check=False)
        except subprocess.TimeoutExpired:
            result = None
        except OSError as error:
            raise MpsError(f"GPU {uuid}: cannot run {binary}: {error}") from None
        if self._wait(lambda: not self.running(uuid)):
            log.info("MPS control daemon for GPU %s stopped", uuid)
            return
        said = "did not return" if result is None else \
            f"exited {result.returncode}: {result.stderr.decode(errors='replace').strip()[-300:]}"
        pids = self.daemon_pids(uuid)
        log.warning("MPS control daemon for GPU %s ignored quit (%s); terminating pid(s) %s", uuid, said, pids)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        if not self._wait(lambda: not self.running(uuid)):
            raise MpsError(f"GPU {uuid}: its MPS control daemon (pid {', '.join(map(str, pids))}) did not stop "
                           f"after quit ({said}) and SIGTERM")

    def _wait(self, condition: Callable[[], bool]) -> bool:
        deadline = time.monotonic() + self.timeout
        while True:
            if condition():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL)


def _tail(path: Path, offset: int, limit: int = 400) -> str:
    """The end of what the binary printed since ``offset`` (this run), for an error message."""
    try:
        with path.open("rb") as file:
            file.seek(offset)
            text = file.read().decode(errors="replace").strip()
    except OSError:
        return "(no output)"
    return text[-limit:] if text else "(no output)"


def _parent(entry: Path) -> int:
    """The parent pid in ``/proc/<pid>/stat`` (after the command name, which may hold spaces and parentheses)."""
    stat = (entry / "stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[1])
