"""Numbers beyond what the allocation book can hold are rejected where they enter, with the accepted range.

Before, a node list with ``memory_mib`` of 10^23 (or a cluster YAML with such a ``memoryMiB``) ended in
an ``OverflowError`` traceback from the book, and such pod and job requests were accepted. The limits
are ``kubecell.core.limits``; the cluster YAML case is here too because it reaches the same check
(``make_node``) as the node list. Job-list times are bounded too (``MAX_TRACE_SECONDS``): the dynamic
simulation never ended on a time of 1e300 seconds.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from kubecell.cli.main import main
from kubecell.core.errors import InvalidInputError
from kubecell.core.limits import MAX_CPU_MILLI, MAX_GANG_MEMBERS, MAX_GPU_MEMORY_MIB, MAX_MEMORY_MIB
from kubecell.sim.traces.jobs import MAX_TRACE_SECONDS
from kubecell.sim.traces.openb import load_nodes, load_pods
from kubecell.sim.traces.workloads import load_workloads
from tests.sim.support import NODE_HEADER, POD_HEADER
from tests.support import PCS_HEADER, SIA_HEADER

Writer = Callable[[str, str], Path]

HUGE = 10**23
CLUSTER = """\
nodeGroups:
  - count: 2
    namePrefix: n-
    gpu: {model: V100M32, count: 8}
    cpuMilli: 64000
    memoryMiB: 524288
    rackSize: 2
