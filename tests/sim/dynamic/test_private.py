"""The private-cluster baseline: exactly a VC's guaranteed cells, run alone with FIFO."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import yaml

from kubecell.cli.main import philly_example_paths
from kubecell.core.engine.job import JobSpec
from kubecell.core.model import Request, TopologyLevel
from kubecell.core.tenancy.config import Tenants, resolve_tenants
from kubecell.core.topology import CellForest
from kubecell.inputs.cluster import load_cluster
from kubecell.inputs.tenants import load_tenants
from kubecell.sim.dynamic.private import PRIVATE_OPTIONS, private_nodes, private_tenants, run_private_baseline
from tests.sim.dynamic.support import TINY_CLUSTER, TINY_TENANTS, Writer


def _tiny(write: Writer, tenants: str = TINY_TENANTS) -> tuple[CellForest, Tenants]:
    nodes = load_cluster(write("cluster.yaml", TINY_CLUSTER))
    forest = CellForest(nodes)
    return forest, resolve_tenants(yaml.safe_load(tenants), forest)


def _job(name: str, vc: str, gpus: int, *, members: int = 1, submit: float = 0.0, work: float = 100.0,
         topology: TopologyLevel | None = None) -> JobSpec:
    return JobSpec(name, vc, Request(name, cpu_milli=1000, memory_mib=1024, gpu_count=gpus, gpu_milli=1000),
                   members=members, topology=topology, submit_time=submit, work=work)


def test_philly_private_clusters_match_the_guarantees() -> None:
    cluster, tenants_path = philly_example_paths()
    nodes = load_cluster(cluster)
    forest = CellForest(nodes)
    tenants = load_tenants(tenants_path, forest)
    assert sum(vc.guaranteed_gpus for vc in tenants.vcs) == 512  # every node assigned
    for vc in tenants.vcs:
        private = private_nodes(forest, vc)
        assert sum(n.gpu_count for n in private) == vc.guaranteed_gpus
        assert {(n.gpu_model, n.gpu_count, n.cpu_milli, n.memory_mib) for n in private} == {("P40", 8, 48000, 393216)}
        assert private_tenants(vc.name, private).require(vc.name).guaranteed_gpus == vc.guaranteed_gpus
    mixed = private_nodes(forest, tenants.require("6c71a0"))  # 1 rack + 8 nodes
    racks = Counter(n.rack for n in mixed)
    assert len(mixed) == 16
    assert racks["private-6c71a0-rack-0"] == 8
    assert sorted(racks.values()) == [1] * 8 + [8]  # loose node cells do not share a rack
    assert len({n.name for n in mixed}) == 16


def test_sub_node_and_pinned_cells(write: Writer) -> None:
    forest, tenants = _tiny(write, """\
virtualClusters:
  x: {cells: {V100M32x8/4gpu: 1, V100M32x8/gpu: 2}, pinnedCells: [n-003]}
""")
    vc = tenants.require("x")
    nodes = private_nodes(forest, vc)
    shapes = sorted((n.gpu_count, n.cpu_milli, n.memory_mib, n.nvlink_groups) for n in nodes)
    full = ((0, 1, 2, 3), (4, 5, 6, 7))
    assert shapes == [(1, 8000, 65536, ()), (1, 8000, 65536, ()), (4, 32000, 262144, ()), (8, 64000, 524288, full)]
    assert sum(n.gpu_count for n in nodes) == vc.guaranteed_gpus == 14
    assert {n.gpu_model for n in nodes} == {"V100M32"}
    private = private_tenants("x", nodes)
    assert private.names == ["x"]
    assert private.require("x").guaranteed_gpus == 14


def test_baseline_runs_only_its_vc_fifo(write: Writer) -> None:
    forest, tenants = _tiny(write)
    jobs = [_job("b1", "b", 8), _job("b2", "b", 8, submit=10.0), _job("b3", "b", 8, submit=20.0),
            _job("a1", "a", 8), _job("b-wide", "b", 8, members=2, topology=TopologyLevel.RACK, submit=30.0)]
    baseline = run_private_baseline(forest, tenants, "b", jobs)
    records = baseline.records
    assert set(records) == {"b1", "b2", "b3", "b-wide"}
    assert baseline.gpus == 8
    assert baseline.result.policy == PRIVATE_OPTIONS.name
    assert [records[n].queueing_delay for n in ("b1", "b2", "b3")] == [0.0, 90.0, 180.0]
    assert records["b-wide"].rejected is not None  # 16 GPUs in one rack: more than its private cluster
    assert records["b-wide"].first_start is None


def test_rack_cell_holds_rack_gangs(write: Writer) -> None:
    forest, tenants = _tiny(write)
    jobs = [_job("wide", "a", 8, members=2, topology=TopologyLevel.RACK, work=50.0)]
    baseline = run_private_baseline(forest, tenants, "a", jobs)
    record = baseline.records["wide"]
    assert record.rejected is None
    assert record.queueing_delay == 0.0
    assert record.finish == pytest.approx(50.0)


def test_vc_without_jobs_is_an_empty_run(write: Writer, tmp_path: Path) -> None:
    forest, tenants = _tiny(write)
    baseline = run_private_baseline(forest, tenants, "c", [_job("b1", "b", 8)])
    assert baseline.result.records == []
