"""One pod of the process kubelet: its containers as host processes, from admission to deletion.

A :class:`PodWorker` owns one bound pod for as long as the pod lives on a node the process kubelet
serves. It does, in one thread and in the order the kubelet does:

1. **admission**, as kubecell's node agent would answer the kubelet's ``Allocate``: a pod with a container
   asking for ``kubecell.io/gpu`` or ``kubecell.io/gpu-milli`` must carry an allocation record that can be
   trusted, is for this node, names GPUs the node's inventory lists and an isolation mode the node
   offers; otherwise the pod fails with ``UnexpectedAdmissionError`` and a ``GPUAllocationRefused``
   Warning Event, and nothing runs. On a node whose inventory says ``devicePlugin: true`` the worker
   writes the agent's acknowledgement (``kubecell.io/allocated``), so the scheduler's one-at-a-time
   handshake moves on;
2. **init containers** one after another (one with ``restartPolicy: Always`` is a sidecar: started, then
   kept running beside the others), a failing one restarted or failing the pod per ``restartPolicy``;
3. the **containers** together, each restarted per its (else the pod's) restart policy after a back-off
   that doubles from ``backoff_initial`` to ``backoff_max``;
4. the **phase** from the exit codes (Succeeded when every container exited 0 and none restarts, Failed
   when one did not), with ``containerStatuses``, ``initContainerStatuses`` and the conditions the
   kubelet writes;
5. **termination**: on graceful deletion SIGTERM to each container's process group, SIGKILL after the
   pod's grace period (at most ``max_grace``), a terminal status, then the pod object deleted with grace
   0 and its UID as precondition, as the kubelet does. A pod force-deleted, or whose node was deleted,
   has its processes killed the same way.

Every container runs in its own session (so its process group is its pid), with stdin closed and its
stdout and stderr appended to ``<pod dir>/<container>/<restart count>.log``. When its main process exits,
or when it is killed, the rest of its group is killed, and so is every process that left the group but
carries the run's ``KUBECELL_PROCESS_CONTAINER`` (torchrun's training processes, in sessions of their own):
what a container's PID namespace ending does. Each process is listed in the kubelet's pid directory until
it is reaped, so that ``kill_leftovers`` can end it should the kubelet itself die. Every wait is bounded
by the kubelet's stop event and a deadline.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kubecell.kube.actions import Actions
from kubecell.kube.clock import rfc3339
from kubecell.kube.inventory import node_view
from kubecell.kube.names import ANNOTATION_ACK
from kubecell.kube.records import AllocationRecord
from kubecell.kube.rest import ApiError
from kubecell.testbed.process_admission import admit
from kubecell.testbed.process_credentials import service_account_credentials
from kubecell.testbed.process_env import (
    ContainerConfigError,
    ContainerStartError,
    agent_environment,
    base_environment,
    command_line,
    container_environment,
    resolve_executable,
    service_environment,
    working_directory,
)
from kubecell.testbed.process_runtime import (
    CONTAINER_ID_SCHEME,
    CONTAINER_MARKER,
    Container,
    Runtime,
    exit_code_of,
    signal_container,
)
from kubecell.testbed.process_status import HOST_IP, POD_IP, pod_phase, refresh_conditions, status_body

log = logging.getLogger("kubecell.testbed.process_kubelet")

COMPONENT = "kubecell-process-kubelet"

TICK = 0.1
"""How often a worker looks at its processes (exits, due restarts, a deletion)."""
MIN_GRACE = 2.0
"""The kubelet's minimum grace period, used where the pod object is already gone (force deletion, node
deleted): the processes still get a SIGTERM before the SIGKILL."""
REAP_TIMEOUT = 5.0
"""How long to wait for a SIGKILLed process to be reaped (one stuck in uninterruptible sleep is left
to ``kill_leftovers`` through its pid file)."""
CONFIG_RETRY = 1.0
"""How soon a container waiting for its ConfigMap or Secret is tried again."""


class PodWorker:
    """Runs one pod's containers as host processes (see the module docstring)."""

    def __init__(self, runtime: Runtime, pod: dict[str, Any], node: Mapping[str, Any],
                 on_done: Callable[[PodWorker], None]) -> None:
        self.rt = runtime
        self.pod = pod
        self.node = node
        self.on_done = on_done
        meta = pod["metadata"]
        self.uid, self.namespace, self.name = str(meta["uid"]), str(meta.get("namespace", "default")), str(meta["name"])
        self.key = f"{self.namespace}/{self.name}"
        self.path = f"/api/v1/namespaces/{self.namespace}/pods/{self.name}"
        self.directory = runtime.pod_directory(self.namespace, self.name, self.uid)
        spec = pod.get("spec") or {}
        policy = str(spec.get("restartPolicy") or "Always")
        waiting_init = {"waiting": {"reason": "PodInitializing"}}
        creating = {"waiting": {"reason": "ContainerCreating"}}
        self.inits = [Container(dict(c), "sidecar" if c.get("restartPolicy") == "Always" else "init",
                                "Always" if c.get("restartPolicy") == "Always" else policy, dict(creating))
                      for c in spec.get("initContainers") or ()]
        self.mains = [Container(dict(c), "main", str(c.get("restartPolicy") or policy),
                                dict(waiting_init if self.inits else creating))
                      for c in spec.get("containers") or ()]
        self.containers = [*self.inits, *self.mains]
        self.record: AllocationRecord | None = None
        self.gpu_memory: dict[str, int] = {}
        self.credentials: dict[str, str] | None = None
        """The environment naming the pod's ServiceAccount kubeconfig (``process_credentials``), made once."""
        self.phase = "Pending"
        self.reason = ""
        self.message = ""
        self.start_time = rfc3339()
        self.initialized = False
        self.init_failed = False
        self.ending = False
        self.conditions: dict[str, dict[str, str]] = {}
        self.dirty = True
        self._patch_after = 0.0
        self._last_error = ""
        self._terminate = threading.Event()
        self._grace = float("inf")
        self._why = ""
        self._deleted = False
        self._node_gone = False
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self.run, name=f"pod {self.key}", daemon=True)

    # ------------------------------------------------------------------ requests from the kubelet
    def update(self, pod: dict[str, Any]) -> None:
        """The latest pod object (labels and annotations feed the downward API of later restarts)."""
        with self._lock:
            self.pod = pod

    def terminate(self, grace: float, *, deleted: bool = False, node_gone: bool = False, why: str = "") -> None:
        """Stop the pod's processes: SIGTERM, SIGKILL after ``grace`` (bounded by ``max_grace``). A later
        request may shorten the grace period, never lengthen it (as a second ``kubectl delete`` does)."""
        with self._lock:
            self._grace = min(self._grace, max(0.0, min(grace, self.rt.max_grace)))
            self._deleted = self._deleted or deleted
            self._node_gone = self._node_gone or node_gone
            self._why = self._why or why
        self._terminate.set()

    # ------------------------------------------------------------------ the pod's life
    def run(self) -> None:
        try:
            refusal = self._admit()
            if refusal is not None:
                self._refuse(refusal)
                return
            self._acknowledge()
            self._supervise()
        except Exception:  # a bug must not leave processes behind: the finally below kills them
            log.exception("pod %s: the worker failed", self.key)
        finally:
            running = [c for c in self.containers if c.running]
            if running:
                self._stop_processes(running, self.rt.shutdown_grace)
            self.on_done(self)

    def _admit(self) -> str | None:
        """Why the node agent would refuse this pod's GPUs, or None (:mod:`kubecell.testbed.process_admission`)."""
        admission = admit(self.pod, self.node, (c.spec for c in self.containers))
        self.record, self.gpu_memory = admission.record, admission.gpu_memory
        return admission.refusal

    def _refuse(self, why: str) -> None:
        """What the kubelet does when a device plugin's ``Allocate`` fails: the pod fails at admission."""
        log.warning("pod %s refused: %s", self.key, why)
        self.phase, self.reason = "Failed", "UnexpectedAdmissionError"
        self.message = f"Allocate failed due to {why}, which is unexpected"
        with contextlib.suppress(ApiError):
            Actions(self.rt.kube, COMPONENT).event(self.pod, "Warning", "GPUAllocationRefused", why, counted=False)
        self._patch(force=True)

    def _acknowledge(self) -> None:
        """The node agent's acknowledgement, where the node's inventory asks for the handshake."""
        annotations = self.pod["metadata"].get("annotations") or {}
        if self.record is None or ANNOTATION_ACK in annotations or not node_view(self.node).serial_binds:
            return
        try:
            self.rt.kube.patch(self.path, {"metadata": {"uid": self.uid, "annotations": {
                ANNOTATION_ACK: self.record.allocation_id}}})
        except ApiError as error:
            log.warning("pod %s: acknowledgement not written: %s", self.key, error)

    def _supervise(self) -> None:
        self._patch(force=True)
        index = 0
        while True:
            if self._terminate.is_set():
                self._terminate_pod()
                return
            if self.rt.stop.is_set():
                return  # the kubelet stops: run()'s finally ends the processes, the pod object stays
            now = time.monotonic()
            self._collect_exits(now)
            if self.init_failed:
                self._finish()
                return
            while not self.initialized:
                if index >= len(self.inits):
                    self.initialized, self.dirty = True, True
                    for container in self.mains:
                        container.next_start = now
                    break
                current = self.inits[index]
                if (current.kind == "sidecar" and current.running) or (current.done and current.exit_code == 0):
                    index += 1
                    continue
                if not current.running and current.next_start is None and not current.done:
                    current.next_start = now
                break
            self._start_due(now)
            if self.initialized and all(c.done for c in self.mains):
                self._finish()
                return
            if self.dirty:
                self._patch()
            self._terminate.wait(TICK)

    # ------------------------------------------------------------------ processes
    def _exited(self, container: Container) -> int | None:
        """The exit code when the container's main process ended (it is then reaped, and what is left of
        its process group killed), else None."""
        process = container.process
        if process is None:
            return None
        zombie = True
        try:
            if os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                return None
        except ChildProcessError:
            zombie = False  # reaped elsewhere (never by this worker): its pid may be another's by now
        if zombie:  # not reaped yet, so the pid (and group id) cannot have been reused: the group is ours
            signal_container(process.pid, container.marker, signal.SIGKILL)
        returncode = process.wait()
        self._forget(container)
        return exit_code_of(returncode)

    def _forget(self, container: Container) -> None:
        self.rt.pids.remove(container.pid)
        if container.log is not None:
            self.rt.live_logs.discard(container.log)
        container.process = None

    def _collect_exits(self, now: float, *, restart: bool = True) -> None:
        for container in self.containers:
            code = self._exited(container)
            if code is None:
                continue
            container.exit_code = code
            container.state = {"terminated": {
                "exitCode": code, "reason": "Completed" if code == 0 else "Error", "startedAt": container.started_at,
                "finishedAt": rfc3339(), "containerID": f"{CONTAINER_ID_SCHEME}{container.pid}"}}
            self.dirty = True
            log.info("pod %s container %s exited %d", self.key, container.name, code)
            if restart:
                self._after_exit(container, code, now)
            else:
                container.done = True

    def _after_exit(self, container: Container, code: int, now: float) -> None:
        """Restart or not, by the container's kind and restart policy."""
        if container.kind == "init":
            if code == 0:
                container.done = True
            elif container.policy == "Never":
                container.done = True
                self.init_failed = True
            else:
                self._back_off(container, now)
        elif container.kind == "sidecar":
            if self.ending:
                container.done = True
            else:
                self._back_off(container, now)
        elif container.policy == "Always" or (container.policy == "OnFailure" and code != 0):
            self._back_off(container, now)
        else:
            container.done = True

    def _back_off(self, container: Container, now: float) -> None:
        """Restart after a delay doubling from ``backoff_initial`` to ``backoff_max`` (reset after a run of
        ten times the longest delay, as the kubelet forgets a crash loop after a healthy while)."""
        if container.started_mono and now - container.started_mono >= 10 * self.rt.backoff_max:
            container.backoff = 0.0
        container.backoff = (self.rt.backoff_initial if not container.backoff
                             else min(self.rt.backoff_max, 2 * container.backoff))
        container.next_start = now + container.backoff
        container.last_state = container.state
        container.state = {"waiting": {"reason": "CrashLoopBackOff", "message": (
            f"back-off {container.backoff:g}s restarting failed container={container.name} "
            f"pod={self.name}_{self.namespace}({self.uid})")}}
        self.dirty = True

    def _start_due(self, now: float) -> None:
        for container in self.containers:
            if (not container.running and not container.done and container.next_start is not None
                    and container.next_start <= now):
                container.next_start = None
                self._start(container, now)

    def _begin_attempt(self, container: Container) -> Path:
        """Count the attempt (every one after the first is a restart) and give it a fresh log file."""
        if container.attempts:
            container.restart_count += 1
        container.attempts += 1
        directory = self.directory / container.name
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{container.restart_count}.log"
        path.unlink(missing_ok=True)
        container.log = path
        return path

    def _environment(self, container: Container) -> dict[str, str]:
        with self._lock:
            pod = self.pod
        home = self.directory / "home"
        home.mkdir(parents=True, exist_ok=True)
        if self.credentials is None and self.rt.ca_cert is not None:
            try:
                self.credentials = service_account_credentials(self.rt.kube, pod, self.directory,
                                                               api_url=self.rt.api_url, ca_cert=self.rt.ca_cert)
            except ApiError as error:
                raise ContainerConfigError(f"no token for the pod's ServiceAccount: {error}") from None
        return container_environment(
            pod, container.spec, base=base_environment(pod, home, self.rt.host_env),
            service=service_environment(self.rt.api_url) | (self.credentials or {}),
            agent=agent_environment(container.spec, self.record, self.gpu_memory), fetch=self._fetch,
            allocatable=(self.node.get("status") or {}).get("allocatable") or {}, pod_ip=POD_IP, host_ip=HOST_IP)

    def _fetch(self, path: str) -> Mapping[str, Any] | None:
        try:
            return self.rt.kube.get(path)
        except ApiError as error:
            if error.not_found:
                return None
            raise ContainerConfigError(f"cannot read {path}: {error}") from None

    def _start(self, container: Container, now: float) -> None:
        try:
            env = self._environment(container)
            workdir = working_directory(container.spec, self.directory / "work" / container.name)
            argv = command_line(container.spec, env)
            executable = resolve_executable(argv[0], env, workdir)
        except ContainerConfigError as error:
            container.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(error)}}
            container.next_start = now + CONFIG_RETRY
            self.dirty = True
            return
        except ContainerStartError as error:
            self._start_failed(container, str(error), now)
            return
        path = self._begin_attempt(container)
        env[CONTAINER_MARKER] = container.marker = f"{self.uid}/{container.name}/{container.attempts}"
        try:
            with open(path, "ab") as out:
                process = subprocess.Popen(argv, executable=executable, cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                                           stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                           close_fds=True)
        except OSError as error:
            self._start_failed(container, f'exec: "{argv[0]}": {error.strerror or error}', now, counted=True)
            return
        container.process, container.pid = process, process.pid
        self.rt.pids.add(process.pid, pod=self.key, container=container.name, argv0=argv[0], marker=container.marker)
        self.rt.live_logs.add(path)
        container.started_at, container.started_mono = rfc3339(), now
        container.state = {"running": {"startedAt": container.started_at}}
        self.dirty = True
        log.info("pod %s container %s started: pid %d, %s", self.key, container.name, process.pid, argv[:4])

    def _start_failed(self, container: Container, message: str, now: float, *, counted: bool = False) -> None:
        """A container that cannot start terminates with ``StartError`` (exit code 128), the reason written
        into its log too, so that ``kubectl logs`` says why."""
        path = container.log if counted and container.log is not None else self._begin_attempt(container)
        with contextlib.suppress(OSError), open(path, "ab") as out:
            out.write(f"kubecell process kubelet: container {container.name!r} cannot start: {message}\n".encode())
        stamp = rfc3339()
        container.exit_code = 128
        container.state = {"terminated": {"exitCode": 128, "reason": "StartError", "message": message,
                                          "startedAt": stamp, "finishedAt": stamp}}
        self.dirty = True
        log.warning("pod %s container %s cannot start: %s", self.key, container.name, message)
        self._after_exit(container, 128, now)

    def _stop_processes(self, containers: list[Container], grace: float) -> None:
        """SIGTERM to each process group, SIGKILL to what still runs after ``grace`` seconds (shortened to
        ``shutdown_grace`` when the kubelet stops meanwhile); every process is reaped."""
        targets = [c for c in containers if c.running]
        for container in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(container.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while any(c.running for c in targets):
            now = time.monotonic()
            if self.rt.stop.is_set():
                deadline = min(deadline, now + self.rt.shutdown_grace)
            if now >= deadline:
                break
            self._collect_exits(now, restart=False)
            time.sleep(0.05)
        for container in targets:
            if not container.running:
                continue
            assert container.process is not None
            signal_container(container.pid, container.marker, signal.SIGKILL)
            try:
                container.process.wait(REAP_TIMEOUT)
            except subprocess.TimeoutExpired:  # uninterruptible: its pid file stays for kill_leftovers
                log.error("pod %s container %s (pid %d) did not die after SIGKILL", self.key, container.name,
                          container.pid)
                container.process = None
                continue
        self._collect_exits(time.monotonic(), restart=False)

    # ------------------------------------------------------------------ the end
    def _finish(self) -> None:
        """Every container is done (or an init container failed for good): stop the sidecars, write the
        terminal phase."""
        self.ending = True
        sidecars = [c for c in self.inits if c.kind == "sidecar" and c.running]
        if sidecars:
            self._stop_processes(sidecars, min(self._pod_grace(), self.rt.max_grace))
        mains = self.mains if not self.init_failed else []
        self.phase = "Succeeded" if mains and all(c.exit_code == 0 for c in mains) else "Failed"
        log.info("pod %s %s", self.key, self.phase)
        self._patch(force=True)

    def _pod_grace(self) -> float:
        spec = self.pod.get("spec") or {}
        return float(spec.get("terminationGracePeriodSeconds", 30))

    def _terminate_pod(self) -> None:
        with self._lock:
            grace, deleted, node_gone, why = self._grace, self._deleted, self._node_gone, self._why
        self.ending = True
        log.info("pod %s terminating (grace %.0f s)%s", self.key, grace, f": {why}" if why else "")
        self._stop_processes([c for c in self.containers if c.running], grace)
        if deleted:
            return  # the object is gone already: nothing to report it on
        for container in self.containers:
            if "terminated" not in container.state:
                container.state = container.last_state if "terminated" in container.last_state else {
                    "terminated": {"exitCode": 137, "reason": "ContainerStatusUnknown",
                                   "message": "The container could not be located when the pod was terminated"}}
        attempted = [c for c in self.mains if c.attempts]
        self.phase = "Succeeded" if attempted and len(attempted) == len(self.mains) and all(
            c.exit_code == 0 for c in self.mains) else "Failed"
        if node_gone:
            self.phase, self.reason, self.message = "Failed", "NodeLost", why
            with contextlib.suppress(ApiError):
                self._patch(force=True)
            return
        self._patch(force=True)
        try:
            self.rt.kube.delete(self.path, {"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}})
        except ApiError as error:
            if not (error.not_found or error.conflict):
                log.warning("pod %s not deleted: %s", self.key, error)

    # ------------------------------------------------------------------ status
    def _patch(self, *, force: bool = False) -> None:
        """Write the status (a strategic merge with the pod's UID as precondition); a failed write is tried
        again on a later tick, at most once a second."""
        now = time.monotonic()
        if not force and now < self._patch_after:
            return
        self.dirty = False
        self.phase = pod_phase(self.phase, self.initialized, self.mains)
        refresh_conditions(self.conditions, self.phase, self.initialized, self.inits, self.mains)
        status = status_body(self.phase, self.start_time, self.conditions, self.inits, self.mains,
                             reason=self.reason, message=self.message)
        try:
            self.rt.kube.patch(f"{self.path}/status", {"metadata": {"uid": self.uid}, "status": status},
                               kind="strategic")
        except ApiError as error:
            replaced = error.status == 422 and "metadata.uid" in error.api_message  # the UID precondition
            if error.not_found or error.conflict or replaced:  # deleted, or replaced by a pod of the same name
                self.terminate(MIN_GRACE, deleted=True, why="the pod object is gone")
                return
            if str(error) != self._last_error:  # once per kind of failure, not once a second
                log.warning("pod %s: status not written (retrying every second): %s", self.key, error)
                self._last_error = str(error)
            self.dirty, self._patch_after = True, now + 1.0
            return
        self._last_error = ""
