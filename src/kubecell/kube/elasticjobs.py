"""The ElasticJob custom resource (``elasticjobs.kubecell.io``): its names, and its spec read with limits.

An ElasticJob runs ``torchrun`` elastic workers as one kubecell gang whose size the scheduler chooses: it
writes the job's ``/scale`` subresource (``spec.replicas``) and the controller (``kubecell.elastic``) follows.
Everything here is a pure function of plain dicts, so the controller, the scheduler and the tests read a job
alike.

**Untrusted input.** Anyone who may create an ElasticJob in a namespace writes its spec, and an object stored
under an older CRD (or with its schema removed) reaches the controller as it was stored. So
:func:`read_elastic_job` checks every field itself (types, ranges, ``minReplicas <= replicas <=
maxReplicas``, a template with containers, nesting and size) and raises :class:`ElasticJobSpecError`, which
names the object and the field and says what is accepted; it never raises anything else, whatever the object.

The objects a job stands for (its worker Pods, rendezvous host and Service) are built in
``kubecell.kube.elasticjob_objects``.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from kubecell.core.digits import decimal_digits
from kubecell.core.errors import InvalidInputError
from kubecell.core.shown import shown
from kubecell.core.validation import key_path
from kubecell.kube.names import (
    DOMAIN,
    LABEL_ELASTIC_JOB,
    LABEL_ELASTIC_ROLE,
    LABEL_RENDEZVOUS_RUN,
    LABEL_TEMPLATE_HASH,
    LABEL_WORKER_INDEX,
    NVIDIA_GPU,
    RESOURCE_GPU,
)

GROUP = DOMAIN
VERSION = "v1alpha1"
KIND = "ElasticJob"
PLURAL = "elasticjobs"
API_VERSION = f"{GROUP}/{VERSION}"

LABEL_JOB = LABEL_ELASTIC_JOB
LABEL_INDEX = LABEL_WORKER_INDEX
LABEL_RUN = LABEL_RENDEZVOUS_RUN
LABEL_ROLE = LABEL_ELASTIC_ROLE
LABEL_TEMPLATE = LABEL_TEMPLATE_HASH
"""Short names of the labels this module's builders write (defined in ``kubecell.kube.names``)."""

ROLE_WORKER = "worker"
ROLE_RENDEZVOUS = "rendezvous"

MAX_REPLICAS = 4096
"""The most workers a job may have (the CRD's bound): far beyond any torchrun job, small enough that the
controller's per-job work (one pass over the workers) stays trivial."""
MAX_NAME_CHARS = 58
"""A job's name is a DNS-1035 label short enough that ``<name>-rdzv`` is still a Service name (63)."""
MAX_MAX_RESTARTS = 1000
MAX_IMAGE_CHARS = 4096
"""The longest image reference read (the CRD's bound too)."""
MAX_GRACE_SECONDS = 86400
MAX_NPROC_PER_NODE = 1024
MAX_BATCH_SIZE = 2**31 - 1
MAX_RESTART_SECONDS = 86400
"""A restart longer than a day is a typo; the sizer would never resize such a job anyway."""
MAX_TTL_SECONDS = 2**31 - 1
"""batch/v1 Job's ``ttlSecondsAfterFinished`` is an int32."""
MIN_RENDEZVOUS_TIMEOUT = 10
MAX_RENDEZVOUS_TIMEOUT = 86400
MAX_CONTAINERS = 64
MAX_TEMPLATE_DEPTH = 32
"""The deepest nesting a pod template may have; real ones stay under 12 (affinity terms, projected volumes).
A template nested thousands deep would exhaust Python's stack when it is copied into a Pod."""
MAX_TEMPLATE_VALUES = 100_000
"""Values (keys, items, leaves) a template may hold: far above any pod spec, a bound on the work per job."""
MAX_INT64 = 2**63 - 1

DEFAULT_MAX_RESTARTS = 3
DEFAULT_RENDEZVOUS_PORT = 29400
"""torchrun's own default port for the c10d store."""
DEFAULT_RENDEZVOUS_TIMEOUT = 900
"""Seconds the controller waits, after the workers changed, for at least minReplicas of them to be Ready;
longer than torchrun's own join timeout (600 s), so the agents give up first and say why."""
DEFAULT_GRACE_SECONDS = 30
RESTART_POLICIES = ("Never", "OnFailure")

_DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS_1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_MODEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
"""A GPU model as a label value spells it (``A100``, ``V100M32``, ``rtx2080ti``)."""


class ElasticJobSpecError(InvalidInputError):
    """An ElasticJob the controller cannot run: the object, the field, what was wrong, what is accepted."""


@dataclass(frozen=True, slots=True)
class BatchSize:
    """Bounds of the global batch size the training script may choose (passed on, never interpreted)."""

    min: int
    max: int


@dataclass(frozen=True, slots=True)
class ElasticJobSpec:
    """One ElasticJob as the controller runs it: every field checked and defaulted.

    ``template`` is the pod template as written (a private deep copy; never mutated: the builders copy it
    again)."""

    namespace: str
    name: str
    uid: str
    generation: int
    min_replicas: int
    max_replicas: int
    replicas: int
    """The target: ``spec.replicas``, or ``min_replicas`` while the controller has not defaulted it."""
    replicas_stated: bool
    template: Mapping[str, Any]
    max_restarts: int
    rendezvous_port: int
    rendezvous_timeout_seconds: int
    termination_grace_period_seconds: int
    nproc_per_node: int
    batch_size: BatchSize | None
    restart_seconds: int | None = None
    """What one resize costs the job (its workers restart, rendezvous and load the checkpoint), as its owner
    states it; None: the scheduler's default. The sizer weighs every resize against it."""
    ttl_seconds_after_finished: int | None = None
    """How long the job is kept once it has ended before the controller deletes it (batch/v1 Job's field and
    meaning; ``elastic.expiry``); None: kept until someone deletes it."""
    rendezvous_image: str | None = None
    """The rendezvous host's image (``spec.rendezvousImage``); None: the workers' first container's, which has
    PyTorch (the host runs ``python3`` with ``torch``)."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def collection_path(namespace: str | None = None) -> str:
    """The ElasticJobs of one namespace, or of all namespaces (``None``)."""
    if namespace is None:
        return f"/apis/{GROUP}/{VERSION}/{PLURAL}"
    return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}"


def job_path(namespace: str, name: str) -> str:
    return f"{collection_path(namespace)}/{name}"


def ttl_after_finished(obj: Mapping[str, Any]) -> int | None:
    """``spec.ttlSecondsAfterFinished`` read alone (a job whose spec is otherwise invalid ends too, and is deleted
    all the same); None where absent or not a whole number 0..``MAX_TTL_SECONDS``, which the CRD's schema refuses."""
    spec = obj.get("spec")
    if not isinstance(spec, Mapping) or spec.get("ttlSecondsAfterFinished") is None:
        return None
    try:
        return _int_field(spec, "ttlSecondsAfterFinished", "", 0, MAX_TTL_SECONDS, None)
    except ElasticJobSpecError:
        return None


def worker_name(job: str, index: int) -> str:
    return f"{job}-worker-{index}"


def worker_index(pod: Mapping[str, Any], job: str) -> int | None:
    """A worker Pod's index: its label, which must also be its name's (``<job>-worker-<i>``), else None."""
    found = (pod.get("metadata") or {}).get("labels")
    text = found.get(LABEL_INDEX) if isinstance(found, Mapping) else None
    if not isinstance(text, str) or not decimal_digits(text) or len(text) > 4:
        return None
    index = int(text)
    if text != str(index) or index >= MAX_REPLICAS:
        return None
    if (pod.get("metadata") or {}).get("name") != worker_name(job, index):
        return None
    return index


def rendezvous_name(job: str) -> str:
    """The rendezvous host Pod and its Service share this name."""
    return f"{job}-rdzv"


def worker_selector(job: str) -> str:
    """The label selector of a job's workers (``status.selector``, which ``/scale`` reports)."""
    return f"{LABEL_JOB}={job},{LABEL_ROLE}={ROLE_WORKER}"


