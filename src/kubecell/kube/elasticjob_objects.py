"""The objects an ElasticJob stands for, built as plain dicts: its worker Pods, its rendezvous host Pod and
the Service in front of it (the spec they are built from is read by ``kubecell.kube.elasticjobs``).

**The torchrun contract and where the rendezvous lives.** Workers find each other through torchrun's
``c10d`` rendezvous: a key-value store (a ``TCPStore``) at ``--rdzv-endpoint``, which every agent joins and
keeps heart-beating. With the ``c10d`` backend that store lives *inside one agent*: the one whose host name
matches the endpoint (``is_host``). Putting the endpoint on worker 0 (Kubeflow's PyTorchJob default) ties the
rendezvous to that worker: when worker 0 dies (preempted, its node lost, scaled away) the store dies with
it and every other worker loses its rendezvous and restarts. Putting the endpoint on a Service that selects
*all* workers does not help either: each connection is load-balanced to a different worker, so an agent
that hosts a store there splits the job into several rendezvous (or, with no agent hosting, there is none).

So the store is hosted by a process of its own: the **rendezvous host**, one small CPU-only Pod
``<job>-rdzv`` that runs nothing but a ``TCPStore`` server on ``spec.rendezvousPort`` (with the workers'
image, which has PyTorch), behind a ClusterIP Service ``<job>-rdzv`` that selects that Pod alone. Every
worker joins as a client (``PET_RDZV_CONF=is_host=false``, so no worker ever starts a competing store), so
losing any worker, the first included, leaves the rendezvous to the others: their agents see their training
processes fail, meet again in a new round without it (torchrun counts that as one of each agent's restarts)
and admit its replacement in the next. The store the training processes use (``MASTER_ADDR``) is served by
each round's rank 0, advertised by its Pod IP (``PET_LOCAL_ADDR`` from the Downward API: a Pod's host name
resolves nowhere), and built anew every round (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``; torchrun's default
keeps the first round's, which dies with that worker). The rendezvous host is not a worker: it holds no
GPU, is not part of the gang, and restarts in place (``restartPolicy: Always``); if it is lost the
controller recreates it, the agents' next store operation fails, and that is handled like any failure.

Checked against real torchrun (PyTorch 2.9.1, gloo, three agents on loopback with exactly this environment
and this host program): SIGKILL of worker 0's whole process tree mid-training, the two others went on as a
world of 2 within a minute and took worker 0's replacement back as a world of 3, all exiting 0; with the
shared store (torchrun's default) the same loss left the survivors waiting on the dead store until they
failed. An agent that spends its restarts *closes* its run for good: a replacement with the same
``--rdzv-id`` fails at once with ``RendezvousClosedError``, while a new id starts cleanly. So each restart
of the job is a new **rendezvous run**: ``PET_RDZV_ID=<job uid>-<run>``, the run being the job's restart
count, on the worker's label ``kubecell.io/rendezvous-run``.

Worker environment (torchrun reads ``PET_<OPTION>`` as its ``--<option>``): ``PET_NNODES=MIN:MAX``,
``PET_NPROC_PER_NODE``, ``PET_RDZV_BACKEND=c10d``, ``PET_RDZV_ENDPOINT=<job>-rdzv:<port>``,
``PET_RDZV_ID=<job uid>-<run>``, ``PET_RDZV_CONF=is_host=false``, ``PET_MAX_RESTARTS``, ``PET_LOCAL_ADDR``
(the Pod IP), ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, and kubecell's ``KUBECELL_ELASTIC_JOB``,
``KUBECELL_WORKER_INDEX``, ``KUBECELL_POD_NAME``/``_NAMESPACE`` (where the step reporter,
``kubecell.elastic.report``, writes) and, when the spec bounds the batch size, ``KUBECELL_BATCH_SIZE_MIN``/``_MAX``.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from kubecell.kube.elasticjobs import (
    API_VERSION,
    KIND,
    LABEL_INDEX,
    LABEL_JOB,
    LABEL_ROLE,
    LABEL_RUN,
    LABEL_TEMPLATE,
    MAX_REPLICAS,
    ROLE_RENDEZVOUS,
    ROLE_WORKER,
    ElasticJobSpec,
    rendezvous_name,
    worker_name,
)
from kubecell.kube.names import (
    ANNOTATION_GROUP,
    ANNOTATION_GROUP_MAX,
    ANNOTATION_GROUP_MIN,
    ANNOTATION_GROUP_SIZE,
    ANNOTATION_OPPORTUNISTIC,
    ANNOTATION_VC,
    ENV_BATCH_SIZE_MAX,
    ENV_BATCH_SIZE_MIN,
    SCHEDULER_NAME,
)

RENDEZVOUS_CONTAINER = "c10d-store"
RENDEZVOUS_SCRIPT = """\
import os, signal, threading
from datetime import timedelta
from torch.distributed import TCPStore
port = int(os.environ["KUBECELL_RDZV_PORT"])
store = TCPStore("0.0.0.0", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=600))
print(f"c10d rendezvous store serving on port {port}", flush=True)
done = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: done.set())
done.wait()
"""
"""The rendezvous host's program: a c10d ``TCPStore`` server and nothing else, until SIGTERM."""


