"""Python stubs of the kubelet's gRPC APIs, generated from the upstream ``api.proto`` files on first use.

The device plugin API (``deviceplugin/v1beta1``), the PodResources API (``podresources/v1``), the DRA
kubelet plugin API (``dra/v1``: ``NodePrepareResources``/``NodeUnprepareResources``), its optional
resource-health API (``dra-health/v1``: ``NodeWatchResources``) and the plugin
registration API the kubelet's plugin watcher calls (``pluginregistration/v1``: ``GetInfo``) are defined
by ``k8s.io/kubelet``; the kubelet speaks exactly what those files say, so kubecell compiles them with
``grpcio-tools`` instead of hand-writing messages that could drift. The gRPC service names come from the
files' own ``package`` lines (``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``, ``pluginregistration.Registration``),
which is what the kubelet dials, whatever directory we compile them in. Nothing generated is
committed: the files come from the local Go module cache (present wherever the testbed was built)
or from the Go module proxy, checked against SHA-256 digests recorded here, and are compiled once per
machine into ``<cache>/protos/<version>/<stamp>/``. The stamp hashes the proto files and the versions
of protoc (grpcio-tools), protobuf and grpcio, because generated code refuses to load under an older
runtime than the one it was generated for. Generation runs under a file lock and publishes its
directory with one rename, so parallel sessions never compile twice or import a half-written module.

The generated modules live in a package named ``kubecell_kubelet_api`` that exists only in that cache
directory; the ``--proto_path`` layout makes the generated ``*_pb2_grpc`` modules import their
``*_pb2`` siblings by that package path, and :func:`_load` imports the package by file location.
They are untyped, so this module hands them out as ``Any`` and the callers wrap them in dataclasses.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import io
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubecell.cache import cache_root
from kubecell.core.errors import KubecellError

KUBELET_MODULE = "k8s.io/kubelet"
KUBELET_VERSION = "v0.37.2"
"""The ``k8s.io/kubelet`` release of Kubernetes v1.37.2, the release the testbed builds."""

MODULE_ZIP_SHA256 = "6f3490ac2534253d47fd49ab9dff9381636d6d2a96e59ff5df61f0bdbf39799f"
"""SHA-256 of ``https://proxy.golang.org/k8s.io/kubelet/@v/v0.37.2.zip`` (equal to the Go module cache's
``cache/download/k8s.io/kubelet/@v/v0.37.2.zip``; its go.sum hash is ``h1:AaRApKAcqmMD4pxmsxdghJHb...``)."""

PROXY_URL = "https://proxy.golang.org/k8s.io/kubelet/@v/v0.37.2.zip"

PACKAGE = "kubecell_kubelet_api"
"""Top-level package of the generated modules; only ever imported from the cache directory."""


@dataclass(frozen=True, slots=True)
class ProtoFile:
    """One upstream proto: where it is in the module, its digest, and where it goes in our layout."""

    upstream: str
    sha256: str
    package: str

    @property
    def target(self) -> str:
        return f"{PACKAGE}/{self.package.replace('.', '/')}/api.proto"

    @property
    def module(self) -> str:
        return f"{PACKAGE}.{self.package}.api"


DEVICEPLUGIN = ProtoFile("pkg/apis/deviceplugin/v1beta1/api.proto",
                         "b780bfeac99c93c231dc165ce417f4da88481eececa0c65eeb90f5f2e9b5b65b", "deviceplugin.v1beta1")
PODRESOURCES = ProtoFile("pkg/apis/podresources/v1/api.proto",
                         "b261f07b951c6ae807c90a3137475733a105c085d3fee62ac62199e0d986c823", "podresources.v1")
DRA = ProtoFile("pkg/apis/dra/v1/api.proto",
                "b3066ad7f6abcfd0003c47b06ceb801d76997d78d6be505597478d3905b9cc57", "dra.v1")
PLUGINREGISTRATION = ProtoFile("pkg/apis/pluginregistration/v1/api.proto",
                               "7a67a0000a1a167c155286834bc9ccb489f8bcdb394e006daba270189c272afa",
                               "pluginregistration.v1")
DRA_HEALTH = ProtoFile("pkg/apis/dra-health/v1/api.proto",
                       "a088e44962719a5184f183ef2fff4b017585434ff4f0cbad13ef8f8c782bc004", "drahealth.v1")
PROTO_FILES = (DEVICEPLUGIN, PODRESOURCES, DRA, PLUGINREGISTRATION, DRA_HEALTH)


class ProtoUnavailable(KubecellError):  # noqa: N818 - reads as a state, like TestbedUnavailable
    """The kubelet protos cannot be obtained or compiled (no grpcio-tools, no module, a digest mismatch)."""


@dataclass(frozen=True, slots=True)
class Api:
    """A generated API: ``pb2`` holds the messages, ``grpc`` the stubs, servicers and ``add_*_to_server``."""

    pb2: Any
    grpc: Any


# -- obtaining the sources ---------------------------------------------------------------------------


def go_mod_cache() -> Path | None:
    """``go env GOMODCACHE`` when Go is installed, else ``$GOMODCACHE`` / ``$GOPATH/pkg/mod`` / ``~/go/pkg/mod``."""
    go = shutil.which("go")
    if go is not None:
        try:
            result = subprocess.run([go, "env", "GOMODCACHE"], capture_output=True, text=True, timeout=30,
                                    check=False, env={**os.environ, "GOTOOLCHAIN": "local"})
            if result.returncode == 0 and result.stdout.strip():
                return Path(result.stdout.strip())
        except (OSError, subprocess.TimeoutExpired):
            pass
    if os.environ.get("GOMODCACHE"):
        return Path(os.environ["GOMODCACHE"])
    gopath = os.environ.get("GOPATH", "").split(os.pathsep)[0]
    candidate = (Path(gopath) if gopath else Path.home() / "go") / "pkg" / "mod"
    return candidate if candidate.is_dir() else None


def _checked(proto: ProtoFile, data: bytes, origin: str) -> bytes:
    digest = hashlib.sha256(data).hexdigest()
    if digest != proto.sha256:
        raise ProtoUnavailable(f"{origin}: SHA-256 {digest} does not match the recorded {proto.sha256} for "
                               f"{KUBELET_MODULE}@{KUBELET_VERSION} {proto.upstream}")
    return data


def sources_from_mod_cache(mod_cache: Path) -> dict[ProtoFile, bytes] | None:
    """The protos from an extracted module in the Go module cache, or None where it is not there."""
    root = mod_cache / f"{KUBELET_MODULE}@{KUBELET_VERSION}"
    paths = {proto: root / proto.upstream for proto in PROTO_FILES}
    if not all(path.is_file() for path in paths.values()):
        return None
    return {proto: _checked(proto, path.read_bytes(), str(path)) for proto, path in paths.items()}


def sources_from_zip(data: bytes, origin: str) -> dict[ProtoFile, bytes]:
    """The protos from the module zip the Go proxy serves, after checking the zip's SHA-256."""
    digest = hashlib.sha256(data).hexdigest()
    if digest != MODULE_ZIP_SHA256:
        raise ProtoUnavailable(f"{origin}: SHA-256 {digest} is not the recorded {MODULE_ZIP_SHA256} of "
                               f"{KUBELET_MODULE}@{KUBELET_VERSION}; refusing to compile its protos")
    prefix = f"{KUBELET_MODULE}@{KUBELET_VERSION}/"
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {proto: _checked(proto, archive.read(prefix + proto.upstream), f"{origin}:{proto.upstream}")
                for proto in PROTO_FILES}


