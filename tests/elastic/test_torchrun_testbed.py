"""A real torchrun elastic job run from an ElasticJob on the testbed: kubecell's scheduler places the gang, the
ElasticJob controller makes the pods, and the process kubelet runs them as host processes: the rendezvous
host's ``TCPStore`` and one torchrun agent per worker pod, each training ``examples/elastic/train.py`` (gloo
on CPU) from a checkpoint directory they share.

Stage 1: replicas 2 (min 1, max 3) train in one world of 2 until the job is Succeeded, the loss going down.
Stage 2: nobody touches ``/scale``: the job borrows GPUs of another tenant's node, kubecell's scheduler raises
its target to 3 when a blocker leaves and lowers it to 1 when a guaranteed pod of the tenant that owns the
node claims it; ``steps.jsonl`` shows worlds of 3, then 1, every restart resuming from the checkpoint, the
loss still going down. The workers run as the ``kubecell-elastic-worker`` account (``deploy/elastic``'s RBAC
and admission policy), with the token the process kubelet gives their pods, and write their own step reports:
the scheduler's goodput model learns from what the real training measures, and the raise to 3 is its
decision (its reason is a goodput gain, not "no trusted step reports").
Stage 3: a changed ``spec.template`` replaces both workers of a running world of 2 at once; the new ones
resume from the checkpoint and train to the end, and the job counts no restart.

**What differs from a cluster.** The process kubelet runs every pod on the host's network (podIP 127.0.0.1),
where the rendezvous Service's name resolves nowhere, and two pods cannot listen on one port. So the workers'
command passes ``--rdzv-endpoint=127.0.0.1:<port>`` (torchrun's options override its ``PET_*`` environment,
here ``PET_RDZV_ENDPOINT=<job>-rdzv:<port>``) and the job's ``rendezvousPort`` is that same free port, which
the rendezvous host pod listens on. ``--rdzv-conf`` repeats ``is_host=false`` (the option replaces the whole
``PET_RDZV_CONF``) and shortens torchrun's ``last_call_timeout`` (30 s by default, waited in every round).
``GLOO_SOCKET_IFNAME=lo``: gloo on loopback needs it (``test_torchrun_contract``).

Needs PyTorch in the Python running the tests (``pip install -e ".[train]"``), else skipped; and the testbed
(skipped where it cannot be built). Every wait has a deadline; a failed one says the job's status, each pod's
phase and the tail of its log.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest

from kubecell.core.model import make_node
from kubecell.kube import elasticjob_objects as objects
from kubecell.kube import elasticjobs as ej
from kubecell.kube.elasticjobs import ElasticRef
from kubecell.kube.rest import ApiError, Kube
from kubecell.scheduler.options import SchedulerOptions
from kubecell.testbed.control_plane import ControlPlaneState
from kubecell.testbed.nodes import node_manifest
from kubecell.testbed.process_env import DEFAULT_PATH
from kubecell.testbed.process_kubelet import RUNS_LABEL, RUNS_PROCESSES, container_log, running_process_kubelet
from tests.cluster_fixtures import RunningScheduler
from tests.elastic.support import DEPLOY, RunningController, counted
from tests.kube.test_virtualclusters import accepted, put
from tests.scheduler.deploy_support import kubectl
from tests.scheduler.trust_support import pod_body
from tests.support import registered_node, wait_for

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install -e '.[train]'): the real torchrun "
                                    "job on the testbed needs it")

TRAIN = Path(__file__).resolve().parents[2] / "examples" / "elastic" / "train.py"
TEST_NODE = "kubecell.io/test-node"
WORKER_ACCOUNT = "kubecell-elastic-worker"
CONTAINER = "trainer"
CHECKPOINT_EVERY = 5
LOG_LINES = 25
"""Lines of each pod's log a failed wait shows."""

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def process_node(testbed: ControlPlaneState, kube: Kube) -> Iterator[str]:
    """A node of the test's own whose pods run as host processes. The kubelet's ``PATH`` starts with this
    Python's directory: the rendezvous host runs ``python3`` (the workers' image's), which must be one with
    PyTorch, and the tests may run from a virtual environment that is not activated."""
    name = f"torch-{uuid.uuid4().hex[:6]}"
    node = make_node(name, cpu_milli=32_000, memory_mib=131_072, gpu_count=8, gpu_model="A100",
                     labels={TEST_NODE: name, RUNS_LABEL: RUNS_PROCESSES})
    host_env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', DEFAULT_PATH)}"}
    with registered_node(kube, node_manifest(node)), running_process_kubelet(
            testbed, [name], backoff_initial=0.2, backoff_max=1.0, max_grace=10.0, host_env=host_env):
        yield name


