"""A real kubelet (v1.37.2, built like the control plane) on a fake CRI runtime, for the node tests.

The kubelet runs unmodified: it registers its Node, serves the device plugin registration socket and
the PodResources API, admits pods bound to it (calling the device plugins' ``GetPreferredAllocation``
and ``Allocate``) and "runs" them on ``fakecri`` - the fake remote runtime of ``k8s.io/cri-client``
(the one kubemark's hollow nodes use) served on a Unix socket: sandboxes and containers are entries in
memory, nothing executes. What makes it start in a container or VM without containerd, systemd or
cgroup v2 is all in :func:`kubelet_config`: ``failCgroupV1: false`` (1.35+ refuses cgroup v1
otherwise), ``failSwapOn: false``, ``cgroupsPerQOS: false`` and no ``enforceNodeAllocatable`` (no
cgroups are created), no local storage isolation (the fake runtime has no image filesystem), its
servers on 127.0.0.1 with authentication off.

The kubelet hard-codes a few host paths whatever its ``--root-dir``: the device plugin directory
``/var/lib/kubelet/device-plugins`` (``k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1.DevicePluginPath``),
``/var/log/containers``, its default certificate directory ``/var/lib/kubelet/pki`` (and libmount's
``/run/mount``). So it runs in a private mount namespace (``unshare --mount``) in which ``<root>/var-lib``
is bind-mounted on ``/var/lib``, ``<root>/var-log`` on ``/var/log`` and ``<root>/run`` on ``/run``:
nothing is written to the host's directories, the bind mount the kubelet makes of its own root
directory (to make it rshared) stays inside the namespace and vanishes with the process, several
kubelets can run at once, and a test reaches the sockets through the same inodes at
``<root>/var-lib/kubelet/...``. Keep ``root`` short (``/tmp/kcXXXX``): Unix socket paths are limited
to ~107 bytes. This needs root (mount namespaces, and the kubelet's own checks).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubecell.testbed.build import NodeBinaries, TestbedUnavailable
from kubecell.testbed.processes import TestbedError, free_port, spawn, tail, terminate, wait_http

TAINT_KEY = "kubecell.io/real-kubelet"
"""The kubelet registers its Node with this ``NoSchedule`` taint, so that the testbed's schedulers never
place other tests' pods on it; the tests bind their pods with ``spec.nodeName`` and a toleration."""

_MOUNTED = ("var-lib", "var-log", "run")
"""Host directories replaced, in the kubelet's mount namespace, by ``<root>/var-lib`` and so on."""

_NAMESPACE_SCRIPT = ("set -e; "
                     + "".join(f'mount -n --bind "$1/{name}" /{name.replace("-", "/")}; ' for name in _MOUNTED)
                     + 'shift; exec "$@"')
"""Runs in the kubelet's new mount namespace (``-n``: mount(8) writes no utab into the host's /run)."""


class RealKubeletUnavailable(TestbedUnavailable):
    """The real kubelet cannot run here (not Linux, not root, no ``unshare``, or it failed to start)."""


def preflight() -> str:
    """The ``unshare`` executable, or the reason a real kubelet cannot run on this machine."""
    if not sys.platform.startswith("linux"):
        raise RealKubeletUnavailable(f"the kubelet runs on Linux only (this is {sys.platform})")
    if os.geteuid() != 0:
        raise RealKubeletUnavailable("the real kubelet needs root (a private mount namespace, cgroup and "
                                     "/proc checks); run the tests as root, e.g. in a container or VM")
    unshare = shutil.which("unshare")
    if unshare is None:
        raise RealKubeletUnavailable("no `unshare` (util-linux) on PATH: the kubelet runs in a private mount "
                                     "namespace so that it does not write to the host's /var/lib/kubelet")
    return unshare


