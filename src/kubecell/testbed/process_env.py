"""What one container of the process kubelet runs: its argv, working directory and environment.

The process kubelet (:mod:`kubecell.testbed.process_kubelet`) has no images and no container runtime, so
a container is a host command. Everything else is composed the way the kubelet and kubecell's node
agent compose it, so that a program sees what it would see in a pod on a GPU node:

* **argv**: ``command`` followed by ``args``, with Kubernetes' ``$(VAR)`` references expanded against
  the container's environment (``$$`` is a literal ``$``; an undefined ``$(VAR)`` stays as written).
  A container without ``command`` cannot run here: an image's entrypoint is what would have filled it.
* **environment**, lowest precedence first (a later layer overrides an earlier one, as the container
  runtime applies the kubelet's list): a small base (``PATH`` and a few host variables, ``HOME``,
  ``HOSTNAME``), the API server's service variables (``KUBERNETES_SERVICE_HOST``/``PORT``), what the node
  agent would inject (:func:`agent_environment`), ``envFrom``, then ``env`` in order, each value expanded
  against the variables defined before it. ``valueFrom`` reads the downward API (``fieldRef``,
  ``resourceFieldRef``), ConfigMaps and Secrets.

A problem is one of two kinds, because the kubelet treats them differently: a
:class:`ContainerConfigError` may go away (a ConfigMap not created yet: the container waits with
``CreateContainerConfigError`` and is retried), a :class:`ContainerStartError` will not (no ``command``,
an executable that does not exist: the container terminates with ``StartError`` and the pod's restart
policy decides what follows).
"""

from __future__ import annotations

import base64
import math
import os
import re
import shutil
from collections.abc import Callable, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

from kubecell.core.errors import KubecellError
from kubecell.core.model import MILLI_PER_GPU
from kubecell.kube.dialects.resources import parse_quantity
from kubecell.kube.names import RESOURCE_GPU, RESOURCE_GPU_MILLI
from kubecell.kube.records import AllocationRecord, gpu_environment

HOST_ONLY = ("the process kubelet runs host commands only (no images, no container runtime): give the "
             "container a `command` naming a host executable (`args` follow it)")

PLUGIN_RESOURCES = (RESOURCE_GPU, RESOURCE_GPU_MILLI)
"""The resources kubecell's device plugin serves: a container asking for one of them is given its pod's
GPUs by the node agent's ``Allocate`` (``kubecell.node.allocator.plugin_containers`` counts the same)."""

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

HOST_VARIABLES = ("PATH", "LANG", "LC_ALL", "LD_LIBRARY_PATH", "TZ")
"""Taken from the kubelet's own environment: what a host program needs to find its executables, its
libraries (CUDA's are often on ``LD_LIBRARY_PATH``) and its locale. Nothing else is inherited (the
kubelet's environment holds credentials such as ``KUBECONFIG``); a container sets anything more itself."""

_LABEL_OR_ANNOTATION = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")


class ContainerConfigError(KubecellError):
    """The container cannot be configured yet (a ConfigMap, Secret or key that may still appear)."""


class ContainerStartError(KubecellError):
    """The container can never start as written (no ``command``, no such executable, a field this kubelet
    does not serve)."""


Fetch = Callable[[str], Mapping[str, Any] | None]
"""GET of an API path; ``None`` when the object does not exist."""


