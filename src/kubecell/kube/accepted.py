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

The same ConfigMap keeps the set of VirtualClusters in force, each as accepted (key ``virtualclusters.json``:
name, uid, generation, spec), written by the leader whenever that set changes. The API keeps only a VC's newest
spec: when an edit is refused, the spec in force exists nowhere else, and a restarted scheduler (or a new leader)
would drop that VC's guarantee. Not on the objects' status: whoever may write ``virtualclusters/status`` could
write a spec there; this ConfigMap is written only by the scheduler's ServiceAccount (``deploy/base/rbac.yaml``).
What is read back is still checked like any input (``decode_virtualclusters``), and the set recalled is judged
against the cluster again like any other (``tenant_source``).

And the tenants ConfigMap's text last accepted (key ``tenants.json``: the text and the ConfigMap and key it came
from), written by the leader whenever it changes and taken out when none is in force: a running scheduler keeps
it when an edit of the ConfigMap is refused, and so does a restarted one. The three keys together stay under
``MAX_BYTES``; each is read on its own, and one kubecell did not write is logged and ignored.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubecell.core.errors import InvalidInputError
from kubecell.core.model import Gpu, Node
from kubecell.kube import virtualclusters as vcs
from kubecell.kube.rest import ApiError, Kube

log = logging.getLogger("kubecell.scheduler")

CONFIGMAP = "kubecell-accepted-cluster"
KEY = "nodes.json"
SCHEMA = "kubecell.io/accepted-cluster/v1"
GHOST_SUFFIX = "~as-accepted"
"""A ghost of a node that still exists with another shape is named ``<node>~as-accepted`` (``~`` is never in a
Kubernetes name, so it can clash with no real node)."""
MAX_BYTES = 900_000
"""A ConfigMap holds at most 1 MiB: both snapshots together stay under this, or the one being written is not
(logged)."""
VC_KEY = "virtualclusters.json"
VC_SCHEMA = "kubecell.io/accepted-virtualclusters/v1"
TENANTS_KEY = "tenants.json"
TENANTS_SCHEMA = "kubecell.io/accepted-tenants/v1"
MAX_SOURCE_CHARS = 1024
"""Where a tenants text came from, ``configmap <namespace>/<name> key <key>``: names of at most 63, 253, 253."""
NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
"""An object name (DNS-1123 subdomain): the names a snapshot may hold."""
UID = re.compile(r"[A-Za-z0-9-]{0,128}")


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
    except (ValueError, KeyError, TypeError, IndexError, RecursionError) as error:  # Recursion: "[[[[..."
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


@dataclass(frozen=True, slots=True)
class AcceptedVc:
    """One VirtualCluster of the set in force, as kubecell accepted it. The uid binds it to that object: a VC
    deleted since (or deleted and created again under its name) is the operator's decision, and its entry no
    longer applies."""

    name: str
    uid: str
    generation: int
    spec: Mapping[str, Any]

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> AcceptedVc:
        spec = obj.get("spec")
        return cls(vcs.name_of(obj), uid_of(obj), vcs.generation_of(obj), spec if isinstance(spec, Mapping) else {})

    def as_object(self) -> dict[str, Any]:
        """The object as it was accepted, for the functions of ``virtualclusters``."""
        return {"metadata": {"name": self.name, "uid": self.uid, "generation": self.generation},
                "spec": self.spec}

    def applies_to(self, obj: Mapping[str, Any]) -> bool:
        """Whether ``obj`` is the object this entry was accepted from (same name, same uid)."""
        return vcs.name_of(obj) == self.name and uid_of(obj) == self.uid


def uid_of(obj: Mapping[str, Any]) -> str:
    uid = (obj.get("metadata") or {}).get("uid")
    return uid if isinstance(uid, str) else ""


def encode_virtualclusters(entries: Iterable[AcceptedVc]) -> str:
    """The snapshot text of the VirtualCluster set in force, in name order (ASCII: its length is its bytes)."""
    rows = [{"name": e.name, "uid": e.uid, "generation": e.generation, "spec": e.spec}
            for e in sorted(entries, key=lambda e: e.name)]
    return json.dumps({"schema": VC_SCHEMA, "virtualClusters": rows}, sort_keys=True, separators=(",", ":"))


