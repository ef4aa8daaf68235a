"""MPS control daemons per GPU, against a fake ``nvidia-cuda-mps-control``: a shell script that records each
invocation with its environment, forks a "daemon" on ``-d`` (found in /proc like the real one), and makes
it leave when a control client writes ``quit``."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kubecell.kube.names import ANNOTATION_ALLOCATION
from kubecell.node.fake_nvml import FakeNvml
from kubecell.node.isolation import NodeIsolation
from kubecell.node.mps import MpsDaemons, MpsError, mps_holders

GPU0 = "GPU-00000000-0000-0000-0000-000000000000"
GPU1 = "GPU-11111111-1111-1111-1111-111111111111"

FAKE_CONTROL = """#!/bin/sh
# A stand-in for nvidia-cuda-mps-control: records its invocations, runs a daemon until "quit".
record="{record}"
if [ "$1" = "-d" ]; then
  echo "start $CUDA_VISIBLE_DEVICES $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY" >> "$record"
  if [ -e "{fail}" ]; then echo "An instance of this daemon is already running" >&2; exit 1; fi
  rm -f "$CUDA_MPS_PIPE_DIRECTORY/quit"
  (
    while [ -e "{deaf}" ] || [ ! -e "$CUDA_MPS_PIPE_DIRECTORY/quit" ]; do sleep 0.05; done
    rm -f "$CUDA_MPS_PIPE_DIRECTORY/quit" "$CUDA_MPS_PIPE_DIRECTORY/fake.pid"
  ) </dev/null >/dev/null 2>&1 &
  echo $! > "$CUDA_MPS_PIPE_DIRECTORY/fake.pid"
  exit 0
fi
read command
echo "$command $CUDA_VISIBLE_DEVICES $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY" >> "$record"
if [ "$command" = quit ] && [ -e "$CUDA_MPS_PIPE_DIRECTORY/fake.pid" ]; then
  touch "$CUDA_MPS_PIPE_DIRECTORY/quit"
  exit 0
