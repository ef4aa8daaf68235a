"""Which pods make one job, read from Pod objects as the API server returns them.

A job is what its pods' **controller owner** stands for (a Job, a ReplicaSet, an ElasticJob, a PyTorchJob...:
the owner reference with ``controller: true``), else the **gang** the pods declare (any dialect kubecell's
scheduler reads: ``kubecell.io/group``, PodGroups, HiveD, ...), else the pod alone. The owner's uid (or the
gang's or pod's) is the job's key in the history, so the profiler can revisit a running job and replace it.

An owner-less gang has no object whose uid changes from one run to the next: a user who reuses the gang's name
next week starts another job under the same name. So its pods are cut into **runs**: a pod created after every
pod of the run before it has ended starts a new run, keyed by the gang and the run's first creation time
(``run_of`` names the gang, so that a pass can find the run again in the history when that first pod is gone:
``JobHistory.run_holding``). Without it, a gang run again would replace its earlier run in the history.

A gang's key (``gang-<digest of its namespace and name>.<run>``) is anyone's to compute, and an owner's uid is
any text a pod writes in its owner reference: so an owner uid that begins as a gang's key does
(:data:`~kubecell.profiler.history.GANG_KEY_PREFIX`), which no API server gives (its uids are UUIDs), is not
taken for the pod's key. Before, a pod of another namespace naming a gang's next run's key as its controller's
uid was saved under it first, and the gang's run was refused for good as another namespace's job. Such a pod is
keyed as if it had no owner (its gang, else itself), with the reason among its job's problems.

Everything here is read from objects users write, so nothing is trusted for more than a label: a pod whose
demand cannot be read is still profiled (the reason is kept as a problem of its job) and its request counts as
none; a name, an annotation or an image is stored as text, never interpreted. Families are per namespace
(``recommend``), so a pod named like another team's job cannot move that team's advice.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from kubecell.core.errors import InvalidInputError
from kubecell.kube import pods as pod_fields
from kubecell.kube.dialects.demand import PodDemand
from kubecell.kube.dialects.pod import pod_demand
from kubecell.kube.rest import Kube, list_all
from kubecell.profiler.history import GANG_KEY_PREFIX, GANG_KIND, Outcome
from kubecell.profiler.identity import job_name
from kubecell.profiler.store.schema import KEY_LENGTH

GANG = GANG_KIND
"""The owner kind of a job that is an owner-less gang."""

ANNOTATION_USER = "kubecell.io/user"
"""Who the job is for, where the submitter says so; else the pod's service account stands for it."""


@dataclass(frozen=True)
class FoundJob:
    """One job as its pods show it now."""

    uid: str
    namespace: str
    owner_kind: str
    owner_name: str
    user: str | None
    vc: str | None
    image: str | None
    pods: tuple[Mapping[str, Any], ...]
    gpus_per_pod: int
    milli_gpu_per_pod: int
    gpu_memory_mib_per_pod: int | None
    gpu_model_requested: str | None
    created: datetime
    started: datetime | None
    finished: datetime | None
    outcome: Outcome
    problems: tuple[str, ...]
    request_unread: bool = False
    """A pod's request could not be read: it may hold GPUs, so it is profiled even where only GPU jobs are."""
    run_of: str | None = None
    """The owner-less gang this job is one run of (its key without the run's time; see the module)."""

    @property
    def pod_names(self) -> tuple[str, ...]:
        return tuple(str(pod["metadata"]["name"]) for pod in self.pods)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(sorted({node for node in (pod_fields.node_of(pod) for pod in self.pods) if node}))