@dataclass(frozen=True)
class Cluster:
    namespace: str
    node: str
    scheduler: RunningScheduler


@pytest.fixture
def cluster(testbed: ControlPlaneState, kube: Kube, crd: None, elastic_crd: None, namespace: str, process_node: str,
            start_scheduler: type[RunningScheduler]) -> Iterator[Cluster]:
    """kubecell's scheduler and the ElasticJob controller running, and the workers' account with its RBAC and
    admission policy (``deploy/elastic``). Two tenants: ``vision`` owns an 8-GPU A100 node (the test's node is
    the one its cell binds when it claims it) and lends it while idle; ``speech``, the training job's, owns
    none here, so its workers borrow."""
    put(kube, "vision", cells={"A100x8/node": 1})
    put(kube, "speech", cells={"P40x8/node": 1})
    kubectl(testbed, "apply", "-n", namespace, "-f", str(DEPLOY / "worker-rbac.yaml"))
    kubectl(testbed, "apply", "-f", str(DEPLOY / "worker-admission.yaml"))
    running = start_scheduler(testbed, SchedulerOptions(resize_interval_seconds=1.0))
    for tenant in ("vision", "speech"):
        wait_for(f"{tenant} accepted", partial(accepted, kube, tenant))
    controller = RunningController(testbed.admin_kubeconfig, namespace)
    try:
        yield Cluster(namespace, process_node, running)
    finally:
        controller.close()
        kubectl(testbed, "delete", "-f", str(DEPLOY / "worker-admission.yaml"), "--ignore-not-found")