def involved(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The ElasticJob as an Event's ``involvedObject``."""
    meta = obj.get("metadata") or {}
    return {"apiVersion": API_VERSION, "kind": KIND, "name": str(meta.get("name", "")),
            "namespace": str(meta.get("namespace", "default")), "uid": str(meta.get("uid", ""))}


# --- reading ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ElasticRef:
    """The ElasticJob a pod says controls it (its controller owner reference)."""

    namespace: str
    name: str
    uid: str


_UID = re.compile(r"[0-9A-Za-z-]{1,128}")
"""What an object's uid is made of (the API server writes RFC 4122 UUIDs)."""


def is_object_uid(text: object) -> TypeGuard[str]:
    """Whether ``text`` could be an object's uid as the API server writes them; read from anything a user or
    another process wrote, before it goes into a path, a key or a comparison."""
    return isinstance(text, str) and _UID.fullmatch(text) is not None


def elastic_owner(pod: Mapping[str, Any]) -> ElasticRef | None:
    """The pod's controlling ElasticJob, or None. Read defensively: the pod's metadata is untrusted, and the
    API server checks only that an owner reference's name and uid are not empty. A name that could not be an
    ElasticJob's (``../../b/elasticjobs/x`` would reach another namespace's job once put in a path) or a uid
    that could not be one makes the pod owned by none."""
    meta = pod.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    owners = meta.get("ownerReferences")
    if not isinstance(owners, list):
        return None
    for owner in owners:
        if (isinstance(owner, Mapping) and owner.get("controller") is True and owner.get("kind") == KIND
                and owner.get("apiVersion") == API_VERSION and isinstance(owner.get("name"), str)
                and isinstance(owner.get("uid"), str) and owner["name"] and owner["uid"]):
            name, uid = owner["name"], owner["uid"]
            if len(name) > MAX_NAME_CHARS or not _DNS_1035.fullmatch(name) or not is_object_uid(uid):
                return None
            return ElasticRef(str(meta.get("namespace") or "default"), name, uid)
    return None


GPU_MODEL_CHARS = 63
"""The longest GPU model name kept in ``status.gpuModel`` (a label value's limit, as node labels carry them)."""


def is_gpu_model_name(text: object) -> TypeGuard[str]:
    """Whether ``text`` could be a GPU model as node labels carry them (a label value of 1..63 characters)."""
    return isinstance(text, str) and 0 < len(text) <= GPU_MODEL_CHARS and _MODEL_NAME.fullmatch(text) is not None


def kept_gpu_model(obj: Mapping[str, Any]) -> str | None:
    """The GPU model the scheduler keeps in the job's ``status.gpuModel`` (``scheduler.elastic_types``), or
    None where it is absent or not a model name. Whoever reads it must still check it is one the job's pods
    accept: the status is written by whoever may patch ``elasticjobs/status``."""
    status = obj.get("status")
    model = status.get("gpuModel") if isinstance(status, Mapping) else None
    return model if is_gpu_model_name(model) else None


def _int_field(spec: Mapping[str, Any], field: str, where: str, low: int, high: int, default: int | None,
               *, under: str = "spec") -> int:
    """An integer field of ``under`` within ``low..high``; ``default`` when absent (None: required)."""
    name = f"{under}.{field}"
    if field not in spec or spec[field] is None:
        if default is None:
            raise ElasticJobSpecError("is missing", location=where, field=name,
                                      accepted=f"a whole number {low}..{high}")
        return default
    value = spec[field]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ElasticJobSpecError(f"is {shown(value)}, not a whole number", location=where, field=name,
                                  accepted=f"a whole number {low}..{high}")
    if not low <= value <= high:
        raise ElasticJobSpecError(f"is {shown(value)}, outside {low}..{high}", location=where, field=name,
                                  accepted=f"a whole number {low}..{high}")
    return value


def _text(value: Any, where: str, field: str, accepted: str, *, limit: int = 253) -> str:
    if not isinstance(value, str) or not value:
        raise ElasticJobSpecError(f"is {shown(value)}", location=where, field=field, accepted=accepted)
    if len(value) > limit:
        raise ElasticJobSpecError(f"is {len(value)} characters long", location=where, field=field,
                                  accepted=f"{accepted}, at most {limit} characters")
    return value


def _template_problem(template: Any, where: str) -> ElasticJobSpecError | None:
    """What makes the template unusable as JSON a Pod can be built from: keys that are not text, nesting
    deeper than ``MAX_TEMPLATE_DEPTH``, more than ``MAX_TEMPLATE_VALUES`` values, numbers beyond int64 or not
    finite. Walked without recursion, so no template can exhaust the stack here."""
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), template)]
    seen = 0
    while stack:
        path, value = stack.pop()
        seen += 1
        field = key_path(("spec", "template", *path))
        if seen > MAX_TEMPLATE_VALUES:
            return ElasticJobSpecError(f"holds more than {MAX_TEMPLATE_VALUES} values", location=where,
                                       field="spec.template", accepted="a pod template of ordinary size")
        if len(path) > MAX_TEMPLATE_DEPTH:
            return ElasticJobSpecError(f"nests deeper than {MAX_TEMPLATE_DEPTH} levels", location=where,
                                       field=field, accepted="a PodTemplateSpec")
        if isinstance(value, Mapping):
            for key, item in value.items():
                if not isinstance(key, str):
                    return ElasticJobSpecError(f"has the key {shown(key)}, which is not text", location=where,
                                               field=field, accepted="text keys")
                stack.append(((*path, key), item))
        elif isinstance(value, list | tuple):
            stack.extend(((*path, index), item) for index, item in enumerate(value))
        elif isinstance(value, bool) or value is None or isinstance(value, str):
            continue
        elif isinstance(value, int):
            if abs(value) > MAX_INT64:
                return ElasticJobSpecError(f"{shown(value)} is beyond int64", location=where, field=field,
                                           accepted="the numbers of a PodTemplateSpec")
        elif isinstance(value, float):
            if not math.isfinite(value) or abs(value) > MAX_INT64:
                return ElasticJobSpecError(f"{shown(value)} is not a finite number within int64", location=where,
                                           field=field, accepted="the numbers of a PodTemplateSpec")
        else:
            return ElasticJobSpecError(f"holds {shown(value)}, which is not JSON", location=where, field=field,
                                       accepted="a PodTemplateSpec")
    return None


