"""Build (once per machine and version) the control-plane binaries the testbed runs, and kubectl.

The control plane is etcd, kube-apiserver, kube-scheduler and kube-controller-manager (the last three
from ``k8s.io/kubernetes`` with the same link flags, so each reports the pinned version).

``go install k8s.io/kubernetes/cmd/kube-apiserver@v1.37.2`` does not work: the kubernetes module
requires its staging modules at ``v0.0.0`` and maps them to ``./staging`` with replace lines that a
dependent module ignores. The repository's ``testbed/k8s`` module therefore replaces each staging
module with its ``v0.37.2`` release (the list was derived from the kubernetes module's own go.mod),
and ``testbed/etcd`` wraps the etcd server module for the same reason. Both build with
``CGO_ENABLED=0`` (static, as upstream ships them) and ``GOTOOLCHAIN=local`` (a too-old Go fails
loudly instead of silently downloading a toolchain).

A build is several minutes of compile on two cores, so the binaries are cached per version outside
the repository, stamped with a hash of the module files that produced them, and built under a file
lock so that parallel test sessions never build twice or see a half-written binary.

The node side (the kubelet, and ``fakecri``: the fake CRI runtime of ``k8s.io/cri-client`` served on a
Unix socket) builds from its own module, ``testbed/node``, with its own stamp (``stamp-node``): only the
real-kubelet tests need it, so neither module's changes rebuild the other's binaries.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kubecell.core.errors import KubecellError
from kubecell.testbed.paths import ETCD_VERSION, K8S_VERSION, binary_dir, go_modules_dir


class TestbedUnavailable(KubecellError):  # noqa: N818 - reads as a state, like FileNotFoundError's peers
    """The testbed cannot run on this machine (no Go toolchain, no source checkout, a failed build)."""


@dataclass(frozen=True, slots=True)
class Binaries:
    etcd: Path
    kube_apiserver: Path
    kube_scheduler: Path
    kube_controller_manager: Path
    """Runs the workload controllers (Deployment, Job, ...), the garbage collector, the namespace and
    service-account controllers: without it a Deployment never gets a pod (``control_plane.py``)."""
    kubectl: Path
    """The client of the same release: the deploy tests run ``kubectl apply -k --dry-run=server`` with it
    (kustomize is built in), and a CI machine has no kubectl, or one of another version."""

    def all(self) -> tuple[Path, ...]:
        return (self.etcd, self.kube_apiserver, self.kube_scheduler, self.kube_controller_manager, self.kubectl)


@dataclass(frozen=True, slots=True)
class Target:
    """One binary: the Go module directory it builds in, its package and its link flags."""

    name: str
    module: str
    package: str
    ldflags: str


def _k8s_ldflags(version: str) -> str:
    major, minor = version.lstrip("v").split(".")[:2]
    base = "k8s.io/component-base/version"
    return " ".join((
        "-s -w",
        f"-X {base}.gitVersion={version}",
        f"-X {base}.gitMajor={major}",
        f"-X {base}.gitMinor={minor}",
        f"-X {base}.gitTreeState=clean",
    ))


def targets(version: str = K8S_VERSION) -> tuple[Target, ...]:
    return (
        Target("etcd", "etcd", "go.etcd.io/etcd/server/v3", "-s -w"),
        Target("kube-apiserver", "k8s", "k8s.io/kubernetes/cmd/kube-apiserver", _k8s_ldflags(version)),
        Target("kube-scheduler", "k8s", "k8s.io/kubernetes/cmd/kube-scheduler", _k8s_ldflags(version)),
        Target("kube-controller-manager", "k8s", "k8s.io/kubernetes/cmd/kube-controller-manager",
               _k8s_ldflags(version)),
        Target("kubectl", "k8s", "k8s.io/kubernetes/cmd/kubectl", _k8s_ldflags(version)),
    )


def node_targets(version: str = K8S_VERSION) -> tuple[Target, ...]:
    """The kubelet and the fake CRI runtime it runs pods on (``kubecell.testbed.real_kubelet``)."""
    return (
        Target("kubelet", "node", "k8s.io/kubernetes/cmd/kubelet", _k8s_ldflags(version)),
        Target("fakecri", "node", "./cmd/fakecri", "-s -w"),
    )


NODE_MODULE_FILES = ("node/go.mod", "node/go.sum", "node/cmd/fakecri/main.go")


def module_stamp(modules: Path) -> str:
    """A hash of the Go module files: binaries built from other module files are rebuilt."""
    digest = hashlib.sha256()
    for name in ("k8s/go.mod", "k8s/go.sum", "etcd/go.mod", "etcd/go.sum"):
        path = modules / name
        digest.update(name.encode())
        digest.update(path.read_bytes() if path.is_file() else b"-")
    digest.update(f"{K8S_VERSION} {ETCD_VERSION}".encode())
    return digest.hexdigest()[:16]


def node_module_stamp(modules: Path) -> str:
    """A hash of the node module's files (the kubelet and ``fakecri`` are rebuilt when they change)."""
    digest = hashlib.sha256()
    for name in NODE_MODULE_FILES:
        path = modules / name
        digest.update(name.encode())
        digest.update(path.read_bytes() if path.is_file() else b"-")
    digest.update(K8S_VERSION.encode())
    return digest.hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class NodeBinaries:
    kubelet: Path
    fakecri: Path

    def all(self) -> tuple[Path, ...]:
        return (self.kubelet, self.fakecri)