@dataclass
class Job:
    """One ElasticJob of a test, what it writes, and how to tell what went wrong."""

    kube: Kube
    testbed_dir: Path
    namespace: str
    name: str
    checkpoint: Path
    waited: dict[str, str] = field(default_factory=dict)
    """Pod name -> the last reason it was seen waiting for (scheduling, readiness), kept after it is gone."""

    @property
    def path(self) -> str:
        return f"/apis/kubecell.io/v1alpha1/namespaces/{self.namespace}/elasticjobs/{self.name}"

    def create(self, node: str, *, replicas: int, steps: int, example_seconds: float, gpus: int = 0,
               vc: str | None = None, batch_size: tuple[int, int] | None = None) -> None:
        port = free_port()
        command = [sys.executable, "-m", "torch.distributed.run",
                   # host network: the Service name <job>-rdzv resolves nowhere, the host pod listens on 127.0.0.1
                   f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-conf=is_host=false,last_call_timeout=2",
                   str(TRAIN), "--checkpoint", str(self.checkpoint), "--steps", str(steps),
                   "--example-seconds", str(example_seconds), "--checkpoint-every", str(CHECKPOINT_EVERY)]
        resources: dict[str, Any] = {"requests": {"cpu": "1", "memory": "1Gi"}}
        if gpus:
            resources["limits"] = {"nvidia.com/gpu": str(gpus)}
        template = {"metadata": {"labels": {"app": "train"}, "annotations": {"kubecell.io/vc": vc} if vc else {}},
                    "spec": {"nodeSelector": {TEST_NODE: node}, "terminationGracePeriodSeconds": 10,
                             "serviceAccountName": WORKER_ACCOUNT,
                             "containers": [{"name": CONTAINER, "image": "ignored", "command": command,
                                             "env": [{"name": "GLOO_SOCKET_IFNAME", "value": "lo"},
                                                     {"name": "OMP_NUM_THREADS", "value": "1"}],
                                             "resources": resources}]}}
        self.kube.create(ej.collection_path(self.namespace), {
            "apiVersion": ej.API_VERSION, "kind": ej.KIND, "metadata": {"name": self.name},
            # one training process per worker: its GPUs are the node's inventory, not devices torch could use
            "spec": {"minReplicas": 1, "maxReplicas": 3, "replicas": replicas, "maxRestarts": 10, "nprocPerNode": 1,
                     "rendezvousPort": port, "template": template,
                     **({"batchSize": {"min": batch_size[0], "max": batch_size[1]}} if batch_size else {})}})

    def scale(self, replicas: int) -> None:
        """What ``kubectl scale elasticjob/<name> --replicas=N`` sends (and the scheduler writes)."""
        self.kube.patch(f"{self.path}/scale", {"spec": {"replicas": replicas}})

    def status(self) -> dict[str, Any]:
        try:
            return dict(self.kube.get(self.path).get("status") or {})
        except ApiError as error:
            if error.not_found:
                return {}  # not created yet
            raise

    def phase(self) -> str:
        return str(self.status().get("phase", ""))

    def records(self) -> list[dict[str, Any]]:
        """``steps.jsonl``: resume lines and step lines (a line being written is left for the next read)."""
        path = self.checkpoint / "steps.jsonl"
        if not path.exists():
            return []
        found = []
        for line in path.read_text().splitlines():
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
        return found

    def steps(self, world: int | None = None) -> list[dict[str, Any]]:
        return [r for r in self.records() if "step" in r and (world is None or r["world"] == world)]

    def pods(self) -> list[dict[str, Any]]:
        return list(self.kube.get(f"/api/v1/namespaces/{self.namespace}/pods",
                                  labelSelector=f"{ej.LABEL_JOB}={self.name}")["items"])

    def log(self, pod: str) -> str:
        container = objects.RENDEZVOUS_CONTAINER if pod == ej.rendezvous_name(self.name) else CONTAINER
        return container_log(self.testbed_dir, self.namespace, pod, container)

    def _waiting(self, pod: dict[str, Any]) -> str:
        conditions = (pod.get("status") or {}).get("conditions") or []
        return "; ".join(f"{c['type']}={c['status']} {c.get('reason', '')} {c.get('message', '')}".strip()
                         for c in conditions if c.get("status") != "True")

    def remember(self) -> None:
        """Note why each pending pod waits: a pod the controller deletes later takes its reason with it."""
        for pod in self.pods():
            if (pod.get("status") or {}).get("phase") == "Pending" and self._waiting(pod):
                self.waited[str(pod["metadata"]["name"])] = self._waiting(pod)

    def warnings(self) -> list[str]:
        """The Warning Events about the job's objects (the scheduler's FailedScheduling among them)."""
        found = self.kube.get(f"/api/v1/namespaces/{self.namespace}/events")["items"]
        return [f"{e['involvedObject'].get('name')}: {e.get('reason')}: {e.get('message')}" for e in found
                if e.get("type") == "Warning" and str(e["involvedObject"].get("name", "")).startswith(self.name)]

    def diagnosis(self) -> str:
        """The job's status, every pod's phase (and why it waits), the tail of each log, the last steps."""
        lines = [f"job {self.name}: {json.dumps(self.status())}"]
        for pod in sorted(self.pods(), key=lambda p: str(p["metadata"]["name"])):
            name, status = str(pod["metadata"]["name"]), pod.get("status") or {}
            waiting = self._waiting(pod)
            lines.append(f"--- pod {name}: {status.get('phase')} on {pod['spec'].get('nodeName') or '(unbound)'}"
                         f"{'; ' + waiting if waiting else ''}")
            lines += self.log(name).splitlines()[-LOG_LINES:]
        lines += [f"--- seen waiting: {name}: {why}" for name, why in sorted(self.waited.items())]
        lines += [f"--- warning: {line}" for line in self.warnings()[-10:]]
        lines.append(f"--- steps.jsonl (last 5 of {len(self.records())}): {self.records()[-5:]}")
        return "\n".join(lines)

    def wait(self, what: str, probe: Callable[[], T | None], timeout: float, *, while_active: bool = False) -> T:
        """Poll ``probe`` until it returns something truthy; after ``timeout`` s (or, ``while_active``, once
        the job ended) fail with the diagnosis."""
        deadline = time.monotonic() + timeout
        while True:
            value = probe()
            if value:
                return value
            self.remember()
            phase = self.phase()
            if while_active and phase in ("Succeeded", "Failed"):
                raise AssertionError(f"the job ended ({phase}) before {what}\n{self.diagnosis()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{self.diagnosis()}")
            time.sleep(1.0)


