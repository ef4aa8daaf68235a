"""The worker contract against real torchrun: the rendezvous host program and exactly the environment
``kubecell.kube.elasticjobs`` gives a worker, with three agents on loopback (the Service name and the Pod IP,
which only a cluster resolves, become 127.0.0.1; nothing else changes).

Needs a Python with PyTorch, which the project does not install (it is a GPU framework of several GB):
``KUBECELL_TORCH_PYTHON=/path/to/python`` runs these tests, else they are skipped with that message. About
two minutes: torchrun waits its own ``last_call`` (30 s) in every round."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubecell.kube import elasticjob_objects as objects
from kubecell.kube import elasticjobs as ej

TORCH_PYTHON = os.environ.get("KUBECELL_TORCH_PYTHON", "")
pytestmark = pytest.mark.skipif(not TORCH_PYTHON, reason="set KUBECELL_TORCH_PYTHON to a Python with PyTorch to "
                                                         "check the torchrun contract")

TRAIN = """\
import os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
index = os.environ["KUBECELL_WORKER_INDEX"]
print(f"worker {index} joined a world of {dist.get_world_size()}", flush=True)
crash = os.environ.get("CRASH_WORKER") == index
for step in range(int(os.environ["STEPS"])):
    if crash and step == 3:
        sys.exit(3)
    value = torch.ones(1)
    dist.all_reduce(value)
    time.sleep(0.5)
print(f"worker {index} done", flush=True)
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Cluster:
    """The rendezvous host and torchrun agents as local processes."""

    def __init__(self, directory: Path, port: int) -> None:
        self.directory = directory
        (directory / "train.py").write_text(TRAIN)
        obj = {"metadata": {"name": "bert", "namespace": "t", "uid": "contract"},
               "spec": {"minReplicas": 1, "maxReplicas": 3, "replicas": 3, "rendezvousPort": port, "maxRestarts": 1,
                        "template": {"spec": {"containers": [{"name": "t", "image": "i"}]}}}}
        self.spec = ej.read_elastic_job(obj)
        self.processes: list[subprocess.Popen[bytes]] = []
        env = {**os.environ, "KUBECELL_RDZV_PORT": str(port)}
        self.host = self._start([TORCH_PYTHON, "-c", objects.RENDEZVOUS_SCRIPT], env, "host")

    def _start(self, command: list[str], env: dict[str, str], log: str) -> subprocess.Popen[bytes]:
        with open(self.directory / f"{log}.log", "wb") as out:
            process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=self.directory,
                                       start_new_session=True)
        self.processes.append(process)
        return process

    def agent(self, index: int, log: str, *, run: int = 0, steps: int = 200,
              crash: int | None = None) -> subprocess.Popen[bytes]:
        env = {**os.environ, "STEPS": str(steps), "CRASH_WORKER": "" if crash is None else str(crash)}
        for entry in objects.worker_env(self.spec, index, run):
            value = entry.get("value")
            if entry["name"] == "PET_LOCAL_ADDR":  # the Pod IP, from the Downward API in a cluster
                value = "127.0.0.1"
            elif entry["name"] == "PET_RDZV_ENDPOINT":  # the Service name, resolved by the cluster's DNS
                value = str(value).replace(ej.rendezvous_name("bert"), "127.0.0.1")
            env[entry["name"]] = str(value)
        return self._start([TORCH_PYTHON, "-m", "torch.distributed.run", "train.py"], env, log)

    def log(self, name: str) -> str:
        return (self.directory / f"{name}.log").read_text(errors="replace")

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                with_tree(process.pid, signal.SIGKILL)


def with_tree(pid: int, sig: signal.Signals) -> None:
    """Signal a process and every descendant (torchrun starts its workers in sessions of their own): what the
    kubelet does to every process of a lost Pod."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(stat[1]), []).append(int(entry))
    todo = [pid]
    while todo:
        current = todo.pop()
        todo.extend(children.get(current, []))
        with contextlib.suppress(ProcessLookupError):
            os.kill(current, sig)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(tmp_path, free_port())
    time.sleep(3)
    assert "serving on port" in running.log("host"), running.log("host")
    try:
        yield running
    finally:
        running.close()


def test_losing_worker_0_leaves_the_rendezvous_to_the_others(cluster: Cluster) -> None:
    agents = {index: cluster.agent(index, f"w{index}") for index in range(3)}
    deadline = time.monotonic() + 90
    while "a world of 3" not in cluster.log("w1") and time.monotonic() < deadline:
        time.sleep(1)
    assert "a world of 3" in cluster.log("w1"), cluster.log("w1")
    time.sleep(5)
    with_tree(agents[0].pid, signal.SIGKILL)  # worker 0, the first, lost with its whole Pod
    deadline = time.monotonic() + 120
    while "a world of 2" not in cluster.log("w1") and time.monotonic() < deadline:
        time.sleep(1)
    assert "a world of 2" in cluster.log("w1"), cluster.log("w1")
    replacement = cluster.agent(0, "w0-again")
    for process in (agents[1], agents[2], replacement):
        assert process.wait(timeout=300) == 0
    assert "a world of 3" in cluster.log("w0-again")
    assert cluster.log("w1").count("a world of 3") == 2, "the survivors took the replacement back"
    assert cluster.host.poll() is None, "the rendezvous host outlives every worker"


def test_a_run_closed_by_a_failed_agent_needs_a_new_run(cluster: Cluster) -> None:
    # maxRestarts 1: worker 1 crashes twice, its agent gives up and closes run 0 for everyone
    first = [cluster.agent(0, "r0-w0", steps=40), cluster.agent(1, "r0-w1", steps=40, crash=1)]
    assert [process.wait(timeout=300) for process in first] == [1, 1]
    same = cluster.agent(1, "r0-again", steps=10)
    assert same.wait(timeout=120) == 1
    assert "RendezvousClosedError" in cluster.log("r0-again")
    fresh = [cluster.agent(0, "r1-w0", run=1, steps=10), cluster.agent(1, "r1-w1", run=1, steps=10)]
    assert [process.wait(timeout=300) for process in fresh] == [0, 0]