def cached_node_binaries(version: str = K8S_VERSION) -> NodeBinaries | None:
    """The cached kubelet and ``fakecri`` for ``version`` if present and built from today's module files."""
    directory = binary_dir(version)
    binaries = NodeBinaries(directory / "kubelet", directory / "fakecri")
    if not all(path.is_file() and os.access(path, os.X_OK) for path in binaries.all()):
        return None
    modules = go_modules_dir()
    stamp = directory / "stamp-node"
    if (modules / "node").is_dir() and (not stamp.is_file() or stamp.read_text().strip() != node_module_stamp(modules)):
        return None
    return binaries


def ensure_node_binaries(version: str = K8S_VERSION, *, log: Callable[[str], None] = print) -> NodeBinaries:
    """The cached kubelet and ``fakecri``, building them first (the kubelet: ~7 min on two cores)."""
    found = cached_node_binaries(version)
    if found is not None:
        return found
    _build_set(version, "node", node_targets(version), "stamp-node", node_module_stamp,
               lambda: cached_node_binaries(version) is not None, "the kubelet and fakecri", log)
    directory = binary_dir(version)
    return NodeBinaries(directory / "kubelet", directory / "fakecri")


def _binaries(directory: Path) -> Binaries:
    return Binaries(directory / "etcd", directory / "kube-apiserver", directory / "kube-scheduler",
                    directory / "kube-controller-manager", directory / "kubectl")


def cached_binaries(version: str = K8S_VERSION) -> Binaries | None:
    """The cached binaries for ``version`` if all are present and built from today's module files."""
    directory = binary_dir(version)
    binaries = _binaries(directory)
    if not all(path.is_file() and os.access(path, os.X_OK) for path in binaries.all()):
        return None
    modules = go_modules_dir()
    stamp = directory / "stamp"
    if modules.is_dir() and (not stamp.is_file() or stamp.read_text().strip() != module_stamp(modules)):
        return None
    return binaries


def go_toolchain() -> str:
    """The ``go`` executable, or a clear reason why the testbed cannot be built."""
    go = shutil.which("go")
    if go is None:
        raise TestbedUnavailable(
            "no Go toolchain on PATH: the testbed builds kube-apiserver, kube-scheduler, "
            "kube-controller-manager and etcd from Go "
            f"modules once per machine (Go {_required_go()} or newer; https://go.dev/dl/)")
    return go


def _required_go() -> str:
    gomod = go_modules_dir() / "k8s" / "go.mod"
    if gomod.is_file():
        for line in gomod.read_text().splitlines():
            if line.startswith("go "):
                return line.split()[1]
    return "1.26"


def ensure_binaries(version: str = K8S_VERSION, *, log: Callable[[str], None] = print) -> Binaries:
    """The cached binaries, building them first when they are missing or stale."""
    found = cached_binaries(version)
    if found is not None:
        return found
    _build_set(version, "k8s", targets(version), "stamp", module_stamp,
               lambda: cached_binaries(version) is not None, "the testbed binaries", log)
    return _binaries(binary_dir(version))


def _build_set(version: str, module: str, wanted: Sequence[Target], stamp_name: str,
               stamp: Callable[[Path], str], cached: Callable[[], bool], what: str,
               log: Callable[[str], None]) -> None:
    """Build ``wanted`` under the machine-wide build lock, unless another session built them while this one
    waited for it, and stamp them with the module files they were built from."""
    modules = go_modules_dir()
    if not (modules / module / "go.mod").is_file():
        raise TestbedUnavailable(
            f"{what} for {version} are not in {binary_dir(version)} and the Go module that builds them is not "
            f"at {modules / module} (building needs a source checkout of kubecell)")
    go = go_toolchain()
    directory = binary_dir(version)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be building: wait for it, then re-check
        if cached():
            return
        started = time.monotonic()
        for target in wanted:
            _build(go, modules / target.module, target, directory / target.name, log)
        (directory / stamp_name).write_text(stamp(modules) + "\n")
        log(f"{what} built in {time.monotonic() - started:.0f} s -> {directory}")


def _build(go: str, module: Path, target: Target, output: Path, log: Callable[[str], None]) -> None:
    log(f"building {target.name} ({target.package}); the first build on a machine takes several minutes")
    partial = output.with_name(output.name + ".partial")
    env = {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local"}
    command = [go, "build", "-trimpath", "-ldflags", target.ldflags, "-o", str(partial), target.package]
    started = time.monotonic()
    result = subprocess.run(command, cwd=module, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-15:])
        raise TestbedUnavailable(f"building {target.name} failed ({' '.join(command)} in {module}):\n{tail}")
    os.replace(partial, output)
    log(f"built {target.name} in {time.monotonic() - started:.0f} s")