def _string_map(value: Any, where: str, field: str) -> None:
    if value is None:
        return
    if not isinstance(value, Mapping) or not all(isinstance(v, str) for v in value.values()):
        raise ElasticJobSpecError(f"is {shown(value)}", location=where, field=field,
                                  accepted="a mapping of text to text")


def _read_template(spec: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``spec.template``: a PodTemplateSpec with at least one container, each named and with an image."""
    if "template" not in spec or spec["template"] is None:
        raise ElasticJobSpecError("is missing", location=where, field="spec.template",
                                  accepted="a PodTemplateSpec (metadata, spec with containers)")
    template = spec["template"]
    if not isinstance(template, Mapping):
        raise ElasticJobSpecError(f"is {shown(template)}, not a mapping", location=where, field="spec.template",
                                  accepted="a PodTemplateSpec (metadata, spec with containers)")
    problem = _template_problem(template, where)
    if problem is not None:
        raise problem
    meta = template.get("metadata")
    if meta is not None:
        if not isinstance(meta, Mapping):
            raise ElasticJobSpecError(f"is {shown(meta)}, not a mapping", location=where,
                                      field="spec.template.metadata", accepted="labels and annotations")
        _string_map(meta.get("labels"), where, "spec.template.metadata.labels")
        _string_map(meta.get("annotations"), where, "spec.template.metadata.annotations")
    pod = template.get("spec")
    if not isinstance(pod, Mapping):
        raise ElasticJobSpecError(f"is {shown(pod)}" if pod is not None else "is missing", location=where,
                                  field="spec.template.spec", accepted="a PodSpec with containers")
    containers = pod.get("containers")
    if not isinstance(containers, list) or not containers:
        raise ElasticJobSpecError(f"is {shown(containers)}" if containers is not None else "is missing",
                                  location=where, field="spec.template.spec.containers",
                                  accepted=f"a list of 1..{MAX_CONTAINERS} containers, the first running torchrun")
    if len(containers) > MAX_CONTAINERS:
        raise ElasticJobSpecError(f"has {len(containers)} containers", location=where,
                                  field="spec.template.spec.containers", accepted=f"1..{MAX_CONTAINERS} containers")
    for index, container in enumerate(containers):
        field = f"spec.template.spec.containers[{index}]"
        if not isinstance(container, Mapping):
            raise ElasticJobSpecError(f"is {shown(container)}, not a mapping", location=where, field=field,
                                      accepted="a container with a name and an image")
        name = _text(container.get("name"), where, f"{field}.name", "a DNS-1123 label", limit=63)
        if not _DNS_1123.fullmatch(name):
            raise ElasticJobSpecError(f"is {shown(name)}", location=where, field=f"{field}.name",
                                      accepted="a DNS-1123 label (lowercase letters, digits, '-')")
        _text(container.get("image"), where, f"{field}.image", "a container image", limit=MAX_IMAGE_CHARS)
        env = container.get("env")
        if env is not None and (not isinstance(env, list) or
                                not all(isinstance(e, Mapping) and isinstance(e.get("name"), str) for e in env)):
            raise ElasticJobSpecError(f"is {shown(env)}", location=where, field=f"{field}.env",
                                      accepted="a list of EnvVars, each with a name")
    policy = pod.get("restartPolicy")
    if policy is not None and policy not in RESTART_POLICIES:
        raise ElasticJobSpecError(
            f"is {shown(policy)}", location=where, field="spec.template.spec.restartPolicy",
            accepted="Never (the default: a failed worker is replaced by the controller) or OnFailure; not Always, "
                     "which would restart a worker that finished, so the job could never succeed")
    scheduler = pod.get("schedulerName")
    if scheduler is not None:
        _text(scheduler, where, "spec.template.spec.schedulerName", "a scheduler name")
    return copy.deepcopy(dict(template))


def _whole_gpus(template: Mapping[str, Any]) -> int:
    """Whole GPUs the template's containers ask for (``kubecell.io/gpu`` or ``nvidia.com/gpu`` limits, else
    requests): one training process per GPU is torchrun's rule. 0 when none (or not a plain count)."""
    total = 0
    for container in template["spec"]["containers"]:
        resources = container.get("resources")
        if not isinstance(resources, Mapping):
            continue
        for part in ("limits", "requests"):
            amounts = resources.get(part)
            if not isinstance(amounts, Mapping):
                continue
            found = [amounts.get(name) for name in (RESOURCE_GPU, NVIDIA_GPU) if name in amounts]
            if found:
                for value in found:
                    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_NPROC_PER_NODE:
                        total += value
                    elif isinstance(value, str) and decimal_digits(value) \
                            and 0 < int(value) <= MAX_NPROC_PER_NODE:
                        total += int(value)
                break
    return min(total, MAX_NPROC_PER_NODE)