"""
TENANTS = "virtualClusters:\n  a: {cells: {V100M32x8/node: 1}}\n"


def run_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str | Path) -> str:
    """Run ``kubecell`` as a user does; return its one-line error (after checking it is one)."""
    monkeypatch.setattr(sys, "argv", ["kubecell", *map(str, argv)])
    with pytest.raises(SystemExit) as info:
        main()
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_node_memory_beyond_the_book_stops_the_packing_run(write_csv: Writer, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    nodes = write_csv("nodes.csv", f"{NODE_HEADER}\nnode-a,96000,{HUGE},8,A100\n")
    pods = write_csv("pods.csv", f"{POD_HEADER}\npod-a,4000,8192,1,500,\n")
    line = run_cli(monkeypatch, capsys, "sim", "packing", "--nodes", nodes, "--pods", pods, "--seeds", "1",
                   "--out", tmp_path / "out")
    assert line == (f"error: {nodes}:2: field 'memory_mib': {HUGE} is out of range "
                    f"(accepted: 0..{MAX_MEMORY_MIB})")


@pytest.mark.parametrize(
    ("row", "field", "limit"),
    [
        (f"node-a,{HUGE},393216,8,A100", "cpu_milli", MAX_CPU_MILLI),
        (f"node-a,{MAX_CPU_MILLI + 1},393216,8,A100", "cpu_milli", MAX_CPU_MILLI),
        (f"node-a,96000,{MAX_MEMORY_MIB + 1},8,A100", "memory_mib", MAX_MEMORY_MIB),
        (f"cpu-node,96000,{HUGE},0,", "memory_mib", MAX_MEMORY_MIB),  # checked even on skipped CPU nodes
    ],
)
def test_node_list_amounts_beyond_the_book(write_csv: Writer, row: str, field: str, limit: int) -> None:
    path = write_csv("nodes.csv", f"{NODE_HEADER}\nnode-z,1000,1024,1,T4\n{row}\n")
    with pytest.raises(InvalidInputError) as info:
        load_nodes(path)
    assert str(info.value).startswith(f"{path}:3: field '{field}': ")
    assert str(info.value).endswith(f" is out of range (accepted: 0..{limit})")


def test_node_list_at_the_limits_loads(write_csv: Writer) -> None:
    path = write_csv("nodes.csv", f"{NODE_HEADER}\nnode-a,{MAX_CPU_MILLI},{MAX_MEMORY_MIB},8,A100\n")
    (node,) = load_nodes(path)
    assert (node.cpu_milli, node.memory_mib) == (MAX_CPU_MILLI, MAX_MEMORY_MIB)


@pytest.mark.parametrize(
    ("row", "field", "limit"),
    [
        (f"pod-b,{HUGE},8192,1,500,", "cpu_milli", MAX_CPU_MILLI),
        (f"pod-b,4000,{HUGE},1,500,", "memory_mib", MAX_MEMORY_MIB),
        (f"pod-b,4000,{MAX_MEMORY_MIB + 1},0,0,", "memory_mib", MAX_MEMORY_MIB),
    ],
)
def test_pod_list_requests_beyond_the_book(write_csv: Writer, row: str, field: str, limit: int) -> None:
    path = write_csv("pods.csv", f"{POD_HEADER}\npod-a,4000,8192,1,500,\n{row}\n")
    with pytest.raises(InvalidInputError) as info:
        load_pods(path)
    assert str(info.value).startswith(f"{path}:3: field '{field}': ")
    assert str(info.value).endswith(f" is out of range (accepted: 0..{limit})")


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("trace_a.csv", f"{PCS_HEADER}\n0,0,10,1,0,m\n1,5,10,{HUGE},0,m\n",
         f"field 'num_jobs': '{HUGE}' GPUs is out of range "
         f"(accepted: a whole number of GPUs in 1..{MAX_GANG_MEMBERS})"),
        ("trace_a.csv", f"{PCS_HEADER}\n0,0,10,1,0,m\n1,5,10,{MAX_GANG_MEMBERS + 1}.0,0,m\n",
         f"field 'num_jobs': '{MAX_GANG_MEMBERS + 1}.0' GPUs is out of range"),
        ("workload-1.csv", f"{SIA_HEADER}\nbert-0,0,bert,1,32\nbert-1,5,bert,{HUGE},32\n",
         f"field 'num_replicas': '{HUGE}' replicas is out of range "
         f"(accepted: a whole number of replicas in 1..{MAX_GANG_MEMBERS})"),
    ],
)
def test_job_lists_with_gangs_beyond_the_book(write_csv: Writer, name: str, text: str, message: str) -> None:
    path = write_csv(name, text)
    with pytest.raises(InvalidInputError) as info:
        load_workloads(path)
    assert str(info.value).startswith(f"{path}:3: {message}")
    rejected = load_workloads(path, skip_bad_rows=True).rejected  # a long run can skip the row instead
    assert [r.location for r in rejected] == [f"{path}:3"]


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("trace_a.csv", f"{PCS_HEADER}\n0,0,10,1,0,m\n1,1e300,10,1,0,m\n",
         "field 'submit_time': '1e300' is out of range (accepted: a finite number of seconds >= 0 and <= 315360000)"),
        ("trace_a.csv", f"{PCS_HEADER}\n0,0,10,1,0,m\n1,5,6.4e9,2,0,m\n",
         "field 'service': 6.4e+09 GPU-seconds on 2 GPUs is 3.2e+09 seconds of work "
         "(accepted: at most 315360000 seconds per GPU (10 years))"),
        ("workload-1.csv", f"{SIA_HEADER}\nbert-0,0,bert,1,32\nbert-1,1e300,bert,1,32\n",
         "field 'time': '1e300' is out of range (accepted: a finite number of seconds >= 0 and <= 315360000)"),
    ],
)
def test_job_lists_with_times_the_simulation_would_never_reach(write_csv: Writer, name: str, text: str,
                                                               message: str) -> None:
    """Before, such a row made ``sim dynamic`` sample the cluster every hour until 1e300 seconds: a hang."""
    path = write_csv(name, text)
    with pytest.raises(InvalidInputError) as info:
        load_workloads(path)
    assert str(info.value) == f"{path}:3: {message}"


def test_job_lists_at_the_time_limits_load(write_csv: Writer) -> None:
    longest = MAX_TRACE_SECONDS
    path = write_csv("trace_a.csv", f"{PCS_HEADER}\n0,{longest},{2 * longest},2,0,m\n")
    (job,) = load_workloads(path).jobs
    assert (job.submit_time, job.work) == (longest, longest)


@pytest.mark.parametrize(
    ("replace", "what", "limit"),
    [
        (("memoryMiB: 524288", f"memoryMiB: {HUGE}"), "host memory (MiB)", MAX_MEMORY_MIB),
        (("cpuMilli: 64000", f"cpuMilli: {HUGE}"), "CPU capacity (milli-CPU)", MAX_CPU_MILLI),
        (("count: 8}", f"count: 8, memoryMiB: {HUGE}}}"), "GPU memory (MiB per GPU)", MAX_GPU_MEMORY_MIB),
    ],
)
def test_cluster_yaml_amounts_beyond_the_book(write_csv: Writer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str], replace: tuple[str, str],
                                              what: str, limit: int) -> None:
    cluster = write_csv("cluster.yaml", CLUSTER.replace(*replace))
    tenants = write_csv("tenants.yaml", TENANTS)
    trace = write_csv("trace_a.csv", f"{PCS_HEADER}\n0,0,10,1,0,m\n")
    line = run_cli(monkeypatch, capsys, "sim", "dynamic", "--cluster", cluster, "--tenants", tenants,
                   "--workload", trace, "--out", tmp_path / "out")
    assert line.startswith(f"error: {cluster}:")
    assert line.endswith(f"{what} {HUGE} is out of range (accepted: 0..{limit})")