def decode_virtualclusters(text: str) -> list[AcceptedVc]:
    """The VirtualClusters of a snapshot; ``InvalidInputError`` for anything that is not one this kubecell wrote:
    another schema, a field more or less, a name or uid no object has, a spec no VirtualCluster could hold
    (``spec_problem``: deeper than its schema, numbers beyond int64), a name twice, more than ``MAX_BYTES``."""
    where = f"ConfigMap {CONFIGMAP}: {VC_KEY}"
    accepted = f"a snapshot of schema {VC_SCHEMA}, written by kubecell"

    def refused(why: str) -> InvalidInputError:
        return InvalidInputError(why, location=where, accepted=accepted)

    if len(text) > MAX_BYTES:
        raise refused(f"{len(text)} characters is more than kubecell writes ({MAX_BYTES})")
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as error:  # RecursionError: "[[[[..." deeper than the interpreter's stack
        raise refused(f"is not JSON ({type(error).__name__}: {str(error)[:200]})") from None
    schema = raw.get("schema") if isinstance(raw, dict) else None
    if schema != VC_SCHEMA:
        shown = repr(schema[:80]) if isinstance(schema, str) else "none" if schema is None else type(schema).__name__
        raise refused(f"is not of schema {VC_SCHEMA} (schema: {shown})")
    if set(raw) != {"schema", "virtualClusters"}:
        raise refused("has fields beside schema and virtualClusters")
    rows = raw["virtualClusters"]
    if not isinstance(rows, list):
        raise refused("virtualClusters is not a list")
    entries: dict[str, AcceptedVc] = {}
    for position, row in enumerate(rows):
        if not isinstance(row, dict) or set(row) != {"name", "uid", "generation", "spec"}:
            raise refused(f"virtualClusters[{position}] is not a mapping of name, uid, generation and spec")
        name, uid, generation, spec = row["name"], row["uid"], row["generation"], row["spec"]
        if not (isinstance(name, str) and NAME.fullmatch(name) and isinstance(uid, str) and UID.fullmatch(uid)):
            raise refused(f"virtualClusters[{position}] has a name or uid no object has")
        if not isinstance(generation, int) or isinstance(generation, bool) or not 0 <= generation < 2**63:
            raise refused(f"virtualClusters[{position}] ({name}) has a generation that is not an int64")
        if not isinstance(spec, dict):
            raise refused(f"virtualClusters[{position}] ({name}) has a spec that is not a mapping")
        entry = AcceptedVc(name, uid, generation, spec)
        problem = vcs.spec_problem(entry.as_object())
        if problem is not None:
            raise refused(f"virtualClusters[{position}]: {str(problem)[:300]}")  # its keys may be long
        if name in entries:
            raise refused(f"virtualClusters[{position}]: {name} is listed twice")
        entries[name] = entry
    return list(entries.values())


def encode_tenants(source: str, text: str) -> str:
    """The snapshot text of the tenants ConfigMap text in force, taken from ``source`` (ASCII: its length is its
    bytes)."""
    return json.dumps({"schema": TENANTS_SCHEMA, "source": source, "text": text}, sort_keys=True,
                      separators=(",", ":"))


def decode_tenants(snapshot: str) -> tuple[str, str]:
    """``(source, text)`` of a snapshot; ``InvalidInputError`` for anything that is not one this kubecell wrote:
    not JSON, another schema, a field more or less, a source or text that is not a (bounded, non-empty) string,
    more than ``MAX_BYTES``. The text itself is judged later, as the ConfigMap's own text is."""
    where = f"ConfigMap {CONFIGMAP}: {TENANTS_KEY}"

    def refused(why: str) -> InvalidInputError:
        return InvalidInputError(why, location=where, accepted=f"a snapshot of schema {TENANTS_SCHEMA}, written by "
                                 "kubecell")

    if len(snapshot) > MAX_BYTES:
        raise refused(f"{len(snapshot)} characters is more than kubecell writes ({MAX_BYTES})")
    try:
        raw = json.loads(snapshot)
    except (ValueError, RecursionError) as error:
        raise refused(f"is not JSON ({type(error).__name__}: {str(error)[:200]})") from None
    schema = raw.get("schema") if isinstance(raw, dict) else None
    if schema != TENANTS_SCHEMA:
        shown = repr(schema[:80]) if isinstance(schema, str) else "none" if schema is None else type(schema).__name__
        raise refused(f"is not of schema {TENANTS_SCHEMA} (schema: {shown})")
    if set(raw) != {"schema", "source", "text"}:
        raise refused("has fields beside schema, source and text")
    source, text = raw["source"], raw["text"]
    if not isinstance(source, str) or not 0 < len(source) <= MAX_SOURCE_CHARS:
        raise refused(f"source is not the name of a ConfigMap's key (a string of 1..{MAX_SOURCE_CHARS} characters)")
    if not isinstance(text, str) or not text:
        raise refused("text is not a non-empty string")
    return source, text


