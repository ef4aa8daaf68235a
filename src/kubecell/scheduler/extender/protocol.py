"""The extender wire format of ``k8s.io/kube-scheduler/extender/v1``, read and written exactly.

kube-scheduler marshals Go structs without JSON tags, so the keys are the Go field names (``Pod``,
``NodeNames``, ``FailedNodes``, ``PodUID`` ...) and Go's decoder matches keys case-insensitively; we read
them the same way (``pod``, ``POD`` and ``Pod`` are one key) and always write the exact spelling. The
objects inside (``Pod``, ``Nodes``) are Kubernetes API objects with their usual camelCase fields.

A request that does not parse gets a ``ProtocolError`` naming what is wrong; the HTTP layer answers it
with status 400 and the message in ``Error``, the field kube-scheduler reports.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubecell.core.errors import KubecellError

MAX_PRIORITY = 10
"""``MaxExtenderPriority``: an extender's scores run 0..10 (kube-scheduler scales them by the weight)."""
MAX_CANDIDATES = 50_000
"""The most candidate nodes a request may name: ten times Kubernetes' tested 5,000. Each failed one is answered
with its reason, so 2 million names made a 720 MB answer."""


class ProtocolError(KubecellError):
    """A request kube-scheduler (or anyone) sent that is not the extender protocol."""


def _fields(body: bytes | str | Mapping[str, Any], what: str) -> dict[str, Any]:
    if isinstance(body, Mapping):
        data: Any = body
    else:
        try:
            data = json.loads(body)
        except ValueError as error:  # (not JSON, not UTF-8, or a number past int()'s 4,300 digits: a 500 before)
            raise ProtocolError(f"{what}: the body is not JSON ({error})") from None
        except RecursionError:  # "[[[[..." deeper than the interpreter's stack: a 500 and a traceback before
            raise ProtocolError(f"{what}: the body is JSON nested too deeply") from None
    if not isinstance(data, Mapping):
        raise ProtocolError(f"{what}: expected a JSON object, got {type(data).__name__}")
    return {str(key).lower(): value for key, value in data.items()}


def _pod(fields: Mapping[str, Any], what: str) -> dict[str, Any]:
    pod = fields.get("pod")
    if not isinstance(pod, dict):
        raise ProtocolError(f"{what}: no Pod in the request")
    meta = pod.get("metadata")
    if not isinstance(meta, dict) or not meta.get("name") or not meta.get("uid"):
        raise ProtocolError(f"{what}: the Pod has no metadata.name and metadata.uid")
    spec = pod.setdefault("spec", {})
    if not isinstance(spec, dict):
        raise ProtocolError(f"{what}: the Pod's spec must be an object")
    if not isinstance(spec.get("schedulerName", ""), str):
        raise ProtocolError(f"{what}: the Pod's spec.schedulerName must be a string")
    if not all(_asks_well(spec.get(part)) for part in ("containers", "initContainers")):
        raise ProtocolError(f"{what}: the Pod's containers must be a list of objects whose resources.requests "
                            "and resources.limits are objects")
    return pod


def _asks_well(containers: Any) -> bool:
    """Whether ``containers`` has the shape the verbs read a pod's asks in (on the request's thread, before
    anything is looked up): before, a list where an object belongs was a 500 and a traceback per request."""
    if containers is None:
        return True
    if not isinstance(containers, list) or not all(isinstance(c, dict) for c in containers):
        return False
    for container in containers:
        resources = container.get("resources") or {}
        if not isinstance(resources, dict) or not all(isinstance(resources.get(part) or {}, dict)
                                                      for part in ("requests", "limits")):
            return False
    return True


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """``ExtenderArgs``: the pod and its candidate nodes, by name (``nodeCacheCapable``) or as objects."""

    pod: dict[str, Any]
    node_names: list[str]
    nodes: list[dict[str, Any]] | None
    """The Node objects, when kube-scheduler sent them (no node cache); None when it sent names."""

    @property
    def by_name(self) -> bool:
        return self.nodes is None


def parse_args(body: bytes | str | Mapping[str, Any], what: str = "filter") -> ExtenderArgs:
    fields = _fields(body, what)
    pod = _pod(fields, what)
    names, nodes = fields.get("nodenames"), fields.get("nodes")
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ProtocolError(f"{what}: NodeNames must be a list of strings")
        if len(names) > MAX_CANDIDATES:
            raise ProtocolError(f"{what}: {len(names)} NodeNames, more than the {MAX_CANDIDATES} nodes a cluster has")
        return ExtenderArgs(pod, names, None)
    if isinstance(nodes, dict):
        items = nodes.get("items") or []
        if not isinstance(items, list):
            raise ProtocolError(f"{what}: Nodes.items must be a list")
        if len(items) > MAX_CANDIDATES:
            raise ProtocolError(f"{what}: {len(items)} Nodes, more than the {MAX_CANDIDATES} nodes a cluster has")
        names = [_node_name(item) for item in items]
        if not all(names):  # (a list or an object as the name was a 500 before: unhashable in the answer)
            raise ProtocolError(f"{what}: a node in Nodes.items has no metadata.name that is text")
        return ExtenderArgs(pod, names, items)
    raise ProtocolError(f"{what}: neither NodeNames nor Nodes in the request")


