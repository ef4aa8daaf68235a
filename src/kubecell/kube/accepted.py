"""The cluster the tenants in force were accepted on, kept in the API so that losing nodes never loses tenants.

Guarantees are only meaningful against a cluster: "two 8-GPU nodes for vision" was checked against the
nodes that existed when the VirtualClusters (or the tenant ConfigMap) were accepted. When nodes later leave
(deleted, or their inventory now reports fewer GPUs), the same guarantees may no longer fit the cluster as it
is. kubecell must then neither refuse the tenants (every tenant would lose its guarantee to the whole-cluster
default) nor promise what is gone: like HiveD, whose physical cluster is static configuration, it keeps the
lost nodes as **ghosts**, failed nodes of the shape they had, so the tenancy engine charges the cells they
held as *doomed* (``kubecell.core.tenancy.state``) until the hardware returns or the operator changes the
guarantees.

Scheduler state that must survive a restart lives in the API: the snapshot is the ConfigMap
``<tenants namespace>/kubecell-accepted-cluster`` (key ``nodes.json``), written by the leader whenever the
tenants in force fit the real cluster and the GPU nodes changed since the last write. Only GPU nodes are kept
(cells are made of GPUs), grouped by shape: 5,000 nodes of a few shapes take about 200 KB.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubecell.core.errors import InvalidInputError
from kubecell.core.model import Gpu, Node
from kubecell.kube.rest import ApiError, Kube

log = logging.getLogger("kubecell.scheduler")

CONFIGMAP = "kubecell-accepted-cluster"
KEY = "nodes.json"
SCHEMA = "kubecell.io/accepted-cluster/v1"
GHOST_SUFFIX = "~as-accepted"
"""A ghost of a node that still exists with another shape is named ``<node>~as-accepted`` (``~`` is never in a
Kubernetes name, so it can clash with no real node)."""
MAX_BYTES = 900_000
"""A ConfigMap holds at most 1 MiB: a snapshot that would not fit is not written (logged)."""


def _shape(node: Node) -> dict[str, Any]:
    return {"cpuMilli": node.cpu_milli, "memoryMiB": node.memory_mib,
            "gpus": [[gpu.model, gpu.memory_mib] for gpu in node.gpus],
            "nvlink": [list(group) for group in node.nvlink_groups],
            "numa": [list(group) for group in node.numa_groups]}


def encode(nodes: Sequence[Node]) -> str:
    """The snapshot text of the GPU nodes among ``nodes``: shapes once, then ``[name, shape, rack, zone]``."""
    shapes: dict[str, int] = {}
    table: list[dict[str, Any]] = []
    rows = []
    for node in sorted((n for n in nodes if n.gpus), key=lambda n: n.name):
        shape = _shape(node)
        key = json.dumps(shape, sort_keys=True)
        if key not in shapes:
            shapes[key] = len(table)
            table.append(shape)
        rows.append([node.name, shapes[key], node.rack, node.zone])
    return json.dumps({"schema": SCHEMA, "shapes": table, "nodes": rows}, separators=(",", ":"))


def decode(text: str) -> list[Node]:
    """The nodes of a snapshot; ``InvalidInputError`` for anything that is not one this kubecell wrote."""
    where = f"ConfigMap {CONFIGMAP}: {KEY}"
    if len(text) > MAX_BYTES * 2:
        raise InvalidInputError(f"{len(text)} characters is not a snapshot kubecell writes", location=where)
    try:
        raw = json.loads(text)
        if not isinstance(raw, dict) or raw.get("schema") != SCHEMA:
            raise ValueError(f"schema {raw.get('schema') if isinstance(raw, dict) else None!r}")
        shapes = raw["shapes"]
        nodes = []
        for name, index, rack, zone in raw["nodes"]:
            shape = shapes[index]
            gpus = tuple(Gpu(i, str(model), int(memory)) for i, (model, memory) in enumerate(shape["gpus"]))
            nodes.append(Node(str(name), int(shape["cpuMilli"]), int(shape["memoryMiB"]), gpus,
                              nvlink_groups=tuple(tuple(int(g) for g in group) for group in shape["nvlink"]),
                              numa_groups=tuple(tuple(int(g) for g in group) for group in shape["numa"]),
                              rack=str(rack), zone=str(zone)))
        return nodes
    except InvalidInputError:
        raise
    except (ValueError, KeyError, TypeError, IndexError) as error:
        raise InvalidInputError(f"cannot be read ({type(error).__name__}: {str(error)[:200]})", location=where,
                                accepted=f"a snapshot of schema {SCHEMA}, written by kubecell") from None


def _same_hardware(a: Node, b: Node) -> bool:
    return _shape(a) == _shape(b) and (a.rack, a.zone) == (b.rack, b.zone)


def ghosts(accepted: Sequence[Node], current: Sequence[Node]) -> list[Node]:
    """The accepted GPU nodes the cluster no longer has as they were: gone, or now of another shape or place
    (a ghost of the latter is renamed, since the node itself still exists under its name)."""
    now = {node.name: node for node in current}
    lost = []
    for node in accepted:
        present = now.get(node.name)
        if present is None:
            lost.append(node)
        elif not _same_hardware(node, present):
            lost.append(Node(node.name + GHOST_SUFFIX, node.cpu_milli, node.memory_mib, node.gpus,
                             nvlink_groups=node.nvlink_groups, numa_groups=node.numa_groups, rack=node.rack,
                             zone=node.zone))
    return lost


@dataclass
class AcceptedCluster:
    """The snapshot in the API and in memory (read once, then kept: the leader is its only writer)."""

    kube: Kube
    namespace: str
    nodes: list[Node] | None = None
    text: str | None = None
    loaded: bool = False

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/configmaps/{CONFIGMAP}"

    def load(self) -> list[Node]:
        """The accepted GPU nodes (empty when none were recorded or the snapshot cannot be read)."""
        if not self.loaded:
            self.loaded = True
            try:
                found = self.kube.get(self.path)
                text = ((found.get("data") or {}).get(KEY)) or ""
                self.nodes, self.text = (decode(text), text) if text else ([], None)
            except ApiError as error:
                if error.unavailable:
                    self.loaded = False
                    raise
                if not error.not_found:
                    log.warning("the accepted cluster cannot be read (%s): lost nodes cannot become ghosts", error)
                self.nodes = []
            except InvalidInputError as error:
                log.warning("%s; lost nodes cannot become ghosts until the tenants are accepted again", error)
                self.nodes = []
        return list(self.nodes or [])

    def record(self, nodes: Sequence[Node]) -> None:
        """Remember ``nodes`` as the cluster the tenants in force fit (a write only when the GPU nodes changed).
        A failed write is logged: scheduling goes on, with the previous snapshot in the API."""
        text = encode(nodes)
        try:
            self.load()
        except ApiError as error:
            log.warning("the accepted cluster cannot be read (%s); not recorded now", error)
            return
        if text == self.text:
            return
        if len(text) > MAX_BYTES:
            log.warning("the accepted cluster (%d bytes) does not fit a ConfigMap; not recorded", len(text))
            return
        body: Mapping[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap",
                                   "metadata": {"name": CONFIGMAP, "namespace": self.namespace,
                                                "labels": {"app.kubernetes.io/part-of": "kubecell"}},
                                   "data": {KEY: text}}
        try:
            try:
                self.kube.patch(self.path, {"data": {KEY: text}}, kind="merge")
            except ApiError as error:
                if not error.not_found:
                    raise
                self.kube.create(f"/api/v1/namespaces/{self.namespace}/configmaps", dict(body))
        except ApiError as error:
            log.warning("the accepted cluster was not recorded (%s); nodes lost later become ghosts only until "
                        "this scheduler restarts", error)
            self.nodes = [n for n in nodes if n.gpus]  # kept in memory; the write is tried again at the next change
            return
        self.nodes, self.text, self.loaded = [n for n in nodes if n.gpus], text, True
