"""What a running pod's owner can still change before a scheduler restarts, and what it cannot win by it.

Its owner may edit the pod's annotations (GPU models, gang topology) and resize its CPU in place; the admission
policy keeps only the allocation record from them. Before (found by a hostile review), each of these made the
restore of a running borrowed pod or gang fail, and the pod was then held as another scheduler's (never evicted,
charged to no VC): one edit before a restart made borrowed work unreclaimable. Now what runs is restored as it was
placed (the models and CPU its record holds), and a gang its pods no longer make runs on as opportunistic pods
alone. In each case the lender VC's guaranteed pod takes its GPUs back. Without a cluster, as
``test_gang_generations``."""

from __future__ import annotations

import pytest

from kubecell.core.engine.job import JobClass, JobPhase
from kubecell.scheduler.intake import Intake
from kubecell.scheduler.restore import Restorer
from kubecell.scheduler.teller import Teller
from kubecell.scheduler.tracking import Tracking
from tests.core.support import engine, make_nodes
from tests.scheduler.test_job_names import pending
from tests.scheduler.test_shrink_pods import Loop

VCS = {"b": {"gpus": 8}, "c": {"gpus": 8}}
LATER = 4.0e9
"""Past every minimum run time (the records are dated now): borrowed work may be reclaimed."""


def restart(loop: Loop) -> Tracking:
    """A new scheduler process rebuilt from the pods, as ``Scheduler.rebuild`` does it."""
    state = Tracking(engine(make_nodes(2), VCS), loop.state.views)
    intake = Intake(loop.mirror, Teller(loop.actions, quiet=True),  # type: ignore[arg-type]
                    scheduler_name="kubecell", default_vc="b")
    Restorer(loop.mirror, loop.actions, intake, loop.binder.gate,  # type: ignore[arg-type]
             frozenset({"kubecell"})).restore(state)
    loop.state, loop.intake = state, intake
    intake.reconcile(state, dict.fromkeys(loop.mirror.pods), False, 10.0)
    return state


def borrowed(loop: Loop, *names: str, annotations: dict[str, str]) -> None:
    """VC b's pods (8 GPUs each) placed past b's guarantee of 8 GPUs: they borrow VC c's node (a pod alone after
    another of b's, a gang of two at once)."""
    if len(names) == 1:
        loop.add(pending("g", "uid-g", {"kubecell.io/vc": "b"}))
        loop.cycle(1)
    loop.add(*(pending(name, f"uid-{name}", annotations) for name in names))
    loop.cycle(2)
    for name in names:
        assert loop.state.engine.jobs[loop.state.pod_job[f"uid-{name}"]].job_class == JobClass.BORROWED


def reclaimed(loop: Loop, state: Tracking) -> set[str]:
    """Who VC c's guaranteed pod evicts to take its GPUs back."""
    loop.add(pending("c0", "uid-c0", {"kubecell.io/vc": "c"}))
    victims = loop.cycle(LATER)
    assert state.engine.jobs[state.pod_job["uid-c0"]].phase == JobPhase.RUNNING
    state.engine.check_invariants()
    return set(victims)


@pytest.mark.parametrize("edit", ["gpu-models", "cpu"])
def test_a_pod_alone_edited_before_a_restart_is_restored_as_placed(edit: str) -> None:
    loop = Loop(engine(make_nodes(2), VCS))
    borrowed(loop, "p", annotations={"kubecell.io/vc": "b"})
    pod = loop.mirror.pods["uid-p"]
    if edit == "gpu-models":
        pod["metadata"]["annotations"]["kubecell.io/gpu-models"] = "A100"  # the node's are not
    else:
        pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "100000"  # resized past the node
    state = restart(loop)
    assert "uid-p" not in state.external
    assert state.engine.jobs[state.pod_job["uid-p"]].job_class == JobClass.BORROWED
    assert reclaimed(loop, state) == {"uid-p"}


def test_a_gang_its_pods_no_longer_make_runs_on_as_opportunistic_pods_alone() -> None:
    """Its owner gives its two pods different gang topologies, which no job can be: each runs on alone, as
    opportunistic work (told so), and the lender needs evict only one of them for its 8 GPUs."""
    loop = Loop(engine(make_nodes(2), VCS))
    gang = {"kubecell.io/group": "a", "kubecell.io/group-size": "2", "kubecell.io/vc": "b"}
    borrowed(loop, "a-0", "a-1", annotations=gang)
    loop.mirror.pods["uid-a-0"]["metadata"]["annotations"]["kubecell.io/topology"] = "rack"
    loop.mirror.pods["uid-a-1"]["metadata"]["annotations"]["kubecell.io/topology"] = "zone"
    state = restart(loop)
    assert not state.external
    for name in ("a-0", "a-1"):
        job = state.engine.jobs[state.pod_job[f"uid-{name}"]]
        assert (job.name, job.job_class) == (f"ns/{name}@uid-{name}", JobClass.OPPORTUNISTIC)
        assert "cannot be restored as job 'ns/a#1'" in loop.intake.record_warnings[f"uid-{name}"]
    assert len(reclaimed(loop, state)) == 1
