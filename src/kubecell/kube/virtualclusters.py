"""The tenant configuration as VirtualCluster objects (``virtualclusters.kubecell.io``), and kubecell's
verdict on them.

Two checks, two owners. The form (types, ranges, required fields, cell-type syntax) is the API server's:
the CRD's schema (``deploy/base/crd-virtualclusters.yaml``) refuses a malformed object before anyone
sees it. Feasibility against the real cluster (a cell type or chain the cluster does not have, a pinned
cell that does not exist or is taken, guarantees that cannot all be met at once) is kubecell's, and only
kubecell can judge it: the objects are turned into the tenants document ``resolve_tenants`` validates
(the same rules as the ConfigMap's), and the verdict goes back onto each object as its ``Accepted``
condition (``metav1.Condition``) through the status subresource, with a Warning Event when refused.

The API server's schema is not the only guard: a VirtualCluster written while the CRD was older (or without
its schema) reaches kubecell as it was stored, so ``resolve`` first checks what the tenants document cannot
(``spec_problem``: a spec that is not a mapping, nesting deeper than the schema allows, a number beyond the
schema's int64), and every object is judged, never raised out of the scheduler.

A refused set never replaces the configuration in force: the scheduler keeps the last accepted set of
VirtualClusters (or, before any was accepted, the ConfigMap or the whole-cluster default), so one bad
edit cannot take every tenant's guarantee away. It keeps that set in the API too (``accepted``), since the
object holds only its refused spec, so that a restart keeps it; a VC the operator deletes leaves it at once.
The set is all or nothing, because guarantees are only meaningful together: a VC that is fine on its own
waits (``Accepted=False``, reason ``NotApplied``) while another one is refused.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubecell.core.errors import InvalidInputError
from kubecell.core.shown import shown
from kubecell.core.tenancy.config import Tenants, resolve_tenants
from kubecell.core.topology import CellForest
from kubecell.core.validation import KeyPath, key_path
from kubecell.kube import conditions
from kubecell.kube.actions import event_body
from kubecell.kube.clock import rfc3339
from kubecell.kube.rest import ApiError, Kube

log = logging.getLogger("kubecell.virtualclusters")

GROUP = "kubecell.io"
VERSION = "v1alpha1"
KIND = "VirtualCluster"
PATH = f"/apis/{GROUP}/{VERSION}/virtualclusters"
"""The collection (cluster-scoped): list/watch here, ``{PATH}/{name}/status`` for the verdict."""
CONDITION = "Accepted"
EVENT_NAMESPACE = "default"
"""Events about cluster-scoped objects go to ``default``, as client-go's event recorder puts them."""

MAX_SPEC_DEPTH = 8
"""The deepest nesting a spec may have: the schema's is 2 (``spec.cells.<type>``, ``spec.pinnedCells[i]``); a
spec nested thousands deep would exhaust Python's stack in ``json.dumps`` and pydantic."""
MAX_SPEC_NUMBER = 2**63 - 1
"""The schema's numbers are int64 (and far smaller: gpus <= 1,000,000); a larger one is refused before any
message has to write it out (Python refuses to write an integer of more than 4,300 digits)."""

SPEC_FIELDS = ("cells", "pinnedCells", "weight", "borrowLimitGpus", "minRuntimeMinutes")
"""Spec fields that are the tenants document's own, copied as they are (``gpus``/``chain`` are mapped)."""

REASON_ACCEPTED = "Accepted"
REASON_INVALID = "InvalidGuarantee"
"""This VC alone cannot be configured on this cluster (unknown cell type or chain, unknown pinned cell)."""
REASON_INFEASIBLE = "Infeasible"
"""The VCs together cannot be configured: guarantees that do not fit at once, a cell pinned twice."""
REASON_NOT_APPLIED = "NotApplied"
"""Fine on its own, but another VirtualCluster was refused, so the configuration in force stays."""


def trimmed(obj: dict[str, Any]) -> dict[str, Any]:
    """What the scheduler keeps of a VirtualCluster: no managed fields, no kubectl last-applied copy."""
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in ("managedFields", "annotations")}
    return {**obj, "metadata": meta}


def name_of(obj: Mapping[str, Any]) -> str:
    return str(obj["metadata"]["name"])