def parse_time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment.astimezone(UTC) if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def user_of(pod: Mapping[str, Any]) -> str | None:
    """Who a pod's job is for: ``kubecell.io/user`` where the submitter says so, else its service account. The
    annotation is the submitter's text: one the history could not keep as a key (longer than it keeps, or with
    control characters) counts as not given (``user_problem`` says why), so it can never stop a pass."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    stated = annotations.get(ANNOTATION_USER) if isinstance(annotations, Mapping) else None
    user = stated if stated is not None and user_problem(stated) is None else None
    user = user or (pod.get("spec") or {}).get("serviceAccountName")
    return str(user) if user else None


def user_problem(stated: object) -> str | None:
    """Why a ``kubecell.io/user`` value is refused, or None."""
    if not isinstance(stated, str) or not stated:
        return f"{ANNOTATION_USER} is not a name"
    if len(stated) > KEY_LENGTH:
        return f"{ANNOTATION_USER} is {len(stated)} characters; at most {KEY_LENGTH} are kept"
    if not stated.isprintable():
        return f"{ANNOTATION_USER} holds control characters"
    return None


def _controller(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for reference in (pod.get("metadata") or {}).get("ownerReferences") or ():
        if isinstance(reference, Mapping) and reference.get("controller") is True and reference.get("uid"):
            return reference
    return None


def created_at(pod: Mapping[str, Any]) -> datetime | None:
    """When the API server created the pod (``metadata.creationTimestamp``, by its clock), where it says."""
    return parse_time((pod.get("metadata") or {}).get("creationTimestamp"))


def started_at(pod: Mapping[str, Any]) -> tuple[datetime | None, bool]:
    """When the pod started, and whether its status said earlier: ``status.startTime`` (its kubelet's, by its
    node's clock), **never before its creation** (the API server's). The rule: a pod cannot start before it
    exists, so a start written before its creation (a node's clock behind, a status written by hand) is taken as
    its creation. Kept as written, it lengthened the job's run time, and a window from it reached back to a
    previous pod's samples under the same name (a StatefulSet's pod made again, a gang run again)."""
    written = parse_time((pod.get("status") or {}).get("startTime"))
    created = created_at(pod)
    if written is not None and created is not None and written < created:
        return created, True
    return written, False


def finished_at(pod: Mapping[str, Any]) -> datetime | None:
    """When the pod's last container stopped (None while any runs or where no container says)."""
    ends = []
    for status in (pod.get("status") or {}).get("containerStatuses") or ():
        terminated = ((status or {}).get("state") or {}).get("terminated") if isinstance(status, Mapping) else None
        moment = parse_time((terminated or {}).get("finishedAt"))
        if moment is None:
            return None
        ends.append(moment)
    return max(ends) if ends else None


def _outcome(phases: list[str]) -> Outcome:
    if all(phase == "Succeeded" for phase in phases):
        return Outcome.SUCCEEDED
    if all(phase in pod_fields.TERMINAL_PHASES for phase in phases):
        return Outcome.FAILED
    if any(phase == "Running" for phase in phases):
        return Outcome.RUNNING
    if any(phase == "Pending" for phase in phases):
        return Outcome.PENDING
    return Outcome.UNKNOWN


Demand = PodDemand | InvalidInputError
"""A pod read once by ``pod_demand``, or why it cannot be."""


def _demand(pod: Mapping[str, Any]) -> Demand:
    try:
        return pod_demand(pod)
    except InvalidInputError as error:
        return error


def _key(pod: Mapping[str, Any], demand: Demand) -> tuple[str, str, str, str | None]:
    """(uid, owner kind, owner name) of the job the pod belongs to, and why its controller's uid is not its key
    (None: it is, or it has no controller)."""
    meta = pod["metadata"]
    owner = _controller(pod)
    name = job_name(pod, demand)  # the name the scheduler looks the job's family up by, too
    unkeyed = None
    if owner is not None:
        uid = str(owner["uid"])
        if not uid.startswith(GANG_KEY_PREFIX):
            return uid[:128], str(owner.get("kind") or "Unknown"), str(owner.get("name") or ""), None
        # a gang's key, anyone's to compute, and no API server's uid: taken, it would squat that gang's history
        unkeyed = (f"pod {meta['name']}: its controller's uid {uid[:80]!r} begins as kubecell's keys of gangs "
                   "do, which no API server's uid does: not its job's key (keyed as if it had no owner)")
    group = demand.group if isinstance(demand, PodDemand) else None  # an unreadable one: told with its request
    if group is not None:
        digest = hashlib.sha256(f"{meta.get('namespace', 'default')}/{group.key}".encode()).hexdigest()[:40]
        return f"{GANG_KEY_PREFIX}{digest}", GANG, name, unkeyed
    return str(meta["uid"]), "Pod", name, unkeyed


def _request(pod: Mapping[str, Any], demand: Demand,
             problems: list[str]) -> tuple[int, int, int | None, str | None, str | None]:
    """(GPUs, milli-GPU per GPU, GPU memory MiB, GPU model asked, VC) of one pod, as kubecell reads it."""
    if isinstance(demand, InvalidInputError):
        problems.append(f"pod {pod['metadata']['name']}: its request cannot be read: {demand}")
        return 0, 0, None, None, None
    request = demand.request
    models = ",".join(sorted(request.gpu_models)) if request.gpu_models else None
    return request.gpu_count, request.gpu_milli, request.gpu_memory_mib or None, models, demand.vc


