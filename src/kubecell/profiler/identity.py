"""The workload family of a job or pod name: the part a person chose, without what a controller generated.

History-based estimates ("how long did this user's bert fine-tunings run?") need to group runs of one workload,
but every run gets a fresh name: ``bert-finetune-20261124-1530``, ``bert-finetune-7``, a CronJob's
``backup-28912345``, a Deployment's pod ``web-5d4f8b7c9d-x7k2p``. :func:`name_family` drops those generated
parts. The rules, applied to the name split at ``-``, ``_`` and ``.``, from the end, as long as more than one part
is left (the first part is never dropped, so a name is never emptied):

1. a part made only of digits: an index (``-0``, StatefulSet ordinals), a date or time (``-20261124``,
   ``-1530``), a Unix timestamp, a CronJob's scheduled minute;
2. a timestamp with a ``t``: ``20261124t153000`` (optionally ending in ``z``);
3. a run counter: ``run12``, ``attempt3``, ``retry2``, ``trial7``, ``try2``;
4. a UUID, in five parts (``3f2a9c1e-8b7d-4e6f-a1b2-c3d4e5f60718``) or one (32 hex digits);
5. a hexadecimal hash of 7 to 64 characters with at least one digit (a commit, a content hash);
6. Kubernetes' random suffix: 5 characters of its safe alphabet ``bcdfghjklmnpqrstvwxz2456789`` (no vowels, no
   0, 1 or 3, so a real word of five letters is almost never mistaken for one);
7. a ReplicaSet's pod-template hash: 6 to 10 characters of ``456789bcdf`` (a decimal hash spelled in that
   alphabet, the only characters it can produce);
8. a role word (``worker``, ``master``, ``chief``, ``ps``, ``evaluator``, ``launcher``, ``replica``, ``rank``,
   ``run``, ``attempt``, ``retry``, ``trial``) right before a part dropped by the rules above:
   ``train-worker-3`` is a pod of ``train``, but ``bert-worker`` stays a family of its own.

The result is lower-case (Kubernetes names are; traces are not always) with no separator at either end, and at
most :data:`MAX_FAMILY` characters. A trailing number is always taken as generated, so ``resnet-50`` and
``resnet-101`` share the family ``resnet``: a workload that wants them apart names them ``resnet50``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from kubecell.core.errors import InvalidInputError
from kubecell.kube.dialects.demand import PodDemand
from kubecell.kube.dialects.pod import pod_demand

MAX_FAMILY = 253
"""The longest Kubernetes object name: a family is a label for grouping, never longer than a name."""

_SEPARATORS = re.compile(r"([-_.])")
_DIGITS = re.compile(r"[0-9]+")
_STAMP = re.compile(r"[0-9]{8}t[0-9]{4,6}z?")
_COUNTER = re.compile(r"(?:run|attempt|retry|trial|try)[0-9]+")
_HEX_HASH = re.compile(r"(?=[0-9a-f]*[0-9])[0-9a-f]{7,64}")
_RANDOM_SUFFIX = re.compile(r"[bcdfghjklmnpqrstvwxz2456789]{5}")
_TEMPLATE_HASH = re.compile(r"[456789bcdf]{6,10}")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_ROLES = frozenset({"worker", "master", "chief", "ps", "evaluator", "launcher", "replica", "rank",
                    "run", "attempt", "retry", "trial"})


def _generated(part: str) -> bool:
    return any(pattern.fullmatch(part) for pattern in
               (_DIGITS, _STAMP, _COUNTER, _HEX_HASH, _RANDOM_SUFFIX, _TEMPLATE_HASH))


def name_family(name: str) -> str:
    """The family of ``name`` (see the module's rules): ``bert-finetune-7`` -> ``bert-finetune``."""
    # parts and separators alternate: ["bert", "-", "finetune", "-", "7"]; parts may be empty ("a--b")
    pieces = _SEPARATORS.split(name.strip().lower())
    dropped_last = False
    while len(pieces) > 1:
        last = pieces[-1]
        if last == "":
            del pieces[-2:]
            continue
        if len(pieces) >= 11 and _UUID.fullmatch("".join(pieces[-9:])):
            del pieces[-10:]
            dropped_last = True
            continue
        if _generated(last) or (dropped_last and last in _ROLES):
            del pieces[-2:]
            dropped_last = True
            continue
        break
    family = "".join(pieces)[:MAX_FAMILY]
    return family.strip("-_.")


def job_name(pod: Mapping[str, Any], demand: PodDemand | InvalidInputError | None = None) -> str:
    """The name ``pod``'s job goes by: its controller owner's, else the gang's it declares (in any dialect the
    scheduler reads; ``demand`` where the caller has read it already), else its own (else its ``generateName``:
    a pod created with one has no name yet when an admission webhook sees it). The one rule by which the profiler
    files a job and the scheduler and the webhook look its family up."""
    meta = pod.get("metadata") or {}
    for reference in meta.get("ownerReferences") or ():
        if isinstance(reference, Mapping) and reference.get("controller") is True and reference.get("name"):
            return str(reference["name"])
    if demand is None:
        try:
            demand = pod_demand(pod)
        except InvalidInputError as error:
            demand = error
    if isinstance(demand, PodDemand) and demand.group is not None:
        return demand.group.key.split("/", 1)[-1]
    return str(meta.get("name") or meta.get("generateName") or "")


def family_of(pod: Mapping[str, Any]) -> tuple[str, str]:
    """(namespace, family) of ``pod``: the family of its job's name (:func:`job_name`)."""
    meta = pod.get("metadata") or {}
    return str(meta.get("namespace", "default")), name_family(job_name(pod))