def read_elastic_job(obj: Any) -> ElasticJobSpec:
    """The ElasticJob object as a checked spec; :class:`ElasticJobSpecError` for anything that cannot run
    (the only exception this raises, whatever ``obj`` is)."""
    if not isinstance(obj, Mapping):
        raise ElasticJobSpecError(f"is {shown(obj)}, not an object", location=KIND)
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        raise ElasticJobSpecError(f"is {shown(meta)}", location=KIND, field="metadata", accepted="object metadata")
    namespace = meta.get("namespace", "default")
    if not isinstance(namespace, str) or not _DNS_1123.fullmatch(namespace) or len(namespace) > 63:
        raise ElasticJobSpecError(f"is {shown(namespace)}", location=KIND, field="metadata.namespace",
                                  accepted="a namespace name")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ElasticJobSpecError(f"is {shown(name)}", location=f"{KIND} {namespace}/?", field="metadata.name",
                                  accepted="a name")
    if len(name) > MAX_NAME_CHARS or not _DNS_1035.fullmatch(name):
        raise ElasticJobSpecError(f"is {shown(name)}", location=f"{KIND} {namespace}", field="metadata.name",
                                  accepted=f"a DNS-1035 label of at most {MAX_NAME_CHARS} characters (lowercase "
                                           "letters, digits, '-', starting with a letter), so that "
                                           "'<name>-rdzv' can name the rendezvous Service")
    where = f"{KIND} {namespace}/{name}"
    uid = _text(meta.get("uid"), where, "metadata.uid", "the UID the API server gave the object", limit=128)
    generation = meta.get("generation", 0)
    if isinstance(generation, bool) or not isinstance(generation, int) or not 0 <= generation <= MAX_INT64:
        raise ElasticJobSpecError(f"is {shown(generation)}", location=where, field="metadata.generation",
                                  accepted="a whole number 0..2^63-1")
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise ElasticJobSpecError(f"is {shown(spec)}" if spec is not None else "is missing", location=where,
                                  field="spec", accepted="minReplicas, maxReplicas and a pod template")
    low = _int_field(spec, "minReplicas", where, 1, MAX_REPLICAS, None)
    high = _int_field(spec, "maxReplicas", where, 1, MAX_REPLICAS, None)
    if low > high:
        raise ElasticJobSpecError(f"is {low}, above maxReplicas {high}", location=where, field="spec.minReplicas",
                                  accepted=f"at most maxReplicas ({high})")
    stated = spec.get("replicas") is not None
    replicas = _int_field(spec, "replicas", where, 0, MAX_REPLICAS, low)
    if not low <= replicas <= high:
        raise ElasticJobSpecError(f"is {replicas}, outside minReplicas..maxReplicas", location=where,
                                  field="spec.replicas", accepted=f"{low}..{high} (what /scale may set)")
    template = _read_template(spec, where)
    max_restarts = _int_field(spec, "maxRestarts", where, 0, MAX_MAX_RESTARTS, DEFAULT_MAX_RESTARTS)
    port = _int_field(spec, "rendezvousPort", where, 1, 65535, DEFAULT_RENDEZVOUS_PORT)
    timeout = _int_field(spec, "rendezvousTimeoutSeconds", where, MIN_RENDEZVOUS_TIMEOUT, MAX_RENDEZVOUS_TIMEOUT,
                         DEFAULT_RENDEZVOUS_TIMEOUT)
    pod_grace = template["spec"].get("terminationGracePeriodSeconds")
    if pod_grace is not None and (isinstance(pod_grace, bool) or not isinstance(pod_grace, int)
                                  or not 0 <= pod_grace <= MAX_GRACE_SECONDS):
        raise ElasticJobSpecError(f"is {shown(pod_grace)}", location=where,
                                  field="spec.template.spec.terminationGracePeriodSeconds",
                                  accepted=f"a whole number 0..{MAX_GRACE_SECONDS}")
    grace = _int_field(spec, "terminationGracePeriodSeconds", where, 0, MAX_GRACE_SECONDS,
                       pod_grace if pod_grace is not None else DEFAULT_GRACE_SECONDS)
    nproc = _int_field(spec, "nprocPerNode", where, 1, MAX_NPROC_PER_NODE, max(_whole_gpus(template), 1))
    batch = spec.get("batchSize")
    batch_size = None
    if batch is not None:
        if not isinstance(batch, Mapping):
            raise ElasticJobSpecError(f"is {shown(batch)}, not a mapping", location=where, field="spec.batchSize",
                                      accepted="{min: N, max: M} with 1 <= N <= M")
        smallest = _int_field(batch, "min", where, 1, MAX_BATCH_SIZE, None, under="spec.batchSize")
        largest = _int_field(batch, "max", where, 1, MAX_BATCH_SIZE, None, under="spec.batchSize")
        if smallest > largest:
            raise ElasticJobSpecError(f"min {smallest} is above max {largest}", location=where,
                                      field="spec.batchSize", accepted="min <= max")
        batch_size = BatchSize(smallest, largest)
    restart = None if spec.get("restartSeconds") is None else _int_field(spec, "restartSeconds", where, 0,
                                                                         MAX_RESTART_SECONDS, None)
    ttl = None if spec.get("ttlSecondsAfterFinished") is None else _int_field(
        spec, "ttlSecondsAfterFinished", where, 0, MAX_TTL_SECONDS, None)  # (ttl_after_finished reads it alone)
    image = spec.get("rendezvousImage")
    if image is not None:
        image = _text(image, where, "spec.rendezvousImage", "a container image with python3 and PyTorch",
                      limit=MAX_IMAGE_CHARS)
    return ElasticJobSpec(namespace=namespace, name=name, uid=uid, generation=generation, min_replicas=low,
                          max_replicas=high, replicas=replicas, replicas_stated=stated, template=template,
                          max_restarts=max_restarts, rendezvous_port=port, rendezvous_timeout_seconds=timeout,
                          termination_grace_period_seconds=grace, nproc_per_node=nproc, batch_size=batch_size,
                          restart_seconds=restart, ttl_seconds_after_finished=ttl, rendezvous_image=image)