def expand(text: str, lookup: Callable[[str], str | None]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: ``$(NAME)`` becomes the variable's value when it is defined and
    stays as written when not, ``$$`` becomes ``$``, and any other ``$`` is kept."""
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char != "$" or i + 1 >= len(text):
            out.append(char)
            i += 1
            continue
        following = text[i + 1]
        if following == "$":
            out.append("$")
            i += 2
        elif following == "(":
            close = text.find(")", i + 2)
            if close < 0:
                out.append("$(")
                i += 2
                continue
            name = text[i + 2:close]
            value = lookup(name)
            out.append(value if value is not None else f"$({name})")
            i = close + 1
        else:
            out.append("$" + following)
            i += 2
    return "".join(out)


def asks_for_gpus(container: Mapping[str, Any]) -> bool:
    """Whether the node agent would serve this container's GPUs (it asks for a device-plugin resource)."""
    resources = container.get("resources") or {}
    asked = {*(resources.get("limits") or {}), *(resources.get("requests") or {})}
    return any(name in asked for name in PLUGIN_RESOURCES)


def agent_environment(container: Mapping[str, Any], record: AllocationRecord | None,
                      gpu_memory_mib: Mapping[str, int]) -> dict[str, str]:
    """What the node agent's ``Allocate`` would give this container, as variables.

    A container asking for ``kubecell.io/gpu`` or ``kubecell.io/gpu-milli`` gets the record's
    :func:`~kubecell.kube.records.gpu_environment` and, for a share with memory, the memory fraction
    (``KUBECELL_GPU_MEMORY_FRACTION``, as ``kubecell.node.isolation`` computes it from the GPU's size).
    Every other container sees no GPU: ``NVIDIA_VISIBLE_DEVICES=void`` as for a pod without GPUs, and
    ``CUDA_VISIBLE_DEVICES`` empty, because here no container runtime reads ``NVIDIA_VISIBLE_DEVICES``
    and a host process would otherwise see every GPU of the machine. The caller has checked the record
    (``kubecell.testbed.process_pod`` refuses a GPU pod without a trustworthy one, as the agent does)."""
    if not asks_for_gpus(container) or record is None:
        return {"NVIDIA_VISIBLE_DEVICES": "void", "CUDA_VISIBLE_DEVICES": ""}
    env = dict(gpu_environment(record))
    if record.gpus and record.gpu_milli < MILLI_PER_GPU and record.gpu_memory_mib:
        size = gpu_memory_mib.get(record.gpus[0].uuid, 0)
        if size > 0:
            env["KUBECELL_GPU_MEMORY_FRACTION"] = f"{min(1.0, record.gpu_memory_mib / size):.4f}"
    return env


def service_environment(api_url: str) -> dict[str, str]:
    """The variables of the ``kubernetes`` Service every pod gets, pointing at the testbed's API server
    (its address and port on loopback, not a Service IP: there is no kube-proxy)."""
    rest = api_url.split("://", 1)[-1].rstrip("/")
    host, _, port = rest.rpartition(":")
    if not host:
        host, port = rest, "443"
    return {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port, "KUBERNETES_SERVICE_PORT_HTTPS": port,
            "KUBERNETES_PORT": f"tcp://{host}:{port}"}


def base_environment(pod: Mapping[str, Any], home: Path, host_env: Mapping[str, str]) -> dict[str, str]:
    """What an image would have set: ``PATH`` and the few :data:`HOST_VARIABLES` from the host, ``HOME``
    (the pod's own directory: nothing is written into the test user's home), ``HOSTNAME`` (the pod's)."""
    env = {name: host_env[name] for name in HOST_VARIABLES if host_env.get(name)}
    env.setdefault("PATH", DEFAULT_PATH)
    env["HOME"] = str(home)
    env["HOSTNAME"] = str((pod.get("spec") or {}).get("hostname") or pod["metadata"]["name"])
    return env


def field_value(pod: Mapping[str, Any], path: str, *, pod_ip: str, host_ip: str) -> str:
    """A downward-API ``fieldRef`` as the kubelet resolves it for an environment variable."""
    meta, spec = pod["metadata"], pod.get("spec") or {}
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
        "status.hostIP": host_ip,
        "status.hostIPs": host_ip,
    }
    if path in simple:
        return str(simple[path])
    match = _LABEL_OR_ANNOTATION.match(path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    raise ContainerStartError(f"fieldRef {path!r} is not a field the downward API gives to an environment "
                              "variable (accepted: metadata.name, metadata.namespace, metadata.uid, "
                              "metadata.labels['<key>'], metadata.annotations['<key>'], spec.nodeName, "
                              "spec.serviceAccountName, status.podIP(s), status.hostIP(s))")


_RESOURCE_FIELDS = ("limits.cpu", "limits.memory", "limits.ephemeral-storage", "requests.cpu", "requests.memory",
                    "requests.ephemeral-storage")


def resource_value(pod: Mapping[str, Any], container: Mapping[str, Any], ref: Mapping[str, Any],
                   allocatable: Mapping[str, Any]) -> str:
    """A downward-API ``resourceFieldRef``: the amount divided by ``divisor`` (default 1), rounded up.

    A limit the container does not set is the node's allocatable amount, as the kubelet reports it."""
    resource = str(ref.get("resource", ""))
    if resource not in _RESOURCE_FIELDS and not resource.startswith(("limits.hugepages-", "requests.hugepages-")):
        raise ContainerStartError(f"resourceFieldRef {resource!r} is not a resource the downward API gives "
                                  f"(accepted: {', '.join(_RESOURCE_FIELDS)}, limits/requests.hugepages-<size>)")
    target = container
    named = ref.get("containerName")
    if named:
        spec = pod.get("spec") or {}
        found = [c for c in (*(spec.get("initContainers") or ()), *(spec.get("containers") or ()))
                 if c.get("name") == named]
        if not found:
            raise ContainerStartError(f"resourceFieldRef names container {named!r}, which the pod does not have")
        target = found[0]
    kind, name = resource.split(".", 1)
    amounts = (target.get("resources") or {}).get(kind) or {}
    raw = amounts.get(name)
    if raw is None and kind == "limits":
        raw = allocatable.get(name)
    try:
        amount = parse_quantity(raw) if raw is not None else Decimal(0)
        divisor = parse_quantity(ref.get("divisor", "1"))
    except ValueError as error:
        raise ContainerStartError(f"resourceFieldRef {resource}: {error}") from None
    if divisor <= 0:
        raise ContainerStartError(f"resourceFieldRef {resource}: divisor {ref.get('divisor')!r} is not positive")
    return str(math.ceil(amount / divisor))


def _object(fetch: Fetch, kind: str, namespace: str, name: str, optional: bool) -> Mapping[str, Any] | None:
    plural = {"ConfigMap": "configmaps", "Secret": "secrets"}[kind]
    found = fetch(f"/api/v1/namespaces/{namespace}/{plural}/{name}")
    if found is None and not optional:
        raise ContainerConfigError(f"{kind.lower()} {name!r} not found")
    return found


def _entries(kind: str, obj: Mapping[str, Any]) -> dict[str, str]:
    """The text entries of a ConfigMap (``data``) or a Secret (``data``, base64)."""
    data = obj.get("data") or {}
    if kind == "Secret":
        return {key: base64.b64decode(value).decode(errors="replace") for key, value in data.items()}
    return {str(key): str(value) for key, value in data.items()}


def _key_ref(fetch: Fetch, kind: str, namespace: str, ref: Mapping[str, Any]) -> str | None:
    optional = bool(ref.get("optional"))
    name, key = str(ref.get("name", "")), str(ref.get("key", ""))
    obj = _object(fetch, kind, namespace, name, optional)
    if obj is None:
        return None
    entries = _entries(kind, obj)
    if key not in entries:
        if optional:
            return None
        raise ContainerConfigError(f"couldn't find key {key} in {kind} {namespace}/{name}")
    return entries[key]


def container_environment(pod: Mapping[str, Any], container: Mapping[str, Any], *, base: Mapping[str, str],
                          service: Mapping[str, str], agent: Mapping[str, str], fetch: Fetch,
                          allocatable: Mapping[str, Any], pod_ip: str, host_ip: str) -> dict[str, str]:
    """The container's whole environment (see the module docstring for the layers and their order)."""
    namespace = pod["metadata"].get("namespace", "default")
    own: dict[str, str] = {}
    for source in container.get("envFrom") or ():
        prefix = str(source.get("prefix") or "")
        for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            ref = source.get(key)
            if ref is None:
                continue
            obj = _object(fetch, kind, namespace, str(ref.get("name", "")), bool(ref.get("optional")))
            if obj is None:
                continue
            for key_name, text in _entries(kind, obj).items():
                if _ENV_NAME.match(prefix + key_name):  # the kubelet skips keys that are no variable name
                    own[prefix + key_name] = text

    def lookup(name: str) -> str | None:
        return own[name] if name in own else service.get(name)

    for var in container.get("env") or ():
        name = str(var.get("name", ""))
        source = var.get("valueFrom")
        if source is None:
            own[name] = expand(str(var.get("value", "")), lookup)
            continue
        value: str | None
        if "fieldRef" in source:
            value = field_value(pod, str(source["fieldRef"].get("fieldPath", "")), pod_ip=pod_ip, host_ip=host_ip)
        elif "resourceFieldRef" in source:
            value = resource_value(pod, container, source["resourceFieldRef"], allocatable)
        elif "configMapKeyRef" in source:
            value = _key_ref(fetch, "ConfigMap", namespace, source["configMapKeyRef"])
        elif "secretKeyRef" in source:
            value = _key_ref(fetch, "Secret", namespace, source["secretKeyRef"])
        else:
            raise ContainerStartError(f"env {name}: valueFrom {sorted(source)} is not served by the process kubelet "
                                      "(accepted: fieldRef, resourceFieldRef, configMapKeyRef, secretKeyRef)")
        if value is not None:
            own[name] = value
    return {**base, **service, **agent, **own}


def command_line(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """``command`` + ``args`` with ``$(VAR)`` expanded; :class:`ContainerStartError` without a command."""
    command = container.get("command") or []
    if not command:
        what = "has `args` but no `command`" if container.get("args") else "has no `command`"
        raise ContainerStartError(f"container {container.get('name')!r} {what}: {HOST_ONLY}")
    return [expand(str(part), env.get) for part in (*command, *(container.get("args") or ()))]


def resolve_executable(argv0: str, env: Mapping[str, str], workdir: Path) -> str:
    """The file ``argv0`` runs, looked up as ``exec`` does: a name with a slash relative to the working
    directory, any other name in the container's ``PATH``."""
    if "/" in argv0:
        path = Path(argv0) if os.path.isabs(argv0) else workdir / argv0
        if not path.is_file() or not os.access(path, os.X_OK):
            raise ContainerStartError(f'exec: "{argv0}": no such executable file ({HOST_ONLY})')
        return str(path)
    found = shutil.which(argv0, path=env.get("PATH", DEFAULT_PATH))
    if found is None:
        raise ContainerStartError(f'exec: "{argv0}": executable file not found in $PATH ({HOST_ONLY})')
    return found


def working_directory(container: Mapping[str, Any], fresh: Path) -> Path:
    """``workingDir`` when given (it must exist: nothing of the host is created on a pod's behalf), else
    ``fresh``, the container's own new directory under the testbed's."""
    given = container.get("workingDir")
    if not given:
        fresh.mkdir(parents=True, exist_ok=True)
        return fresh
    path = Path(str(given))
    if not path.is_dir():
        raise ContainerStartError(f"workingDir {given!r} is not a directory on this host")
    return path