def group_pods(pods: Iterable[Mapping[str, Any]]) -> list[FoundJob]:
    """The jobs ``pods`` make (see the module), in a stable order (namespace, owner name, uid)."""
    grouped: dict[tuple[str, str], list[tuple[Mapping[str, Any], Demand]]] = {}
    keys: dict[tuple[str, str], tuple[str, str]] = {}
    problems: dict[tuple[str, str], list[str]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        if not meta.get("name") or not meta.get("uid"):
            continue
        namespace = str(meta.get("namespace", "default"))
        demand = _demand(pod)  # read once: it names the gang and the request
        uid, kind, name, unkeyed = _key(pod, demand)
        slot = (namespace, uid)
        grouped.setdefault(slot, []).append((pod, demand))
        keys.setdefault(slot, (kind, name))
        problems.setdefault(slot, []).extend([unkeyed] if unkeyed else [])
    jobs = []
    for (namespace, uid), members in grouped.items():
        kind, name = keys[(namespace, uid)]
        if kind != GANG:
            jobs.append(_job(namespace, uid, kind, name, members, problems[(namespace, uid)]))
            continue
        for first, run in _runs(members):
            stamp = first.strftime("%Y%m%dT%H%M%SZ") if first is not None else "unknown"
            jobs.append(replace(_job(namespace, f"{uid}.{stamp}", kind, name, run, list(problems[(namespace, uid)])),
                                run_of=uid))
    return sorted(jobs, key=lambda job: (job.namespace, job.owner_name, job.uid))


def _runs(members: list[tuple[Mapping[str, Any], Demand]]
          ) -> list[tuple[datetime | None, list[tuple[Mapping[str, Any], Demand]]]]:
    """An owner-less gang's pods cut into runs, each with its first creation time: a pod created after every pod
    of the current run has ended starts the next. A pod without a creation time joins the last run. Linear in
    the pods (a gang's size is the user's to choose)."""
    dated: list[tuple[datetime, str, tuple[Mapping[str, Any], Demand]]] = []
    undated = []
    for item in members:
        created = parse_time(item[0]["metadata"].get("creationTimestamp"))
        if created is None:
            undated.append(item)
        else:
            dated.append((created, str(item[0]["metadata"]["name"]), item))
    dated.sort(key=lambda entry: entry[:2])
    runs: list[tuple[datetime | None, list[tuple[Mapping[str, Any], Demand]]]] = []
    running = 0  # pods of the current run that have not ended
    last_end: datetime | None = None
    for created, _, item in dated:
        if not runs or (running == 0 and last_end is not None and created > last_end):
            runs.append((created, []))
            running, last_end = 0, None
        runs[-1][1].append(item)
        end = finished_at(item[0])
        if end is None:
            running += 1
        elif last_end is None or end > last_end:
            last_end = end
    if undated:
        if runs:
            runs[-1][1].extend(undated)
        else:
            runs.append((None, undated))
    return runs


def _job(namespace: str, uid: str, kind: str, name: str, read: list[tuple[Mapping[str, Any], Demand]],
         problems: list[str]) -> FoundJob:
    read = sorted(read, key=lambda item: str(item[0]["metadata"]["name"]))
    members = [pod for pod, _ in read]
    asks = [_request(pod, demand, problems) for pod, demand in read]
    gpus, milli, memory, model, _ = max(asks, key=lambda ask: (ask[0] * ask[1], ask[2] or 0))
    vcs = sorted({ask[4] for ask in asks if ask[4]})
    first = members[0]
    user = user_of(first)
    stated = (first["metadata"].get("annotations") or {}).get(ANNOTATION_USER)
    refused = user_problem(stated) if stated is not None else None
    if refused is not None:
        problems.append(f"pod {first['metadata']['name']}: {refused}; its service account stands for the user")
    containers = (first.get("spec") or {}).get("containers") or []
    image = containers[0].get("image") if containers and isinstance(containers[0], Mapping) else None
    created = min((created_at(pod) for pod in members),
                  key=lambda moment: moment or datetime.max.replace(tzinfo=UTC)) or datetime.now(UTC)
    begun = [started_at(pod) for pod in members]
    starts = [moment for moment, _ in begun if moment]
    early = [str(pod["metadata"]["name"]) for pod, (_, held) in zip(members, begun, strict=True) if held]
    if early:
        problems.append(f"{len(early)} pod(s) ({', '.join(early[:3])}{', ...' if len(early) > 3 else ''}) started "
                        "before their creation, as their status says (a node's clock behind the API server's?): "
                        "taken as started when created")
    phases = [pod_fields.phase(pod) for pod in members]
    outcome = _outcome(phases)
    ends = [finished_at(pod) for pod in members]
    finished = max(end for end in ends if end is not None) \
        if outcome in (Outcome.SUCCEEDED, Outcome.FAILED) and all(ends) else None
    started = min(starts) if starts else None
    if started is not None and finished is not None and finished < started:
        problems.append(f"finished ({finished.isoformat()}) before it started ({started.isoformat()}), as its "
                        "pods' status says (a node's clock stepped back?): its run time is unknown")
        started = None
    return FoundJob(uid, namespace, kind, name, user, vcs[0] if vcs else None,
                    str(image) if image else None, tuple(members), gpus, milli, memory, model, created,
                    started, finished, outcome, tuple(problems),
                    any(isinstance(demand, InvalidInputError) for _, demand in read))


def list_pods(kube: Kube, namespace: str | None = None) -> list[dict[str, Any]]:
    """Every pod (of ``namespace``, or of all), listed in pages."""
    return list_all(kube, f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods")
