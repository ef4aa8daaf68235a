"""Data-backed sanity check: two days of two Philly VCs through the kubecell policy on the bundled cluster."""

from __future__ import annotations

import json

import pytest

from kubecell.cli.main import philly_example_paths
from kubecell.sim.dynamic.runner import load_inputs, run_dynamic
from tests.sim.dynamic.support import PHILLY, philly_trace

PREFERRED_VCS = ("51b7ef", "ed69ec", "103959", "7f04ca", "6c71a0", "11cb48", "6214e9")


@pytest.mark.shared_data
def test_two_days_of_two_vcs_under_kubecell() -> None:
    present = [vc for vc in PREFERRED_VCS if (PHILLY / f"trace_{vc}.csv").is_file()]
    if len(present) < 2:
        pytest.skip(f"need two Philly PCS traces of {', '.join(PREFERRED_VCS)} in {PHILLY}; found {present}")
    files = [philly_trace(vc) for vc in present[:2]]
    cluster, tenants = philly_example_paths()
    inputs = load_inputs(cluster, tenants, files, days=2)
    assert inputs.jobs, "no jobs in the first two days"
    assert inputs.unknown_vcs == {}
    run = run_dynamic(inputs, ["kubecell"])
    result = run.results[0]

    assert result.gangs_broken == 0
    assert 0 < result.utilisation <= 1
    assert len(result.records) == len(inputs.jobs)
    specs = {job.name: job for job in inputs.jobs}
    for record in result.records:
        spec = specs[record.name]
        assert record.vc == spec.vc
        assert record.gpus == spec.total_gpu_milli / 1000
        assert record.members == spec.members
        assert record.submit == spec.submit_time < 2 * 86_400
        assert record.rejected is None, record.rejected
        assert record.first_start is not None
        assert record.first_start >= record.submit
        assert record.finish is not None  # no horizon: every accepted job finishes
        assert record.finish >= record.first_start + spec.work - 1e-6
        assert record.first_class in ("guaranteed", "borrowed")
        assert record.preemptions >= 0
        assert record.lost_gpu_seconds >= 0
        assert record.failures == 0
    for sample in result.samples:
        assert 0 <= sample.allocated_milli <= result.total_gpus * 1000
        for vc, (used, borrowed, opportunistic) in sample.per_vc.items():
            assert 0 <= used <= result.guaranteed_gpus[vc]
            assert borrowed >= 0
            assert opportunistic >= 0

    metrics = run.metrics[0].as_dict()
    json.dumps(metrics, allow_nan=False)
    assert metrics["overall"]["jobs"] == len(inputs.jobs)
    assert metrics["overall"]["unfinished"] == 0
    for vc in present[:2]:
        assert vc in run.baselines
        assert metrics["per_vc"][vc]["anomaly_jobs_compared"] > 0
        assert metrics["per_vc"][vc]["sharing_anomaly_minutes"] is not None