def owner_reference(job: ElasticJobSpec) -> dict[str, Any]:
    """The job as its objects' controlling owner: the garbage collector deletes them with it, and a foreground
    deletion of the job waits for them (``blockOwnerDeletion``)."""
    return {"apiVersion": API_VERSION, "kind": KIND, "name": job.name, "uid": job.uid, "controller": True,
            "blockOwnerDeletion": True}


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}


def rendezvous_id(job: ElasticJobSpec, run: int) -> str:
    """torchrun's ``--rdzv-id`` of the job's run ``run``: unique per job (its UID) and per restart."""
    return f"{job.uid}-{run}"


def worker_env(job: ElasticJobSpec, index: int, run: int = 0) -> list[dict[str, Any]]:
    """The torchrun contract (``PET_*`` are torchrun's options) and kubecell's own variables.

    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: by default torchrun (2.5 and later) keeps the training processes'
    store (``MASTER_ADDR``) on the first round's rank 0 agent and reuses it in every later round, so when that
    agent's worker is lost the survivors wait on a dead store; unshared, every round's rank 0 serves a new one.
    """
    env: list[dict[str, Any]] = [
        {"name": "PET_NNODES", "value": f"{job.min_replicas}:{job.max_replicas}"},
        {"name": "PET_NPROC_PER_NODE", "value": str(job.nproc_per_node)},
        {"name": "PET_RDZV_BACKEND", "value": "c10d"},
        {"name": "PET_RDZV_ENDPOINT", "value": f"{rendezvous_name(job.name)}:{job.rendezvous_port}"},
        {"name": "PET_RDZV_ID", "value": rendezvous_id(job, run)},
        {"name": "PET_RDZV_CONF", "value": "is_host=false"},
        {"name": "PET_MAX_RESTARTS", "value": str(job.max_restarts)},
        _field_env("PET_LOCAL_ADDR", "status.podIP"),
        {"name": "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "value": "1"},
        {"name": "KUBECELL_ELASTIC_JOB", "value": job.name},
        {"name": "KUBECELL_WORKER_INDEX", "value": str(index)},
        _field_env("KUBECELL_POD_NAME", "metadata.name"),
        _field_env("KUBECELL_POD_NAMESPACE", "metadata.namespace"),
    ]
    if job.batch_size is not None:
        env += [{"name": ENV_BATCH_SIZE_MIN, "value": str(job.batch_size.min)},
                {"name": ENV_BATCH_SIZE_MAX, "value": str(job.batch_size.max)}]
    return env


def template_hash(template: Mapping[str, Any]) -> str:
    """A digest of a pod template, the same for the same content whatever the order of its keys: a label
    value (16 hex digits), so a worker says which template it was made from."""
    text = json.dumps(template, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def worker_pod(job: ElasticJobSpec, index: int, run: int = 0) -> dict[str, Any]:
    """Worker ``index`` of the job in rendezvous run ``run``: the template, plus what the controller owns
    (name, labels, the gang annotations, the owner, the torchrun environment on every container, the grace
    period).

    The gang: ``kubecell.io/group=<job>``, ``group-size=<spec.replicas>``, ``group-min=<minReplicas>``,
    ``group-max=<maxReplicas>``, so kubecell's scheduler sees one elastic gang that runs with minReplicas to
    maxReplicas members and binds the pods that exist (``scheduler.elastic`` moves the target). The controller
    rewrites ``group-size`` on the live workers when the target changes, so every member states the current
    one."""
    if not 0 <= index < MAX_REPLICAS or run < 0:
        raise ValueError(f"worker index {index} outside 0..{MAX_REPLICAS - 1}, or run {run} below 0")
    template = copy.deepcopy(dict(job.template))
    meta = dict(template.get("metadata") or {})
    labels = {**(meta.get("labels") or {}), LABEL_JOB: job.name, LABEL_ROLE: ROLE_WORKER, LABEL_INDEX: str(index),
              LABEL_RUN: str(run), LABEL_TEMPLATE: template_hash(job.template)}
    annotations = {**(meta.get("annotations") or {}), **gang_annotations(job)}
    spec = dict(template["spec"])
    env = worker_env(job, index, run)
    ours = {entry["name"] for entry in env}
    containers = []
    for container in spec["containers"]:
        kept = [entry for entry in container.get("env") or [] if entry.get("name") not in ours]
        containers.append({**container, "env": [*kept, *copy.deepcopy(env)]})
    spec["containers"] = containers
    spec.setdefault("schedulerName", SCHEDULER_NAME)
    spec.setdefault("restartPolicy", "Never")
    spec["terminationGracePeriodSeconds"] = job.termination_grace_period_seconds
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": worker_name(job.name, index), "namespace": job.namespace, "labels": labels,
                         "annotations": annotations, "ownerReferences": [owner_reference(job)]},
            "spec": spec}