def kubelet_config(*, runtime_endpoint: str, port: int, healthz_port: int, volume_plugin_dir: Path) -> dict[str, Any]:
    """The KubeletConfiguration for a kubelet on ``fakecri`` in a sandbox (see the module docstring)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "failSwapOn": False,
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "localStorageCapacityIsolation": False,
        "containerRuntimeEndpoint": runtime_endpoint,
        "imageServiceEndpoint": runtime_endpoint,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "staticPodPath": "",
        "resolvConf": "",
        "volumePluginDir": str(volume_plugin_dir),
        "registerNode": True,
        "registerWithTaints": [{"key": TAINT_KEY, "effect": "NoSchedule"}],
        "nodeStatusUpdateFrequency": "2s",
        "syncFrequency": "5s",
    }


@dataclass
class RealKubelet:
    """One kubelet and its fake CRI runtime under ``root``; ``start`` returns once both serve."""

    binaries: NodeBinaries
    kubeconfig: Path
    node: str
    root: Path
    verbosity: int = 2
    _processes: list[tuple[subprocess.Popen[bytes], str]] = field(default_factory=list)

    @property
    def kubelet_dir(self) -> Path:
        """The host path of the kubelet's ``/var/lib/kubelet`` (its ``--root-dir``)."""
        return self.root / "var-lib" / "kubelet"

    @property
    def device_plugin_dir(self) -> Path:
        return self.kubelet_dir / "device-plugins"

    @property
    def pod_resources(self) -> Path:
        return self.kubelet_dir / "pod-resources" / "kubelet.sock"

    @property
    def runtime_socket(self) -> Path:
        return self.root / "fakecri.sock"

    @property
    def kubelet_log(self) -> Path:
        return self.root / "kubelet.log"

    @property
    def fakecri_log(self) -> Path:
        return self.root / "fakecri.log"

    def start(self, timeout: float = 60.0) -> RealKubelet:
        unshare = preflight()
        for directory in (self.kubelet_dir, *(self.root / name for name in _MOUNTED)):
            directory.mkdir(parents=True, exist_ok=True)
        try:
            self._start_fakecri(timeout)
            self._start_kubelet(unshare, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_fakecri(self, timeout: float) -> None:
        self.runtime_socket.unlink(missing_ok=True)
        process = spawn([str(self.binaries.fakecri), f"--endpoint=unix://{self.runtime_socket}"], self.fakecri_log)
        self._processes.append((process, str(self.binaries.fakecri)))
        self._wait_path(self.runtime_socket, process, self.fakecri_log, timeout, "fakecri")

    def _start_kubelet(self, unshare: str, timeout: float) -> None:
        healthz = free_port()
        config = kubelet_config(runtime_endpoint=f"unix://{self.runtime_socket}", port=free_port(),
                                healthz_port=healthz, volume_plugin_dir=self.root / "volume-plugins")
        config_file = self.root / "kubelet-config.json"
        config_file.write_text(json.dumps(config, indent=2))
        kubelet = [str(self.binaries.kubelet), f"--config={config_file}", "--root-dir=/var/lib/kubelet",
                   f"--hostname-override={self.node}", f"--kubeconfig={self.kubeconfig}", f"--v={self.verbosity}"]
        # unshare execs sh, which execs the kubelet: the process spawned *is* the kubelet
        command = [unshare, "--mount", "--propagation", "private", "/bin/sh", "-c", _NAMESPACE_SCRIPT, "sh",
                   str(self.root), *kubelet]
        process = spawn(command, self.kubelet_log)
        self._processes.append((process, str(self.binaries.kubelet)))
        try:
            wait_http(f"http://127.0.0.1:{healthz}/healthz", process=process, log=self.kubelet_log, timeout=timeout)
        except TestbedError as error:
            raise RealKubeletUnavailable(f"the kubelet did not start: {error}") from error
        remaining = max(5.0, timeout / 2)
        self._wait_path(self.device_plugin_dir / "kubelet.sock", process, self.kubelet_log, remaining,
                        "the kubelet's device plugin registration socket")
        self._wait_path(self.pod_resources, process, self.kubelet_log, remaining, "the kubelet's PodResources socket")

    @staticmethod
    def _wait_path(path: Path, process: subprocess.Popen[bytes], log: Path, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RealKubeletUnavailable(f"{what}: the process exited with status {process.returncode} "
                                             f"(log {log}):\n{tail(log, 25)}")
            if path.exists():
                return
            time.sleep(0.1)
        raise RealKubeletUnavailable(f"{what} ({path}) did not appear within {timeout:.0f} s (log {log}):\n"
                                     f"{tail(log, 25)}")

    def stop(self, grace: float = 10.0) -> None:
        """Stop the kubelet, then the runtime (its mount namespace goes with it); the Node object stays."""
        while self._processes:
            terminate(self._processes.pop()[0], grace)

    def restart_kubelet(self, timeout: float = 60.0) -> None:
        """Stop and start the kubelet only (it recreates its registration socket; plugins re-register)."""
        if len(self._processes) > 1:
            terminate(self._processes.pop()[0], 10.0)
        self._start_kubelet(preflight(), timeout)