@pytest.fixture
def job(cluster: Cluster, kube: Kube, testbed: ControlPlaneState, tmp_path: Path) -> Job:
    return Job(kube, Path(testbed.directory), cluster.namespace, "mlp", tmp_path / "checkpoint")


def mean_loss(records: list[dict[str, Any]]) -> float:
    return statistics.fmean(float(r["loss"]) for r in records)


def assert_resumed_from_checkpoints(records: list[dict[str, Any]]) -> None:
    """Every start after the first checkpoint resumes from one: at most ``CHECKPOINT_EVERY`` steps back from
    the furthest step reached, never from 0."""
    furthest = 0
    for record in records:
        if "step" in record:
            furthest = max(furthest, int(record["step"]))
        elif furthest >= CHECKPOINT_EVERY:
            assert record["resume"] > 0, f"restarted from step 0 after reaching step {furthest}: {record}"
            assert record["resume"] >= furthest - CHECKPOINT_EVERY, (furthest, record)


STAGE_1_STEPS = 60
STAGE_2_STEPS = 400
START = 150.0
"""Seconds for the workers to be placed, started (each imports torch: seconds on a busy 2-core machine), meet
and train; also for each resize (a new worker starting, then every worker restarting in a new round)."""


EXAMPLE_SECONDS = 0.1 / 32
"""Compute per example: 0.1 s a step in a world of 3 (32 examples each of the global 96), 0.15 s in a world of
2, 0.3 s in a world of 1."""


BATCH_RANGE = (96, 384)


def test_an_elastic_job_of_two_trains_in_one_world_to_success(job: Job, cluster: Cluster) -> None:
    """With a batch range: the workers train at the batch their advisor chooses (``kubecell.elastic.batch``),
    the same on both ranks, within the range, and what it learned is in the checkpoint."""
    job.create(cluster.node, replicas=2, steps=STAGE_1_STEPS, example_seconds=EXAMPLE_SECONDS, gpus=4,
               vc="speech", batch_size=BATCH_RANGE)  # the node fits 2
    job.wait("the job to succeed", lambda: job.phase() == "Succeeded", START)
    steps = job.steps()
    assert steps, job.diagnosis()
    assert steps[-1]["step"] == STAGE_1_STEPS, job.diagnosis()
    assert steps[-1]["world"] == 2, f"the last steps were not trained by both workers\n{job.diagnosis()}"
    pods = {str(p["metadata"]["name"]): p for p in job.pods()}
    for index in (0, 1):
        name = ej.worker_name(job.name, index)
        assert pods[name]["status"]["phase"] == "Succeeded", job.diagnosis()
        assert "/2 resumes at step" in job.log(name), job.diagnosis()  # its training process was in a world of 2
    first, last = mean_loss(steps[:10]), mean_loss(steps[-10:])
    assert last < 0.5 * first, f"the loss did not go down: first 10 steps {first:.4f}, last 10 {last:.4f}"
    assert_resumed_from_checkpoints(job.records())
    for record in steps:
        assert BATCH_RANGE[0] <= record["batch"] <= BATCH_RANGE[1], record
        assert record["batch"] == record["world"] * record["local"] * record["accumulation"], record
        assert 1.0 <= record["lr_scale"] <= 4.0, record
    saved = torch.load(job.checkpoint / "checkpoint.pt", weights_only=True)["batch_advisor"]
    assert (saved["min"], saved["max"]) == BATCH_RANGE, saved
    assert len(saved["reports"]) >= STAGE_1_STEPS // 2, "rank 0's measurements were learned and kept"
    assert {row[2] for row in saved["reports"]} == {2}, "measured in the world of 2"


