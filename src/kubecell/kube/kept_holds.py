"""Where the ElasticJob sizer's holds outlive the scheduler: the ConfigMap ``kubecell-elastic-holds`` in the
scheduler's own namespace, one key per held job.

A hold is what the sizer gave a job (a raise, a start elsewhere, a move) that the job does not run yet
(``scheduler.elastic_holds``). A move's replacements are made only once its old workers end, their grace period
later, so a scheduler that restarts in that window (or a standby that takes over the lease) would see the GPUs
the move was given idle and offer them to another job. It reads back what this ConfigMap keeps before it sizes
anything.

Why not the ElasticJob's status: a hold keeps GPUs from every other job's growth, in every VC, and whoever may
patch ``elasticjobs/status`` would write one for any model, any size, for as long as it liked. The scheduler's
namespace is written by the scheduler alone (``deploy/base/rbac.yaml`` grants it this one ConfigMap). The values
are still read with checks, as every object in the API: one that fails a check is dropped and taken out.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubecell.kube.elasticjobs import (
    MAX_NPROC_PER_NODE,
    MAX_REPLICAS,
    ElasticRef,
    is_gpu_model_name,
    is_object_uid,
)
from kubecell.kube.rest import ApiError, Kube

log = logging.getLogger("kubecell.scheduler.elastic")

CONFIGMAP = "kubecell-elastic-holds"
KINDS = ("raise", "start", "move")
"""What may have given a job the members held for it."""
MAX_VALUE_CHARS = 512
"""The longest value read (one written is under 250 characters)."""

_KEY = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\.[a-z]([-a-z0-9]*[a-z0-9])?")


@dataclass(frozen=True, slots=True)
class KeptHold:
    """One held job as kept: ``replicas`` members of ``member_gpus`` GPUs on ``gpu_model`` until ``until``
    (seconds since the epoch) at the latest."""

    ref: ElasticRef
    kind: str
    gpu_model: str
    replicas: int
    member_gpus: int
    until: float


def entry_key(ref: ElasticRef) -> str:
    """``<namespace>.<name>``: a ConfigMap key (both are DNS labels, so no two jobs share one)."""
    return f"{ref.namespace}.{ref.name}"


def encode(kept: KeptHold) -> str:
    moment = datetime.fromtimestamp(math.ceil(kept.until), tz=UTC)  # whole seconds, never earlier
    return json.dumps({"uid": kept.ref.uid, "kind": kept.kind, "gpuModel": kept.gpu_model,
                       "replicas": kept.replicas, "memberGpus": kept.member_gpus,
                       "until": moment.isoformat().replace("+00:00", "Z")}, sort_keys=True)


def decode(key: str, text: Any) -> KeptHold | None:
    """The hold kept under ``key``, or None where anything fails a check (the caller takes the key out)."""
    if not isinstance(text, str) or len(text) > MAX_VALUE_CHARS or len(key) > 253 or not _KEY.fullmatch(key):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, Mapping):
        return None
    uid, kind, model, until = (value.get(field) for field in ("uid", "kind", "gpuModel", "until"))
    replicas, gpus = _count(value.get("replicas"), MAX_REPLICAS), _count(value.get("memberGpus"), MAX_NPROC_PER_NODE)
    if not is_object_uid(uid) or kind not in KINDS or replicas is None or gpus is None \
            or not is_gpu_model_name(model):
        return None
    if not isinstance(until, str):
        return None
    try:
        moment = datetime.fromisoformat(until)
    except ValueError:
        return None
    if moment.tzinfo is None:
        return None  # a time without its zone could be read hours off
    namespace, name = key.split(".", 1)
    return KeptHold(ElasticRef(namespace, name, uid), str(kind), model, replicas, gpus, moment.timestamp())


def _count(value: Any, most: int) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        return None
    return value


class HoldStore:
    """The ConfigMap's reads and writes. A write that fails is logged and costs only that: the sizer holds in
    memory all the same, and a restarted one would hold less (as before holds were kept)."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/configmaps/{CONFIGMAP}"

    def read(self) -> dict[str, Any]:
        """The kept values by key (empty where the ConfigMap does not exist); raises ``ApiError``."""
        try:
            found = self.kube.get(self.path)
        except ApiError as error:
            if error.not_found:
                return {}
            raise
        data = found.get("data")
        return dict(data) if isinstance(data, Mapping) else {}

    def write(self, changes: Mapping[str, str | None]) -> None:
        """Set (a value) or take out (None) keys: a merge patch, so each key is written alone; the ConfigMap is
        made at the first hold."""
        try:
            try:
                self.kube.patch(self.path, {"data": dict(changes)})
            except ApiError as error:
                kept = {key: value for key, value in changes.items() if value is not None}
                if not error.not_found:
                    raise
                if not kept:
                    return  # only ends, and no ConfigMap: nothing is kept to take out
                body = {"apiVersion": "v1", "kind": "ConfigMap", "data": kept,
                        "metadata": {"name": CONFIGMAP, "namespace": self.namespace,
                                     "labels": {"app.kubernetes.io/part-of": "kubecell"}}}
                try:
                    self.kube.create(f"/api/v1/namespaces/{self.namespace}/configmaps", body)
                except ApiError as made:
                    if not made.conflict:  # (made meanwhile: the patch now finds it)
                        raise
                    self.kube.patch(self.path, {"data": dict(changes)})
        except ApiError as error:
            log.warning("cannot keep the sizer's holds in ConfigMap %s/%s (a restarted scheduler would not hold "
                        "them): %s", self.namespace, CONFIGMAP, error)

    def keep(self, ref: ElasticRef, kept: KeptHold | None) -> None:
        """Keep ``ref``'s hold (None: it ended)."""
        self.write({entry_key(ref): None if kept is None else encode(kept)})

    def restore(self, now: float) -> list[KeptHold]:
        """The holds kept that have not run out; those that have, or fail a check, are taken out. Raises
        ``ApiError`` where the ConfigMap cannot be read."""
        found, stale = [], []
        for key, text in self.read().items():
            kept = decode(key, text)
            if kept is None or kept.until < now:
                stale.append(key)
            else:
                found.append(kept)
        if stale:
            self.write(dict.fromkeys(stale))
        return found