@dataclass
class AcceptedCluster:
    """Both snapshots, in the API and in memory (read once, then kept: the leader is their only writer)."""

    kube: Kube
    namespace: str
    nodes: list[Node] | None = None
    text: str | None = None
    loaded: bool = False
    virtualclusters: list[AcceptedVc] | None = None
    """The VirtualCluster set in force as recorded; None: none recorded, or the snapshot was refused."""
    vc_text: str | None = None
    """The text under ``VC_KEY`` as read (even refused) or last written; None: no such key."""
    vc_oversized: str | None = None
    """The last set too large to record (told once, not at every rebuild)."""
    tenants: tuple[str, str] | None = None
    """``(source, text)``: the tenants ConfigMap text in force as recorded; None: none, or the snapshot was refused."""
    tenants_text: str | None = None
    """The text under ``TENANTS_KEY`` as read (even refused) or last written; None: no such key."""
    tenants_oversized: str | None = None

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/configmaps/{CONFIGMAP}"

    def _read(self) -> None:
        """Read the ConfigMap once; each snapshot is refused (logged, taken as none) on its own. Raises
        ``ApiError`` only when the API server does not answer, so that the caller tries again later."""
        if self.loaded:
            return
        try:
            found = self.kube.get(self.path)
        except ApiError as error:
            if error.unavailable:
                raise
            if not error.not_found:
                log.warning("the accepted cluster cannot be read (%s): lost nodes cannot become ghosts, and a "
                            "VirtualCluster whose edit is refused keeps no older spec", error)
            found = {}
        self.loaded = True
        data = found.get("data")
        data = data if isinstance(data, dict) else {}
        text = data.get(KEY) or ""
        self.nodes, self.text = [], None
        if text:
            try:
                self.nodes, self.text = decode(str(text)), str(text)
            except InvalidInputError as error:
                log.warning("%s; lost nodes cannot become ghosts until the tenants are accepted again", error)
        vc_text = data.get(VC_KEY)
        self.vc_text = str(vc_text) if vc_text is not None else None
        self.virtualclusters = None
        if self.vc_text is not None:
            try:
                self.virtualclusters = decode_virtualclusters(self.vc_text)
            except InvalidInputError as error:
                log.error("%s. Not a snapshot kubecell wrote: it is ignored, the VirtualClusters in force are "
                          "recalled from their Accepted conditions, and this scheduler writes the snapshot anew",
                          error)
        tenants_text = data.get(TENANTS_KEY)
        self.tenants_text = str(tenants_text) if tenants_text is not None else None
        self.tenants = None
        if self.tenants_text is not None:
            try:
                self.tenants = decode_tenants(self.tenants_text)
            except InvalidInputError as error:
                log.error("%s. Not a snapshot kubecell wrote: it is ignored (an invalid edit of the tenants ConfigMap "
                          "falls back to the whole-cluster default, as with none), and this scheduler writes the "
                          "snapshot anew", error)

    def load(self) -> list[Node]:
        """The accepted GPU nodes (empty when none were recorded or the snapshot cannot be read)."""
        self._read()
        return list(self.nodes or [])

    def load_virtualclusters(self) -> list[AcceptedVc] | None:
        """The VirtualCluster set in force as the leader recorded it; None when none was recorded or the snapshot
        is refused (the caller then recalls it from the objects' conditions, as before there was a snapshot)."""
        self._read()
        return None if self.virtualclusters is None else list(self.virtualclusters)

    def load_tenants(self, source: str) -> str | None:
        """The tenants ConfigMap text in force as the leader recorded it, if it came from ``source`` (the ConfigMap
        and key this scheduler reads); None when none was recorded, the snapshot is refused, or it is of another
        ConfigMap (the scheduler's flags changed since: that text was never this ConfigMap's)."""
        self._read()
        if self.tenants is None:
            return None
        if self.tenants[0] != source:
            log.warning("the tenants text recorded in ConfigMap %s was taken from %s, not %s: not recalled",
                        CONFIGMAP, self.tenants[0][:MAX_SOURCE_CHARS], source)
            return None
        return self.tenants[1]

    def _beside(self, key: str) -> int:
        """The bytes the other keys take in the ConfigMap (all ASCII)."""
        return sum(len(text or "") for other, text in ((KEY, self.text), (VC_KEY, self.vc_text),
                                                       (TENANTS_KEY, self.tenants_text)) if other != key)

    def _write(self, key: str, text: str | None) -> ApiError | None:
        """Set ``key`` to ``text`` (None: take it out), making the ConfigMap the first time; the API's refusal."""
        try:
            try:
                self.kube.patch(self.path, {"data": {key: text}}, kind="merge")
            except ApiError as error:
                if not error.not_found:
                    raise
                if text is None:
                    return None
                body: Mapping[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap",
                                           "metadata": {"name": CONFIGMAP, "namespace": self.namespace,
                                                        "labels": {"app.kubernetes.io/part-of": "kubecell"}},
                                           "data": {key: text}}
                self.kube.create(f"/api/v1/namespaces/{self.namespace}/configmaps", dict(body))
        except ApiError as error:
            return error
        return None

    def record(self, nodes: Sequence[Node]) -> None:
        """Remember ``nodes`` as the cluster the tenants in force fit (a write only when the GPU nodes changed).
        A failed write is logged: scheduling goes on, with the previous snapshot in the API."""
        text = encode(nodes)
        try:
            self._read()
        except ApiError as error:
            log.warning("the accepted cluster cannot be read (%s); not recorded now", error)
            return
        if text == self.text:
            return
        if len(text) + self._beside(KEY) > MAX_BYTES:
            log.warning("the accepted cluster (%d bytes) does not fit a ConfigMap; not recorded", len(text))
            return
        refused = self._write(KEY, text)
        if refused is not None:
            log.warning("the accepted cluster was not recorded (%s); nodes lost later become ghosts only until "
                        "this scheduler restarts", refused)
            self.nodes = [n for n in nodes if n.gpus]  # kept in memory; the write is tried again at the next change
            return
        self.nodes, self.text = [n for n in nodes if n.gpus], text

    def record_virtualclusters(self, entries: Iterable[AcceptedVc]) -> None:
        """Remember the VirtualCluster set in force, each as accepted; a write only when it changed. No set in
        force (the ConfigMap or the default is) takes the key out, as does a set too large to keep: a restart then
        recalls the set from the objects' conditions, never an older set. A failed write is logged and tried
        again at the next rebuild."""
        entries = list(entries)
        try:
            text = encode_virtualclusters(entries) if entries else None
            self._read()
        except ApiError as error:
            log.warning("the accepted cluster cannot be read (%s); the VirtualClusters in force not recorded now",
                        error)
            return
        except (ValueError, TypeError, RecursionError) as error:  # a spec json cannot write: never one accepted
            log.error("the VirtualClusters in force cannot be written out (%s); not recorded", error)
            return
        if text == self.vc_text:
            return
        if text is not None and len(text) + self._beside(VC_KEY) > MAX_BYTES:
            if text != self.vc_oversized:
                self.vc_oversized = text
                log.error("the VirtualClusters in force (%d bytes, beside %d of the other keys) do not fit the "
                          "ConfigMap %s; the snapshot is taken out: after a restart, a VirtualCluster whose edit is "
                          "refused loses its older spec", len(text), self._beside(VC_KEY), CONFIGMAP)
            text, entries = None, []
            if self.vc_text is None:
                return
        refused = self._write(VC_KEY, text)
        if refused is not None:
            log.warning("the VirtualClusters in force were not recorded (%s); a VirtualCluster whose edit is "
                        "refused keeps its older spec only until this scheduler restarts", refused)
            return
        self.vc_text, self.virtualclusters = text, (entries or None)
        if text is not None:
            self.vc_oversized = None

    def record_tenants(self, source: str, text: str | None) -> None:
        """Remember the tenants ConfigMap text in force (None: none is, and the key is taken out), taken from
        ``source``; a write only when it changed. A text too large to keep beside the other keys takes the key out
        too (told once): a restart then knows no earlier text, never an older one. A failed write is logged and
        tried again at the next rebuild."""
        try:
            self._read()
        except ApiError as error:
            log.warning("the accepted cluster cannot be read (%s); the tenants text in force not recorded now", error)
            return
        snapshot = encode_tenants(source, text) if text else None
        if snapshot == self.tenants_text:
            return
        if snapshot is not None and len(snapshot) + self._beside(TENANTS_KEY) > MAX_BYTES:
            if snapshot != self.tenants_oversized:
                self.tenants_oversized = snapshot
                log.error("the tenants text in force (%d bytes, beside %d of the other keys) does not fit the "
                          "ConfigMap %s; the snapshot is taken out: after a restart, an invalid edit of the tenants "
                          "ConfigMap falls back to the whole-cluster default", len(snapshot),
                          self._beside(TENANTS_KEY), CONFIGMAP)
            snapshot = None
            if self.tenants_text is None:
                return
        refused = self._write(TENANTS_KEY, snapshot)
        if refused is not None:
            log.warning("the tenants text in force was not recorded (%s); an invalid edit of the tenants ConfigMap "
                        "keeps it only until this scheduler restarts", refused)
            return
        self.tenants_text = snapshot
        self.tenants = (source, text) if snapshot is not None and text else None
        if snapshot is not None:
            self.tenants_oversized = None