def holder(kube: Kube, namespace: str, name: str, node: str, gpus: int, annotations: dict[str, str]) -> None:
    """A pod that holds ``gpus`` GPUs of the node (a process that sleeps) until it is deleted."""
    body = pod_body(namespace, name, {"nvidia.com/gpu": str(gpus)}, annotations=annotations,
                    spec={"nodeSelector": {TEST_NODE: node}, "terminationGracePeriodSeconds": 1})
    body["spec"]["containers"][0]["command"] = ["sleep", "3600"]
    kube.create(f"/api/v1/namespaces/{namespace}/pods", body)


def running(kube: Kube, namespace: str, name: str) -> bool:
    found = kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    return bool(found["status"].get("phase") == "Running")


def target(job: Job) -> int:
    return int(job.kube.get(job.path)["spec"]["replicas"])


def learned(job: Job, cluster: Cluster) -> bool:
    """The scheduler's goodput model of the job has taken a report from the workers, priced on the A100s."""
    uid = str(job.kube.get(job.path)["metadata"]["uid"])
    sized = cluster.scheduler.scheduler.elastic.jobs.get(ElasticRef(job.namespace, job.name, uid))
    return sized is not None and sized.model is not None and sized.model.goodput("A100", 1, 2) > 0


def test_the_scheduler_grows_and_shrinks_the_torchrun_world(job: Job, cluster: Cluster, kube: Kube) -> None:
    """Nobody patches ``/scale`` here: the workers report their steps, kubecell's scheduler raises the target
    when GPUs free up (its goodput model, learned from those reports, says a third worker pays) and lowers it
    when a guaranteed pod of the VC that owns them claims them; the controller follows, torchrun re-forms its
    world each time, and training resumes from the checkpoint with the loss going down."""
    namespace, node = cluster.namespace, cluster.node
    holder(kube, namespace, "blocker", node, 4, {"kubecell.io/vc": "speech", "kubecell.io/opportunistic": "true"})
    job.wait("the blocker to run", lambda: running(kube, namespace, "blocker"), START)
    job.create(node, replicas=2, steps=STAGE_2_STEPS, example_seconds=EXAMPLE_SECONDS, gpus=2, vc="speech")
    job.wait("ten steps in a world of 2", lambda: len(job.steps(world=2)) >= 10, START, while_active=True)
    job.wait("the scheduler's goodput model to learn from the workers' step reports",
             lambda: learned(job, cluster), START, while_active=True)
    assert target(job) == 2, "no room to grow while the blocker holds half the node"

    kube.delete(f"/api/v1/namespaces/{namespace}/pods/blocker", gracePeriodSeconds=0)
    job.wait("the scheduler to raise the target to 3", lambda: target(job) == 3, START, while_active=True)
    job.wait("five steps in a world of 3", lambda: len(job.steps(world=3)) >= 5, START, while_active=True)
    first_of_three = int(job.steps(world=3)[0]["step"])

    holder(kube, namespace, "claim", node, 6, {"kubecell.io/vc": "vision"})
    job.wait("the scheduler to lower the target to 1", lambda: target(job) == 1, START, while_active=True)
    job.wait("the guaranteed pod to run", lambda: running(kube, namespace, "claim"), START, while_active=True)
    job.wait("steps in a world of 1 after the world of 3", lambda: [
        r for r in job.steps(world=1) if r["step"] > first_of_three], START, while_active=True)
    job.wait("the job to succeed", lambda: job.phase() == "Succeeded", START)

    records = job.records()
    steps = [r for r in records if "step" in r]
    assert steps[-1]["step"] == STAGE_2_STEPS, job.diagnosis()
    worlds = [r["world"] for r in steps]
    assert 3 in worlds[worlds.index(2):], "a world of 3 after the world of 2"
    assert 1 in worlds[len(worlds) - worlds[::-1].index(3):], "a world of 1 after the world of 3"
    initial = mean_loss(steps[:10])
    three = [r for r in steps if r["world"] == 3]
    assert mean_loss(three) < 0.5 * initial, f"the world of 3 trained on: {mean_loss(three):.4f} vs {initial:.4f}"
    assert mean_loss(steps[-10:]) < 0.5 * initial, f"the loss went down: {mean_loss(steps[-10:]):.4f} vs {initial:.4f}"
    assert_resumed_from_checkpoints(records)
    resumes = [r for r in records if "resume" in r]
    assert any(r["world"] == 3 and r["resume"] >= 10 for r in resumes), f"the world of 3 resumed: {resumes}"
    reasons = [e["message"] for e in kube.get(f"/api/v1/namespaces/{namespace}/events")["items"]
               if e["involvedObject"].get("name") == job.name and e.get("reason") == "Resize"]
    raised = [m for m in reasons if "2 -> 3" in m]
    assert raised, reasons
    assert "goodput" in raised[0], f"the raise is the goodput model's decision: {reasons}"
    assert "no trusted step reports" not in raised[0], reasons
    recorder = cluster.scheduler.scheduler.recorder
    assert counted(recorder.step_reports, outcome="accepted") >= 1, "the real workers' reports reached the model"
    assert any("3 -> 1" in m and "shrunk" in m for m in reasons), reasons


