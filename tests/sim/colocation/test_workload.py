"""The synthetic sharing workload: seeded, drawn from the given configurations, each job a half-GPU share
carrying its solo profile, arrivals paced to the asked load."""

from __future__ import annotations

import pytest

from kubecell.core.errors import InvalidInputError
from kubecell.core.interference import JobKey, SharedRun, SoloProfile
from kubecell.sim.colocation.workload import WorkloadSpec, controller_as_compute, make_workload, paired_configurations

A = SoloProfile(JobKey("a", batch_size=32), 80.0, 40.0, 2000.4)
B = SoloProfile(JobKey("b"), 60.0, 20.0, 3000.0)
UNPAIRED = SoloProfile(JobKey("c"), 30.0, 10.0, 1000.0)


def test_jobs_are_seeded_half_gpu_shares_of_the_paired_configurations() -> None:
    configurations = paired_configurations([SharedRun((A.key, B.key), (0.7, 0.8))],
                                           {p.key: p for p in (A, B, UNPAIRED)})
    assert configurations == [A, B]
    jobs = make_workload(configurations, WorkloadSpec(jobs=200, seed=3))
    assert jobs == make_workload(configurations, WorkloadSpec(jobs=200, seed=3))
    assert jobs != make_workload(configurations, WorkloadSpec(jobs=200, seed=4))
    assert {job.member.profile for job in jobs} == {A, B}
    assert all(job.member.gpu_milli == 500 and job.member.gpu_count == 1 for job in jobs)
    assert {job.member.gpu_memory_mib for job in jobs if job.member.profile == A} == {2001}
    assert all(120.0 <= job.work <= 24 * 3600.0 for job in jobs)
    submits = [job.submit_time for job in jobs]
    assert submits == sorted(submits)


@pytest.mark.parametrize("load", [0.5, 1.5])
def test_arrivals_offer_the_asked_load(load: float) -> None:
    jobs = make_workload([A], WorkloadSpec(jobs=2000, load=load, gpus=16, seed=1))
    offered = sum(job.work for job in jobs) / (jobs[-1].submit_time * 16)
    assert offered == pytest.approx(load, rel=0.1)


def test_a_run_naming_a_job_without_a_profile_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="no solo profile"):
        paired_configurations([SharedRun((A.key, UNPAIRED.key), (0.7, 0.8))], {A.key: A})


def test_without_a_controller_series_the_rules_see_the_controller_as_busy_as_the_sms() -> None:
    jobs = make_workload([A, B], WorkloadSpec(jobs=20, seed=1))
    seen = controller_as_compute(jobs)
    assert [job.member.profile for job in seen] == [
        SoloProfile(p.key, p.gpu_util, p.gpu_util, p.memory_mib) for p in (job.member.profile for job in jobs) if p]
    assert [(job.name, job.work, job.submit_time, job.member.gpu_milli) for job in seen] == [
        (job.name, job.work, job.submit_time, job.member.gpu_milli) for job in jobs], "the same jobs otherwise"