def gang_annotations(job: ElasticJobSpec) -> dict[str, str]:
    """kubecell's own gang dialect (``kubecell.kube.dialects.kubecell``): one gang per job."""
    return {ANNOTATION_GROUP: job.name, ANNOTATION_GROUP_SIZE: str(job.replicas),
            ANNOTATION_GROUP_MIN: str(job.min_replicas), ANNOTATION_GROUP_MAX: str(job.max_replicas)}


_HOST_POD_FIELDS = ("schedulerName", "nodeSelector", "tolerations", "imagePullSecrets", "priorityClassName",
                    "serviceAccountName", "securityContext", "runtimeClassName")
"""What the rendezvous host takes from the workers' template: where it may run and pull the image from."""


def rendezvous_labels(job: str) -> dict[str, str]:
    return {LABEL_JOB: job, LABEL_ROLE: ROLE_RENDEZVOUS}


def rendezvous_pod(job: ElasticJobSpec) -> dict[str, Any]:
    """The rendezvous host: a c10d ``TCPStore`` server in ``spec.rendezvousImage``, else the workers' image (it
    has PyTorch), CPU only, not part of the gang, restarted in place by the kubelet (its Service and address
    stay)."""
    template_spec = job.template["spec"]
    spec: dict[str, Any] = {key: copy.deepcopy(template_spec[key]) for key in _HOST_POD_FIELDS if key in template_spec}
    spec.setdefault("schedulerName", SCHEDULER_NAME)
    first = template_spec["containers"][0]
    container: dict[str, Any] = {
        "name": RENDEZVOUS_CONTAINER, "image": job.rendezvous_image or first["image"],
        "command": ["python3", "-c", RENDEZVOUS_SCRIPT],
        "env": [{"name": "KUBECELL_RDZV_PORT", "value": str(job.rendezvous_port)}],
        "ports": [{"name": "c10d", "containerPort": job.rendezvous_port, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": job.rendezvous_port}, "periodSeconds": 5},
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
    }
    if "imagePullPolicy" in first and job.rendezvous_image is None:
        container["imagePullPolicy"] = first["imagePullPolicy"]
    spec.update({"containers": [container], "restartPolicy": "Always", "terminationGracePeriodSeconds": 5})
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": rendezvous_name(job.name), "namespace": job.namespace,
                         "labels": rendezvous_labels(job.name), "annotations": _tenant_annotations(job),
                         "ownerReferences": [owner_reference(job)]},
            "spec": spec}


def _tenant_annotations(job: ElasticJobSpec) -> dict[str, str]:
    """The workers' virtual cluster (and opportunistic flag): the rendezvous host runs in the same tenant, which
    may be the only one a namespace's pods are allowed to use."""
    stated = (job.template.get("metadata") or {}).get("annotations") or {}
    return {key: str(stated[key]) for key in (ANNOTATION_VC, ANNOTATION_OPPORTUNISTIC) if key in stated}


def rendezvous_service(job: ElasticJobSpec) -> dict[str, Any]:
    """``<job>-rdzv``: a stable name and virtual IP for the rendezvous host (and only it), on the
    rendezvous port. ``publishNotReadyAddresses``: the store serves as soon as its process runs."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": rendezvous_name(job.name), "namespace": job.namespace,
                         "labels": rendezvous_labels(job.name), "ownerReferences": [owner_reference(job)]},
            "spec": {"type": "ClusterIP", "selector": rendezvous_labels(job.name), "publishNotReadyAddresses": True,
                     "ports": [{"name": "c10d", "port": job.rendezvous_port, "targetPort": job.rendezvous_port,
                                "protocol": "TCP"}]}}