def _node_name(item: object) -> str:
    metadata = item.get("metadata") if isinstance(item, dict) else None
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return name if isinstance(name, str) else ""


def filter_result(args: ExtenderArgs, passed: list[str], failed: Mapping[str, str],
                  unresolvable: Mapping[str, str] | None = None, error: str = "") -> dict[str, Any]:
    """``ExtenderFilterResult``, in the form the request came in (names, or the passed Node objects)."""
    result: dict[str, Any] = {"Nodes": None, "NodeNames": None, "FailedNodes": dict(failed),
                              "FailedAndUnresolvableNodes": dict(unresolvable or {}), "Error": error}
    if args.by_name:
        result["NodeNames"] = passed
    else:
        assert args.nodes is not None
        chosen = set(passed)
        result["Nodes"] = {"metadata": {}, "items": [n for n in args.nodes if n["metadata"]["name"] in chosen]}
    return result


def priorities(scores: Mapping[str, int]) -> list[dict[str, Any]]:
    """``HostPriorityList``."""
    return [{"Host": host, "Score": max(0, min(MAX_PRIORITY, int(score)))} for host, score in scores.items()]


@dataclass(frozen=True, slots=True)
class BindingArgs:
    """``ExtenderBindingArgs``."""

    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str


def parse_binding(body: bytes | str | Mapping[str, Any]) -> BindingArgs:
    fields = _fields(body, "bind")
    values = {key: fields.get(key) for key in ("podname", "podnamespace", "poduid", "node")}
    missing = [name for name, key in (("PodName", "podname"), ("PodNamespace", "podnamespace"),
                                      ("PodUID", "poduid"), ("Node", "node")) if not isinstance(values[key], str)
               or not values[key]]
    if missing:
        raise ProtocolError(f"bind: missing {', '.join(missing)}")
    return BindingArgs(str(values["podname"]), str(values["podnamespace"]), str(values["poduid"]),
                       str(values["node"]))


def binding_result(error: str = "") -> dict[str, Any]:
    """``ExtenderBindingResult``."""
    return {"Error": error}


@dataclass(frozen=True, slots=True)
class PreemptionArgs:
    """``ExtenderPreemptionArgs``: kube-scheduler's candidate victims per node (as UIDs either way)."""

    pod: dict[str, Any]
    victims: dict[str, list[str]]


def parse_preemption(body: bytes | str | Mapping[str, Any]) -> PreemptionArgs:
    fields = _fields(body, "preempt")
    pod = _pod(fields, "preempt")
    victims: dict[str, list[str]] = {}
    meta = fields.get("nodenametometavictims")
    source = meta if meta else fields.get("nodenametovictims")
    if source is not None and not isinstance(source, dict):
        raise ProtocolError("preempt: NodeNameToVictims/NodeNameToMetaVictims must be an object")
    for node, entry in (source or {}).items():
        entry_fields = {str(k).lower(): v for k, v in entry.items()} if isinstance(entry, dict) else None
        listed = entry_fields.get("pods") or [] if entry_fields is not None else None
        if not isinstance(listed, list):  # (an AttributeError or TypeError, a 500, before)
            raise ProtocolError(f"preempt: the victims of node {node} must be an object with a list of Pods")
        victims[str(node)] = [_victim_uid(p, meta=bool(meta)) for p in listed if isinstance(p, dict)]
    return PreemptionArgs(pod, victims)


def _victim_uid(pod: Mapping[str, Any], *, meta: bool) -> str:
    """A ``MetaPod``'s ``UID`` (any case), or a full Pod's ``metadata.uid``."""
    if meta:
        return str({str(k).lower(): v for k, v in pod.items()}.get("uid", ""))
    metadata = pod.get("metadata")
    return str(metadata.get("uid", "")) if isinstance(metadata, dict) else ""  # (a list: a 500 before)


def preemption_result(victims: Mapping[str, list[str]]) -> dict[str, Any]:
    """``ExtenderPreemptionResult`` (victims by UID: ``MetaVictims``)."""
    return {"NodeNameToMetaVictims": {node: {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": 0}
                                      for node, uids in victims.items()}}