def generation_of(obj: Mapping[str, Any]) -> int:
    """``metadata.generation`` (an int64 the API server sets); 0 for anything else a hand-built object holds."""
    value = (obj.get("metadata") or {}).get("generation")
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 2**63 - 1 else 0


def spec_problem(obj: Mapping[str, Any]) -> InvalidInputError | None:
    """What in the object's spec no tenants document could hold, located at the spec's own path; None when
    the spec is a mapping of text keys, at most ``MAX_SPEC_DEPTH`` deep, with numbers within int64. Walked
    without recursion, so no spec can exhaust the stack here."""
    where = f"{KIND} {name_of(obj)}: spec"
    spec = obj.get("spec")
    if spec is None:
        return None
    if not isinstance(spec, Mapping):
        return InvalidInputError(f"is {shown(spec)}, not a mapping", location=where,
                                 accepted="a mapping of cells, gpus, chain, pinnedCells, weight, borrowLimitGpus, "
                                 "minRuntimeMinutes")
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), spec)]
    while stack:
        path, value = stack.pop()
        at = where + (f".{key_path(path)}" if path else "")
        if len(path) > MAX_SPEC_DEPTH:
            return InvalidInputError(f"nests deeper than {MAX_SPEC_DEPTH} levels", location=at,
                                     accepted="the VirtualCluster schema's fields")
        if isinstance(value, Mapping):
            for key, item in value.items():
                if not isinstance(key, str):
                    return InvalidInputError(f"has the key {shown(key)}, which is not text", location=at,
                                             accepted="text keys")
                stack.append(((*path, key), item))
        elif isinstance(value, list | tuple):
            stack.extend(((*path, index), item) for index, item in enumerate(value))
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_SPEC_NUMBER:
            return InvalidInputError(f"{shown(value)} is beyond int64", location=at,
                                     accepted="the numbers of the VirtualCluster schema (int64, gpus at most 1000000)")
        elif isinstance(value, float) and not (math.isfinite(value) and abs(value) <= MAX_SPEC_NUMBER):
            return InvalidInputError(f"{shown(value)} is not a finite number within int64", location=at,
                                     accepted="the numbers of the VirtualCluster schema")
    return None


def canonical_spec(obj: Mapping[str, Any]) -> str:
    """The spec as one string, so a change of the spec (never of the status) is a change of tenants. A spec
    ``spec_problem`` refuses (which ``json.dumps`` might not even write) stands as its problem: such a spec
    is never accepted, and a change of it that changes the problem is still a change."""
    problem = spec_problem(obj)
    if problem is not None:
        return f"!{problem}"
    return json.dumps(obj.get("spec") or {}, sort_keys=True, separators=(",", ":"))


def signature(objects: Iterable[Mapping[str, Any]]) -> tuple[tuple[str, str], ...]:
    """What the tenants depend on: every object's name and spec (status writes leave it unchanged)."""
    return tuple(sorted((name_of(obj), canonical_spec(obj)) for obj in objects))


def tenant_entry(spec: Mapping[str, Any]) -> dict[str, Any]:
    """One VirtualCluster's spec as a ``virtualClusters`` entry of the tenants document.

    The fields are the document's, except that ``gpus: {count, chain}`` is written ``gpus`` + ``chain``
    (an API field has one type)."""
    entry = {key: spec[key] for key in SPEC_FIELDS if key in spec}
    if "gpus" in spec:
        entry["gpus"] = {"count": spec["gpus"], "chain": spec["chain"]} if spec.get("chain") else spec["gpus"]
    elif "chain" in spec:
        entry["gpus"] = {"chain": spec["chain"]}  # refused by the core with the field named, as the CRD would
    return entry