fi
echo "Cannot find MPS control daemon process" >&2
exit 1
"""


@dataclass
class Fake:
    """The fake binary, its invocation record, and switches that make it fail or ignore quit."""

    binary: Path
    record: Path
    fail: Path
    deaf: Path
    root: Path

    def calls(self) -> list[list[str]]:
        return [line.split() for line in self.record.read_text().splitlines()] if self.record.exists() else []

    def daemons(self, **options: Any) -> MpsDaemons:
        return MpsDaemons(NodeIsolation(("accounting", "mps"), mps_root=self.root), binary=self.binary,
                          real_gpus=True, timeout=5.0, **options)

    def pid(self, uuid: str) -> int:
        return int((self.root / uuid / "pipe" / "fake.pid").read_text())


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[Fake]:
    directory = tmp_path / "bin"
    directory.mkdir()
    binary = directory / "nvidia-cuda-mps-control"
    made = Fake(binary, tmp_path / "calls.log", tmp_path / "fail", tmp_path / "deaf", tmp_path / "mps")
    binary.write_text(FAKE_CONTROL.format(record=made.record, fail=made.fail, deaf=made.deaf))
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    try:
        yield made
    finally:  # the fake daemons this test started, by their recorded pid
        for pid_file in made.root.glob("*/pipe/fake.pid"):
            with contextlib.suppress(ValueError, ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_available_needs_the_binary_and_real_gpus(fake: Fake, tmp_path: Path) -> None:
    isolation = NodeIsolation(mps_root=tmp_path)
    assert MpsDaemons(isolation, binary=fake.binary, real_gpus=True).available()
    assert not MpsDaemons(isolation, binary=tmp_path / "missing", real_gpus=True).available()
    assert not MpsDaemons(isolation, binary="no-such-mps-control-here", real_gpus=True).available()
    backend = FakeNvml.from_text("gpus: [{product: NVIDIA A100-SXM4-40GB}]")
    assert not MpsDaemons.for_backend(isolation, backend, binary=fake.binary).available()


def test_a_daemon_per_gpu_started_by_the_first_holder_and_stopped_after_the_last(fake: Fake) -> None:
    daemons = fake.daemons()
    daemons.acquire(GPU0, "pod-a-0")
    daemons.acquire(GPU0, "pod-a-0")  # the same allocation again: one hold
    daemons.acquire(GPU0, "pod-b-0")
    assert daemons.running(GPU0)
    assert daemons.starts == 1
    pipe, log_dir = fake.root / GPU0 / "pipe", fake.root / GPU0 / "log"
    assert fake.calls() == [["start", GPU0, str(pipe), str(log_dir)]]
    assert pipe.is_dir()
    assert log_dir.is_dir()
    assert daemons.daemon_pids(GPU0) == [fake.pid(GPU0)]

    daemons.acquire(GPU1, "pod-c-0")
    assert daemons.running(GPU1)
    assert daemons.daemon_pids(GPU0) != daemons.daemon_pids(GPU1)

    daemons.release(GPU0, "pod-a-0")
    assert daemons.running(GPU0), "pod-b still holds GPU 0"
    daemons.release(GPU0, "pod-b-0")
    assert not daemons.running(GPU0)
    assert fake.calls()[-1] == ["quit", GPU0, str(pipe), str(log_dir)]
    assert daemons.running(GPU1), "GPU 1's daemon is another's"
    daemons.release(GPU0, "pod-b-0")  # idempotent
    daemons.release(GPU1, "never-held")
    assert daemons.running(GPU1)
    daemons.stop_all()
    assert not daemons.running(GPU1)
    assert [call[0] for call in fake.calls()].count("quit") == 2


def test_a_daemon_that_died_is_started_again_on_next_use(fake: Fake) -> None:
    daemons = fake.daemons()
    daemons.acquire(GPU0, "pod-a-0")
    os.kill(fake.pid(GPU0), signal.SIGKILL)
    # SIGKILL reaches another process asynchronously: wait (bounded) until it has died
    deadline = time.monotonic() + 5.0
    while daemons.running(GPU0) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not daemons.running(GPU0)
    daemons.acquire(GPU0, "pod-b-0")
    assert daemons.running(GPU0)
    assert daemons.starts == 2
    assert daemons.holders[GPU0] == {"pod-a-0", "pod-b-0"}


def test_a_daemon_that_will_not_start_is_a_clear_error_and_no_hold(fake: Fake) -> None:
    fake.fail.touch()
    daemons = fake.daemons()
    with pytest.raises(MpsError, match=rf"GPU {GPU0}: .* -d exited with 1: An instance of this daemon"):
        daemons.acquire(GPU0, "pod-a-0")
    assert GPU0 not in daemons.holders


def test_missing_binary_fake_gpus_and_bad_uuids_are_refused(fake: Fake, tmp_path: Path) -> None:
    isolation = NodeIsolation(mps_root=tmp_path / "mps")
    with pytest.raises(MpsError, match="is not installed"):
        MpsDaemons(isolation, binary=tmp_path / "missing").acquire(GPU0, "a")
    with pytest.raises(MpsError, match="fake GPU backend"):
        MpsDaemons(isolation, binary=fake.binary, real_gpus=False).acquire(GPU0, "a")
    with pytest.raises(MpsError, match="is not a GPU UUID"):
        fake.daemons().acquire("../../etc", "a")
    assert fake.calls() == []


def test_a_daemon_that_ignores_quit_is_terminated(fake: Fake) -> None:
    daemons = fake.daemons()
    daemons.timeout = 1.0
    daemons.acquire(GPU0, "pod-a-0")
    fake.deaf.touch()
    daemons.release(GPU0, "pod-a-0")
    assert not daemons.running(GPU0)


def pod(name: str, uid: str, isolation: str, gpu: str, *, node: str = "n1", phase: str = "Running") -> dict[str, Any]:
    record = {"schema": "kubecell.io/allocation/v1", "allocationId": f"{uid}-0", "podUID": uid, "attempt": 0,
              "node": node, "gpus": [{"index": 0, "uuid": gpu, "milli": 500, "memoryMiB": 1000}], "cpuMilli": 0,
              "memoryMiB": 0, "isolation": isolation, "job": "j", "vc": "default", "class": "borrowed", "member": 0,
              "batch": 1, "scheduler": "test", "createdAt": "2026-11-23T00:00:00Z"}
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid,
                         "annotations": {ANNOTATION_ALLOCATION: json.dumps(record)}},
            "spec": {"nodeName": node}, "status": {"phase": phase}}


def test_holders_come_from_the_mps_records_of_the_nodes_running_pods() -> None:
    listed = [pod("a", "u-a", "mps", GPU0), pod("b", "u-b", "mps", GPU0), pod("c", "u-c", "accounting", GPU1),
              pod("d", "u-d", "mps", GPU1, phase="Succeeded"), pod("e", "u-e", "mps", GPU1, node="n2"),
              {"metadata": {"name": "f", "namespace": "ns", "uid": "u-f",
                            "annotations": {ANNOTATION_ALLOCATION: "{corrupt"}}, "spec": {"nodeName": "n1"}}]
    assert mps_holders(listed, "n1") == {GPU0: {"u-a-0", "u-b-0"}}


def test_reconcile_starts_what_is_held_and_stops_what_a_previous_agent_left(fake: Fake) -> None:
    before = fake.daemons()
    before.acquire(GPU1, "gone-0")  # an agent that then restarted: nobody holds GPU 1 any more
    daemons = fake.daemons()
    assert daemons.reconcile({GPU0: {"u-a-0"}}) == []
    assert daemons.running(GPU0)
    assert not daemons.running(GPU1)
    assert daemons.reconcile({GPU0: {"u-a-0"}}) == []
    assert daemons.starts == 1
    assert daemons.reconcile({GPU0: set()}) == []
    assert not daemons.running(GPU0)
    assert daemons.holders == {}


def test_a_hold_taken_while_the_pods_were_read_is_not_stopped_under_its_pod(fake: Fake) -> None:
    """The housekeeping lists the node's pods, then reconciles: a pod admitted (or a claim prepared) in between was
    not in the list, and its daemon was stopped under it (it ran without its limits until the next pass)."""
    daemons = fake.daemons()
    daemons.acquire(GPU1, "old-0")
    token = daemons.token()  # the housekeeping begins to read the pods
    daemons.acquire(GPU0, "new-0")  # admitted meanwhile: not in what it reads
    assert daemons.reconcile({}, since=token) == []
    assert daemons.running(GPU0)
    assert daemons.holders == {GPU0: {"new-0"}}
    assert not daemons.running(GPU1), "a hold taken before the read is as the read says: nobody's"
    assert daemons.reconcile({}, since=daemons.token()) == []  # the next read has it, or it is gone
    assert not daemons.running(GPU0)


def test_a_process_the_daemon_forked_is_not_a_second_daemon(fake: Fake, tmp_path: Path) -> None:
    """Between fork and exec a child has its parent's command line and environment (the fake's ``sleep``, the
    real daemon's server): it is the same daemon, not someone else's second one."""
    proc = tmp_path / "proc"
    daemons = fake.daemons(proc_root=proc)
    pipe, _ = daemons.isolation.mps_dirs(GPU0)
    for pid, parent in ((4100, 1), (4101, 4100), (4200, 1)):
        entry = proc / str(pid)
        entry.mkdir(parents=True)
        (entry / "cmdline").write_bytes(b"\0".join([b"/bin/sh", str(fake.binary).encode(), b"-d", b""]))
        (entry / "environ").write_bytes(f"CUDA_MPS_PIPE_DIRECTORY={pipe}\0".encode())
        (entry / "stat").write_text(f"{pid} (sh) S {parent} {pid} {pid} 0 -1 4194560")
    assert daemons.daemon_pids(GPU0) == [4100, 4200], "the forked child is left out; an unrelated one is not"


def test_a_record_naming_gpus_the_node_does_not_have_holds_no_daemon() -> None:
    """A user can bind a pod to the node by hand and write its record (the pod need not ask for a GPU, so the
    allocator never sees it): each GPU UUID it names made the housekeeping start an MPS control daemon, as
    many daemons (and directories under the MPS root) as such pods name UUIDs. Only the node's GPUs are held."""
    listed = [pod("a", "u-a", "mps", GPU0), pod("x", "u-x", "mps", "GPU-made-up-1"),
              pod("y", "u-y", "mps", "GPU-made-up-2")]
    assert mps_holders(listed, "n1", gpus={GPU0, GPU1}) == {GPU0: {"u-a-0"}}
    assert mps_holders(listed, "n1") == {GPU0: {"u-a-0"}, "GPU-made-up-1": {"u-x-0"}, "GPU-made-up-2": {"u-y-0"}}, \
        "before the GPUs are known, every record is kept (the daemons of running pods stay)"
