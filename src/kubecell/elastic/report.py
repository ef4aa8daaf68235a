"""The worker side of the step-report contract: a training script tells kubecell's scheduler how fast its steps
are and how noisy its gradients, so that the scheduler can size the job by goodput (Pollux).

Use, in the training script (torch is the script's, never imported here)::

    from kubecell.elastic.report import StepReporter

    reporter = StepReporter.from_environment(max_local_batch=64)  # nothing outside a kubecell ElasticJob pod
    local_rank_zero = int(os.environ.get("LOCAL_RANK", "0")) == 0
    for batch in loader:
        ...                                             # forward, backward (timing the all-reduce), step
        if local_rank_zero:
            reporter.step(step_seconds=step, sync_seconds=sync, local_batch=micro_batch,
                          accumulation_steps=k, grad_sqr=sqr, grad_var=var)
    if local_rank_zero:
        reporter.flush()

**Which process reports.** The reporter reports from whichever process calls it, and every process of a pod
would write the same annotation on the same pod: call it on local rank 0 only (``LOCAL_RANK == 0``, i.e.
``RANK == GROUP_RANK * LOCAL_WORLD_SIZE``), one writer per worker pod.

**What to measure.** ``step_seconds``: wall time of one optimizer step, every accumulated micro-batch and
the gradient synchronisation included (time it with ``torch.cuda.synchronize()`` on both ends, or with CUDA
events). ``sync_seconds``: the part of it spent waiting for the gradient all-reduce (0 with one replica).
``local_batch``: the micro-batch this replica processes per forward/backward pass; ``accumulation_steps``:
micro-batches per optimizer step. ``max_local_batch`` (optional, once): the largest micro-batch the script fits
in one GPU's memory, beyond which it accumulates, so that the scheduler prices larger batches as the script will
run them. ``kubecell.kube.step_reports`` says how the scheduler reads these.

**Gradient statistics (Pollux's estimator, as AdaptDL computes it).** At an optimizer step, let ``n`` be the
number of micro-batch gradients averaged into it (``replicas * accumulation_steps``), ``local_sqr`` the mean
over them of each one's squared norm ``|g_i|^2`` (taken before the all-reduce, then averaged with one more
all-reduce of a scalar), ``total_sqr`` the squared norm ``|g|^2`` of the averaged gradient, ``M`` the global
batch and ``M0`` the job's initial batch (``KUBECELL_BATCH_SIZE_MIN`` when the spec sets it)::

    grad_sqr = (n * total_sqr - local_sqr) / (n - 1)           # |true gradient|^2, unbiased
    grad_var = (local_sqr - total_sqr) * (M / M0) / (n - 1)    # variance of a gradient of batch M0

clamped at 0 (the estimates are noisy). With ``n == 1``, use this step's and the previous step's gradients as
the two samples (``n = 2``, ``M / M0`` doubled). Both are optional: pass ``None`` until measured; the scheduler
then assumes no gradient noise (a larger batch buys nothing).

**Cost and failures.** ``step`` is a few float operations per call: it keeps a running mean of the steps
since the last write and writes (one JSON merge patch of the pod's own ``metadata.annotations``, at most
``WRITE_TIMEOUT_SECONDS``) at the first step and then at most once per ``interval_seconds``. It never raises
into the training loop: an API error is logged once per kind (status or exception type) and the next
interval tries again; arguments that are not a measurement (NaN, negative, a non-integer batch) are not
sent and are logged once per kind. A change of ``local_batch`` or ``accumulation_steps`` starts a new mean
(a mean over two batch sizes describes neither). One reporter is for one thread.

Credentials: in a pod, its service account (``KUBERNETES_SERVICE_HOST`` and the mounted token); else the
kubeconfig (``$KUBECONFIG``, else ``~/.kube/config``). The worker's service account needs ``patch`` on
``pods`` in its namespace (``deploy/elastic/worker-rbac.yaml``).
"""

from __future__ import annotations

import logging
import math
import operator
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import SupportsFloat, SupportsIndex
from urllib.parse import quote

from kubernetes import client, config

from kubecell.kube.names import ANNOTATION_STEP_REPORT
from kubecell.kube.rest import ApiError, Kube
from kubecell.kube.step_reports import build_step_report

log = logging.getLogger(__name__)

ENV_POD_NAME = "KUBECELL_POD_NAME"
ENV_POD_NAMESPACE = "KUBECELL_POD_NAMESPACE"
SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
WRITE_TIMEOUT_SECONDS = 5.0
"""The longest one write may take: a write blocks the training step that makes it, so an API server
that does not answer costs a step at most this much once per interval, never a hang."""