def download_module(timeout: float = 60.0) -> bytes:
    """The module zip from the Go module proxy (``$GOPROXY``'s first https entry, else proxy.golang.org)."""
    url = PROXY_URL
    for entry in os.environ.get("GOPROXY", "").replace("|", ",").split(","):
        if entry.startswith("https://"):
            url = f"{entry.rstrip('/')}/{KUBELET_MODULE}/@v/{KUBELET_VERSION}.zip"
            break
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            data: bytes = response.read()
            return data
    except OSError as error:
        raise ProtoUnavailable(
            f"{KUBELET_MODULE}@{KUBELET_VERSION} is not in the Go module cache and {url} could not be "
            f"downloaded ({error}); run `go mod download {KUBELET_MODULE}@{KUBELET_VERSION}` or allow the "
            "download") from error


def proto_sources() -> dict[ProtoFile, bytes]:
    """The verified proto files: the Go module cache first, the module proxy otherwise."""
    mod_cache = go_mod_cache()
    if mod_cache is not None:
        found = sources_from_mod_cache(mod_cache)
        if found is not None:
            return found
        zipped = mod_cache / "cache" / "download" / KUBELET_MODULE / "@v" / f"{KUBELET_VERSION}.zip"
        if zipped.is_file():
            return sources_from_zip(zipped.read_bytes(), str(zipped))
    return sources_from_zip(download_module(), PROXY_URL)