STAGE_3_STEPS = 200


def test_a_new_template_moves_the_torchrun_world_to_it(job: Job, cluster: Cluster, kube: Kube) -> None:
    """A changed ``spec.template`` (here one more environment variable; in life a new image) replaces both
    workers at once, with their grace period: torchrun's world re-forms from workers made from the new
    template alone, resumes from the checkpoint, and trains to the end; the job counts no restart."""
    job.create(cluster.node, replicas=2, steps=STAGE_3_STEPS, example_seconds=EXAMPLE_SECONDS, gpus=4, vc="speech")
    job.wait("ten steps in a world of 2", lambda: len(job.steps(world=2)) >= 10, START, while_active=True)
    old = {str(p["metadata"]["uid"]) for p in job.pods() if p["metadata"]["labels"].get(ej.LABEL_ROLE) == "worker"}
    assert len(old) == 2, job.diagnosis()
    template = kube.get(job.path)["spec"]["template"]
    template["spec"]["containers"][0]["env"].append({"name": "KUBECELL_TEST_TEMPLATE", "value": "2"})
    changed_at = time.time()
    kube.patch(job.path, {"spec": {"template": template}})

    def renewed() -> bool:
        found = [p for p in job.pods() if p["metadata"]["labels"].get(ej.LABEL_ROLE) == "worker"
                 and not p["metadata"].get("deletionTimestamp")]
        return len(found) == 2 and all(
            str(p["metadata"]["uid"]) not in old and (p.get("status") or {}).get("phase") == "Running"
            and {"name": "KUBECELL_TEST_TEMPLATE", "value": "2"} in p["spec"]["containers"][0]["env"]
            for p in found)

    job.wait("both workers made again from the new template", renewed, START, while_active=True)
    job.wait("the job to succeed", lambda: job.phase() == "Succeeded", START)

    records = job.records()
    steps = [r for r in records if "step" in r]
    assert steps[-1]["step"] == STAGE_3_STEPS, job.diagnosis()
    after = [r for r in records if "resume" in r and r["time"] > changed_at]
    assert any(r["world"] == 2 and r["resume"] >= CHECKPOINT_EVERY for r in after), \
        f"the new workers resumed from the checkpoint in a world of 2: {after}"
    assert_resumed_from_checkpoints(records)
    assert mean_loss(steps[-10:]) < 0.5 * mean_loss(steps[:10]), "the loss went down across the change"
    assert job.status()["restarts"] == 0, "a new template is not a failure"
    reasons = [e.get("reason") for e in kube.get(f"/api/v1/namespaces/{cluster.namespace}/events")["items"]
               if e["involvedObject"].get("name") == job.name]
    assert "TemplateChanged" in reasons, reasons