class StepReporter:
    """Writes a worker's step report (``kubecell.io/step-report``) on its own pod; see the module.

    ``enabled`` is False outside a kubecell ElasticJob pod or without credentials: every call then returns
    False at once. Build it with :meth:`from_environment`; the constructor is for tests and embedders that
    have their own client."""

    def __init__(self, kube: Kube | None, *, pod_name: str = "", namespace: str = "", replicas: int = 1,
                 nodes: int = 1, interval_seconds: float = 30.0, max_local_batch: int | None = None,
                 clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time) -> None:
        self.enabled: bool = kube is not None and bool(pod_name) and bool(namespace)
        limit = _integer(max_local_batch) if max_local_batch is not None else None
        if max_local_batch is not None and (limit is None or limit < 1):
            log.warning("max_local_batch %r is not a positive integer; step reports do not state one",
                        max_local_batch)
            limit = None
        self.max_local_batch: int | None = limit
        """The largest micro-batch the script fits in its GPU's memory, stated in every report (None: not
        stated): the scheduler then prices larger batches as the accumulation the script will do."""
        self._kube = kube
        self._path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(pod_name, safe='')}"
        self.replicas = replicas
        self.nodes = nodes
        interval = _finite(interval_seconds)
        if interval is None or interval < 0.0:
            log.warning("interval_seconds %r is not a finite non-negative number; step reports use 30 s",
                        interval_seconds)
            interval = 30.0
        self.interval_seconds: float = interval
        self._clock = clock
        self._wall_clock = wall_clock
        self._last_attempt: float | None = None
        self._logged: set[str] = set()
        self._reset(0, 0)

    @classmethod
    def from_environment(cls, *, interval_seconds: float = 30.0, max_local_batch: int | None = None) -> StepReporter:
        """The reporter of this pod: from ``KUBECELL_POD_NAME``/``KUBECELL_POD_NAMESPACE`` (the ElasticJob
        controller sets them on every worker), ``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE`` (torchrun sets them;
        1 when absent) and the pod's credentials. Never raises: without the pod's names it does nothing, and
        without credentials it logs one warning and does nothing."""
        environ = os.environ
        pod_name, namespace = environ.get(ENV_POD_NAME, ""), environ.get(ENV_POD_NAMESPACE, "")
        if not pod_name or not namespace:
            log.debug("no %s/%s: not in a kubecell ElasticJob pod, step reports are off", ENV_POD_NAME,
                      ENV_POD_NAMESPACE)
            return cls(None, interval_seconds=interval_seconds, max_local_batch=max_local_batch)
        replicas = _positive(environ, "WORLD_SIZE")
        local = _positive(environ, "LOCAL_WORLD_SIZE")
        nodes = max(1, replicas // local)
        try:
            kube = _client(environ)
        except Exception as error:  # any failure of credentials: the training must go on without reports
            log.warning("step reports are off: no Kubernetes credentials (in-cluster or kubeconfig): %s", error)
            return cls(None, interval_seconds=interval_seconds, max_local_batch=max_local_batch)
        return cls(kube, pod_name=pod_name, namespace=namespace, replicas=replicas, nodes=nodes,
                   interval_seconds=interval_seconds, max_local_batch=max_local_batch)

    def step(self, *, step_seconds: float, sync_seconds: float, local_batch: int, accumulation_steps: int = 1,
             grad_sqr: float | None = None, grad_var: float | None = None) -> bool:
        """Count one optimizer step; write the mean of the steps since the last write when the interval has
        passed (or at the first step). True when it wrote. Never raises."""
        if not self.enabled:
            return False
        try:
            problem = _argument_problem(step_seconds, sync_seconds, local_batch, accumulation_steps, grad_sqr,
                                        grad_var)
            if problem is not None:
                self._log_once(f"argument:{problem[0]}", "step report not counted: %s", problem[1])
                return False
            shape = (operator.index(local_batch), operator.index(accumulation_steps))
            if shape != (self._local_batch, self._accumulation):
                self._reset(*shape)
            self._count += 1
            self._step_sum += float(step_seconds)
            self._sync_sum += float(sync_seconds)
            if grad_sqr is not None and grad_var is not None:
                self._grad_count += 1
                self._sqr_sum += float(grad_sqr)
                self._var_sum += float(grad_var)
            if self._last_attempt is not None and self._clock() - self._last_attempt < self.interval_seconds:
                return False
            return self._write()
        except Exception as error:  # a bug here must cost a report, never the training run
            self._log_once(f"internal:{type(error).__name__}", "step report failed: %r", error)
            return False

    def flush(self) -> bool:
        """Write now the mean of the steps since the last write (before the script exits, or before a
        checkpoint-and-restart); False when there is none or the write failed. Never raises."""
        if not self.enabled or self._count == 0:
            return False
        try:
            return self._write()
        except Exception as error:
            self._log_once(f"internal:{type(error).__name__}", "step report failed: %r", error)
            return False

    # -- internals --------------------------------------------------------------------------------------------

    def _reset(self, local_batch: int, accumulation: int) -> None:
        self._local_batch = local_batch
        self._accumulation = accumulation
        self._count = 0
        self._step_sum = self._sync_sum = 0.0
        self._grad_count = 0
        self._sqr_sum = self._var_sum = 0.0

    def _write(self) -> bool:
        """One patch of the mean so far; on success the mean starts again, on failure it keeps growing (the
        next write covers those steps too). The interval counts from the end of the attempt, so a slow API
        server is asked less often, not more."""
        assert self._kube is not None
        grads = self._grad_count
        text = build_step_report(
            time=self._wall_clock(), replicas=self.replicas, nodes=self.nodes, local_batch=self._local_batch,
            accumulation_steps=self._accumulation, step_seconds=self._step_sum / self._count,
            sync_seconds=self._sync_sum / self._count, grad_sqr=self._sqr_sum / grads if grads else None,
            grad_var=self._var_sum / grads if grads else None, steps=self._count,
            max_local_batch=max(self.max_local_batch, self._local_batch) if self.max_local_batch else None)
        try:
            self._kube.patch(self._path, {"metadata": {"annotations": {ANNOTATION_STEP_REPORT: text}}}, kind="merge")
        except ApiError as error:
            kind = "unavailable" if error.unavailable else str(error.status)
            hint = (" (the pod's service account needs patch on pods in its namespace: "
                    "deploy/elastic/worker-rbac.yaml)") if error.status == 403 else ""
            self._log_once(f"api:{kind}", "step report not written (retried every %g s): %s%s",
                           self.interval_seconds, error, hint)
            return False
        finally:
            self._last_attempt = self._clock()
        self._reset(self._local_batch, self._accumulation)
        return True

    def _log_once(self, kind: str, message: str, *args: object) -> None:
        """A warning the first time a kind of problem happens; later ones at debug level (a training loop
        makes the same mistake every step, and an unreachable API server fails every interval)."""
        if kind in self._logged:
            log.debug(message, *args)
            return
        self._logged.add(kind)
        log.warning(message, *args)


def _positive(environ: Mapping[str, str], name: str) -> int:
    """A positive integer environment variable (torchrun's), 1 when absent or unreadable."""
    text = environ.get(name, "")
    try:
        value = int(text)
    except ValueError:
        if text:
            log.warning("%s=%r is not an integer; step reports take 1", name, text[:40])
        return 1
    return value if value >= 1 else 1


def _client(environ: Mapping[str, str]) -> Kube:
    """A client of the API server as this pod's service account or as the kubeconfig, with no retries of its
    own (the reporter's next interval is the retry)."""
    configuration = client.Configuration()
    if environ.get("KUBERNETES_SERVICE_HOST") and SERVICE_ACCOUNT_TOKEN.is_file():
        config.load_incluster_config(client_configuration=configuration)
    else:
        # The path is passed, not left to the client: it reads $KUBECONFIG once, when it is imported.
        config.load_kube_config(config_file=environ.get("KUBECONFIG") or None, client_configuration=configuration)
    configuration.retries = 0
    configuration.connection_pool_maxsize = 1
    return Kube(client.ApiClient(configuration), timeout=WRITE_TIMEOUT_SECONDS)


def _argument_problem(step_seconds: object, sync_seconds: object, local_batch: object, accumulation_steps: object,
                      grad_sqr: object, grad_var: object) -> tuple[str, str] | None:
    """``(kind, message)`` when the arguments are not a measurement, else None. Numbers may be any real
    scalar (a numpy or a 0-d torch value converts), counts any integer (``operator.index``), never a bool."""
    step, sync = _finite(step_seconds), _finite(sync_seconds)
    if step is None or not step > 0.0:
        return "step_seconds", f"step_seconds {step_seconds!r} is not a finite positive number"
    if sync is None or not 0.0 <= sync <= step:
        return "sync_seconds", f"sync_seconds {sync_seconds!r} is not a finite number in 0..step_seconds ({step:g})"
    for name, count in (("local_batch", local_batch), ("accumulation_steps", accumulation_steps)):
        if _integer(count) is None:
            return name, f"{name} {count!r} is not an integer >= 1"
    for name, stat in (("grad_sqr", grad_sqr), ("grad_var", grad_var)):
        if stat is not None and not ((number := _finite(stat)) is not None and number >= 0.0):
            return name, f"{name} {stat!r} is not a finite non-negative number"
    return None


def _finite(value: object) -> float | None:
    """``value`` as a finite float, or None (a bool, text, NaN, an infinity, an int beyond floats)."""
    if isinstance(value, bool | str | bytes) or not isinstance(value, SupportsFloat):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError, RuntimeError):  # RuntimeError: a torch tensor of many values
        return None
    return number if math.isfinite(number) else None


def _integer(value: object) -> int | None:
    """``value`` as an integer >= 1, or None."""
    if isinstance(value, bool) or not isinstance(value, SupportsIndex):
        return None
    try:
        number = operator.index(value)
    except TypeError:
        return None
    return number if number >= 1 else None