# -- compiling ---------------------------------------------------------------------------------------


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def stamp() -> str:
    """What the generated code depends on: the protos and the generator and runtime versions."""
    digest = hashlib.sha256()
    for proto in PROTO_FILES:
        digest.update(f"{proto.target} {proto.sha256}\n".encode())
    for distribution in ("grpcio-tools", "grpcio", "protobuf"):
        digest.update(f"{distribution} {_version(distribution)}\n".encode())
    return digest.hexdigest()[:16]


def default_cache_dir() -> Path:
    """``<kubecell cache>/protos/<kubelet version>``: outside the repository, shared by its checkouts."""
    return cache_root() / "protos" / KUBELET_VERSION


def _complete(directory: Path, expected: str) -> bool:
    marker = directory / "stamp"
    return marker.is_file() and marker.read_text().strip() == expected


def ensure_generated(cache_dir: Path | None = None) -> tuple[Path, bool]:
    """The directory holding the generated package, and whether this call had to generate it."""
    base = cache_dir if cache_dir is not None else default_cache_dir()
    expected = stamp()
    directory = base / expected
    if _complete(directory, expected):
        return directory, False
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".generate.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be generating: wait, then look again
        if _complete(directory, expected):
            return directory, False
        partial = Path(tempfile.mkdtemp(prefix=".partial-", dir=base))
        try:
            _generate(proto_sources(), partial)
            (partial / "stamp").write_text(expected + "\n")
            if directory.exists():  # an incomplete leftover of a killed run (no stamp): replace it
                shutil.rmtree(directory)
            os.replace(partial, directory)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return directory, True


def _generate(sources: dict[ProtoFile, bytes], out: Path) -> None:
    try:
        from grpc_tools import protoc  # type: ignore[import-untyped]
    except ImportError as error:
        raise ProtoUnavailable("grpcio-tools is not installed: install kubecell with the `node` extra "
                               "(pip install 'kubecell[node]')") from error
    include = Path(protoc.__file__).parent / "_proto"  # the well-known types bundled with grpcio-tools
    for proto, data in sources.items():
        path = out / proto.target
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        parts = Path(proto.target).parent.parts  # kubecell_kubelet_api, deviceplugin, v1beta1: all packages
        for depth in range(1, len(parts) + 1):
            (out.joinpath(*parts[:depth]) / "__init__.py").touch()
    args = ["grpc_tools.protoc", f"--proto_path={out}", f"--proto_path={include}", f"--python_out={out}",
            f"--grpc_python_out={out}", *(proto.target for proto in PROTO_FILES)]
    code = protoc.main(args)
    if code != 0:
        raise ProtoUnavailable(f"grpc_tools.protoc failed with exit code {code}: {' '.join(args[1:])}")


# -- importing ---------------------------------------------------------------------------------------


@functools.cache
def _load(directory: Path) -> None:
    """Import the generated top-level package from ``directory`` (once per process)."""
    existing = sys.modules.get(PACKAGE)
    if existing is not None:
        if Path(existing.__file__ or "").parent == directory / PACKAGE:
            return
        raise ProtoUnavailable(f"{PACKAGE} is already imported from {existing.__file__}; cannot also load "
                               f"{directory} in the same process")
    init = directory / PACKAGE / "__init__.py"
    spec = importlib.util.spec_from_file_location(PACKAGE, init, submodule_search_locations=[str(init.parent)])
    if spec is None or spec.loader is None:
        raise ProtoUnavailable(f"cannot import the generated package at {init}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = module
    spec.loader.exec_module(module)


def _api(proto: ProtoFile) -> Api:
    directory, _ = ensure_generated()
    _load(directory)
    return Api(pb2=importlib.import_module(proto.module + "_pb2"),
               grpc=importlib.import_module(proto.module + "_pb2_grpc"))


@functools.cache
def deviceplugin() -> Api:
    """The device plugin API v1beta1: ``Registration`` (served by the kubelet) and ``DevicePlugin``."""
    return _api(DEVICEPLUGIN)


@functools.cache
def podresources() -> Api:
    """The PodResources API v1 (``PodResourcesLister``: List, Get, GetAllocatableResources)."""
    return _api(PODRESOURCES)


@functools.cache
def dra() -> Api:
    """The DRA kubelet plugin API v1: the ``DRAPlugin`` service (``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``)."""
    return _api(DRA)


@functools.cache
def dra_health() -> Api:
    """The DRA resource-health API v1: ``v1.DRAResourceHealth``, served by the plugin, whose stream of device
    health the kubelet shows in a container's ``allocatedResourcesStatus``."""
    return _api(DRA_HEALTH)


@functools.cache
def pluginregistration() -> Api:
    """The kubelet's plugin registration API v1: ``pluginregistration.Registration``, served by the plugin."""
    return _api(PLUGINREGISTRATION)
