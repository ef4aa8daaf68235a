"""A small reproduction of the FGD paper's packing result on the real openb trace (traces.md section 3).

Default trace, tune 1.3, three policies; our unallocated GPU % at 130 % arrived must land within one
point of the authors' published 10-seed mean, and keep the paper's order FGD < BestFit < GpuPacking.
"""

from __future__ import annotations

import csv

import pytest

from kubecell.sim.packing.runner import run_grid
from tests.sim.support import openb_file

pytestmark = pytest.mark.shared_data

WORKLOAD = "openb_pod_list_default"
POLICIES = {"fgd": "06-FGD", "bestfit": "05-BestFit", "gpupacking": "04-GpuPacking"}
SEEDS = [42]
TOLERANCE = 1.0  # points of unallocated GPU %; one seed's SD around the 10-seed mean is ~0.1-0.7


def published_unallocated_at_130() -> dict[str, float]:
    path = openb_file("expected_results", "summary_by_workload_policy.csv")
    with path.open(newline="", encoding="utf-8") as handle:
        rows = {row["sc_policy"]: row for row in csv.DictReader(handle) if row["workload"] == WORKLOAD}
    missing = [label for label in POLICIES.values() if label not in rows]
    assert not missing, f"{path} has no {WORKLOAD} row for {missing}"
    return {policy: float(rows[label]["unalloc_pct_mean_at_130"]) for policy, label in POLICIES.items()}


def test_unallocated_gpus_at_130_percent_match_the_published_means() -> None:
    nodes = openb_file("csv", "openb_node_list_gpu_node.csv")
    pods = openb_file("csv", f"{WORKLOAD}.csv")
    published = published_unallocated_at_130()

    summaries = run_grid(nodes, pods, list(POLICIES), SEEDS)
    ours = {s.policy: s.at("unallocated_pct", 130).mean for s in summaries}

    report = ", ".join(f"{p}: ours {ours[p]:.2f} vs published {published[p]:.2f}" for p in POLICIES)
    for policy in POLICIES:
        assert abs(ours[policy] - published[policy]) <= TOLERANCE, report
    assert ours["fgd"] < ours["bestfit"] < ours["gpupacking"], report
    for summary in summaries:  # below saturation every policy places everything that arrives
        assert summary.at("allocated_pct", 50).mean == pytest.approx(50.0, abs=0.5), summary.policy
