"""The policy measured in the simulator is the policy that runs: the packing experiment replayed as real
Pods through ``kubecell scheduler`` on its own testbed gives the simulator's figures."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kubecell.cli.main import app, example_paths
from kubecell.kube.rest import Kube
from kubecell.scheduler.scheduler import Scheduler
from kubecell.sim.packing.experiment import run_packing
from kubecell.sim.packing.metrics import curves_of
from kubecell.sim.traces.openb import load_nodes, load_pods
from kubecell.testbed.control_plane import ControlPlaneState
from kubecell.testbed.replay import plan, replay


@pytest.mark.parametrize("placement", ["fgd", "kubecell"])
def test_replay_on_the_cluster_matches_the_simulator(example_kube: Kube, placement: str) -> None:
    nodes_csv, pods_csv = example_paths()
    nodes, pods = load_nodes(nodes_csv), load_pods(pods_csv)
    run = plan(nodes, pods, seed=42)
    scheduler = Scheduler(example_kube, run.scheduler_options(placement))
    thread = threading.Thread(target=scheduler.run, daemon=True)
    thread.start()
    namespace = f"replay-{placement}"
    example_kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                  "metadata": {"name": namespace}})
    try:
        assert scheduler.ready.wait(60)
        real = replay(example_kube, run, namespace=namespace)
    finally:
        scheduler.shutdown()
        thread.join(timeout=10)
        example_kube.delete(f"/api/v1/namespaces/{namespace}/pods")
    simulated = run_packing(nodes, pods, placement, 42)
    assert real.failed == simulated.failed
    assert np.array_equal(real.allocated, simulated.allocated), "the same pods must be placed, in the same order"
    real_curve, sim_curve = curves_of(real), curves_of(simulated)
    assert np.allclose(real_curve.unallocated_pct, sim_curve.unallocated_pct, atol=0.5, equal_nan=True)


def test_the_replay_command_reports_cluster_and_simulator_side_by_side(
        example_state: ControlPlaneState, tmp_path: Path) -> None:
    nodes_csv, pods_csv = example_paths()
    result = CliRunner().invoke(app, ["replay", "--kubeconfig", example_state.admin_kubeconfig, "--nodes",
                                      str(nodes_csv), "--pods", str(pods_csv), "--placement", "bestfit", "--seed", "7",
                                      "--namespace", "replay-cli", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["cluster"] == summary["simulator"]
    assert summary["pods_per_second"] > 0