def tenant_document(objects: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The tenants document (``docs/tenancy.md``) the objects stand for; VCs in name order."""
    by_name = {name_of(obj): obj for obj in objects}
    return {"virtualClusters": {name: tenant_entry(by_name[name].get("spec") or {}) for name in sorted(by_name)}}


def locate(parts: KeyPath) -> str:
    """A key path of the tenants document, in the objects' terms: ``VirtualCluster vision: spec.cells.X``."""
    if len(parts) < 2:
        return "VirtualClusters"
    rest = list(parts[2:])
    if rest[:2] == ["gpus", "chain"]:
        rest = ["chain"]
    elif rest[:1] == ["gpus"]:
        rest = ["gpus"]
    return f"{KIND} {parts[1]}: spec" + (f".{key_path(rest)}" if rest else "")


@dataclass(frozen=True, slots=True)
class Verdict:
    """kubecell's answer to one object at one generation: the ``Accepted`` condition to write."""

    name: str
    generation: int
    accepted: bool
    reason: str
    message: str
    guaranteed_gpus: int | None = None


@dataclass(frozen=True, slots=True)
class Resolution:
    """The objects judged together: the tenants when the set is accepted (else None), each one's verdict."""

    tenants: Tenants | None
    verdicts: tuple[Verdict, ...]


def resolve(objects: Iterable[Mapping[str, Any]], forest: CellForest,
            in_force: Mapping[str, str] | None = None) -> Resolution:
    """Judge the VirtualCluster objects against the cluster's cells.

    Each object is first validated alone, so a problem of its own is reported on it and nowhere else;
    then the set together. A problem only the set has (guarantees that do not fit at once, a cell pinned
    by two) is reported on the changed objects that cause it (``in_force``: name -> canonical spec of the
    set the scheduler runs; see ``_culprits``); the others are ``NotApplied``."""
    items = sorted(objects, key=name_of)
    in_force = in_force or {}
    generation = {name_of(obj): generation_of(obj) for obj in items}
    own: dict[str, str] = {}
    gpus: dict[str, int] = {}
    for obj in items:
        problem = spec_problem(obj)
        if problem is not None:
            own[name_of(obj)] = str(problem)
            continue
        try:
            alone = resolve_tenants(tenant_document([obj]), forest, locate=locate)
            gpus[name_of(obj)] = alone.vcs[0].guaranteed_gpus
        except InvalidInputError as error:
            own[name_of(obj)] = str(error)
    if own:
        refused = ", ".join(sorted(own))
        verdicts = tuple(
            Verdict(name, generation[name], False, REASON_INVALID, own[name]) if name in own
            else _kept_or_waiting(name, generation[name], canonical_spec(obj), in_force, gpus.get(name),
                                  f"{KIND} {refused} refused")
            for obj in items for name in (name_of(obj),))
        return Resolution(None, verdicts)
    try:
        tenants = resolve_tenants(tenant_document(items), forest, locate=locate)
    except InvalidInputError as error:
        blamed = _culprits(items, forest, in_force)
        verdicts = tuple(
            Verdict(name, generation[name], False, REASON_INFEASIBLE, str(error)) if name in blamed
            else _kept_or_waiting(name, generation[name], canonical_spec(obj), in_force, gpus.get(name),
                                  f"{KIND} {', '.join(sorted(blamed))} refused")
            for obj in items for name in (name_of(obj),))
        return Resolution(None, verdicts)
    accepted = tuple(Verdict(vc.name, generation[vc.name], True, REASON_ACCEPTED,
                             f"in force: {vc.guaranteed_gpus} GPUs guaranteed", vc.guaranteed_gpus)
                     for vc in tenants.vcs)
    return Resolution(tenants, accepted)


def _culprits(items: list[Mapping[str, Any]], forest: CellForest, in_force: Mapping[str, str]) -> set[str]:
    """Who to blame for a set that does not fit together: each changed (or new) object that does not fit
    beside the unchanged ones, since those were feasible together; when no single change is to blame
    (several changed at once, or nothing is in force yet), every changed object."""
    unchanged = [obj for obj in items if in_force.get(name_of(obj)) == canonical_spec(obj)]
    changed = [obj for obj in items if in_force.get(name_of(obj)) != canonical_spec(obj)]
    blamed = set()
    for obj in changed:
        try:
            resolve_tenants(tenant_document([*unchanged, obj]), forest, locate=locate)
        except InvalidInputError:
            blamed.add(name_of(obj))
    return blamed or {name_of(obj) for obj in changed or items}


def _kept_or_waiting(name: str, generation: int, spec: str, in_force: Mapping[str, str], gpus: int | None,
                     why: str) -> Verdict:
    """The verdict on a sound object of a refused set: still in force as written, or waiting for the rest."""
    if in_force.get(name) == spec:
        return Verdict(name, generation, True, REASON_ACCEPTED,
                       f"in force: {gpus} GPUs guaranteed ({why}; the configuration in force is kept)", gpus)
    return Verdict(name, generation, False, REASON_NOT_APPLIED,
                   f"not applied: {why}, and the set of VirtualClusters is applied as a whole; "
                   "the configuration in force is kept", gpus)


def condition(verdict: Verdict, previous: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``Accepted`` condition in ``metav1.Condition``'s shape; the transition time moves only when
    the status does."""
    return conditions.condition(CONDITION, verdict.accepted, verdict.reason, verdict.message, rfc3339(),
                                previous=previous, generation=verdict.generation)


def accepted_as_is(obj: Mapping[str, Any]) -> bool:
    """Whether kubecell said the object is in force as written (``Accepted=True`` at its current generation)."""
    found = current_condition(obj)
    generation = generation_of(obj)
    return found is not None and found.get("status") == "True" and found.get("observedGeneration") == generation


def _status(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """The object's status as kubecell wrote it; a status the schema would refuse (stored under an older CRD, or
    one without a schema) is read as none, so the verdict replaces it rather than raising out of the rebuild."""
    status = obj.get("status")
    return status if isinstance(status, Mapping) else {}


def _conditions(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The status's conditions: mappings with a ``type`` text (anything else in the list is no condition, and is
    not written back: a schema would refuse the whole patch for it)."""
    found = _status(obj).get("conditions")
    return [entry for entry in found if isinstance(entry, dict) and isinstance(entry.get("type"), str)] \
        if isinstance(found, list) else []


def current_condition(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    return next((entry for entry in _conditions(obj) if entry.get("type") == CONDITION), None)


def _same(previous: Mapping[str, Any] | None, wanted: Mapping[str, Any]) -> bool:
    return previous is not None and all(previous.get(k) == wanted[k]
                                        for k in ("status", "observedGeneration", "reason", "message"))


def status_patch(obj: Mapping[str, Any], verdict: Verdict) -> dict[str, Any] | None:
    """The merge patch that writes ``verdict`` onto the object's status (other conditions kept), or None when
    the status already says it."""
    previous = current_condition(obj)
    wanted = condition(verdict, previous)
    if _same(previous, wanted) and _status(obj).get("guaranteedGpus") == verdict.guaranteed_gpus:
        return None
    others = [c for c in _conditions(obj) if c.get("type") != CONDITION]
    return {"status": {"observedGeneration": verdict.generation, "conditions": [*others, wanted],
                       "guaranteedGpus": verdict.guaranteed_gpus}}


@dataclass
class VirtualClusterSource:
    """The scheduler's side of VirtualClusters: the specs its tenants were built from (to tell a spec change
    from a status write) and the writer of verdicts. Which set is in force is ``tenant_source``'s rule."""

    kube: Kube
    component: str
    used: tuple[tuple[str, str], ...] = ()

    def changed(self, objects: Iterable[Mapping[str, Any]]) -> bool:
        """Whether a spec changed (or an object came or went) since the tenants were last built."""
        return signature(objects) != self.used

    def report(self, objects: Iterable[Mapping[str, Any]], verdicts: Iterable[Verdict]) -> None:
        """Write each verdict that differs from the object's condition, and a Warning Event on a refusal.
        A write that fails is logged: the verdict is advice, the configuration decision stands."""
        by_name = {name_of(obj): obj for obj in objects}
        for verdict in verdicts:
            obj = by_name[verdict.name]
            patch = status_patch(obj, verdict)
            if patch is None:
                continue
            try:
                self.kube.patch(f"{PATH}/{verdict.name}/status", patch, kind="merge")
            except ApiError as error:
                log.warning("condition %s on %s %s not written: %s", CONDITION, KIND, verdict.name, error)
            if not verdict.accepted:
                self.event(obj, verdict)

    def event(self, obj: Mapping[str, Any], verdict: Verdict) -> None:
        meta = obj["metadata"]
        involved = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": meta["name"], "uid": meta.get("uid", "")}
        body = event_body(involved, EVENT_NAMESPACE, event_type="Warning", reason=verdict.reason,
                          message=verdict.message, component=self.component, action="Configure")
        try:
            self.kube.create(f"/api/v1/namespaces/{EVENT_NAMESPACE}/events", body)
        except ApiError as error:
            log.warning("event on %s %s not recorded: %s", KIND, meta["name"], error)
