"""Whether a record on a pod not bound yet is a decision kubecell would carry out now (after a restart).

A gang's records are all written before its first Binding, so a scheduler that stopped in between leaves records on
pods nobody bound. Each is a claim, not a fact: it is rolled forward only if every record of the decision exists,
its nodes are ones kubecell places on and the pods may use (their GPU models too: the engine adopts what a record
names without asking) and can isolate as asked, its VC exists, and the engine, holding it, grants the class the
record claims within the VC's guarantee or borrowing limit. Split from ``restore`` (which reads, believes and adopts
records) because these are plain questions to the engine and the views.
"""

from __future__ import annotations

from collections.abc import Sequence

from kubecell.core.engine.job import Job, JobClass
from kubecell.core.errors import InvalidInputError
from kubecell.kube.records import AllocationRecord
from kubecell.scheduler.intake import Intake, isolation_nodes
from kubecell.scheduler.restore_members import Member
from kubecell.scheduler.tracking import Tracking

__all__ = ["class_refused", "why_not_forward"]


def why_not_forward(state: Tracking, intake: Intake, members: Sequence[Member],
                    unbound: Sequence[Member]) -> str | None:
    """Why the unbound members' records are not a decision kubecell would carry out now, or None."""
    batch = max(m.record.batch for m in members)
    if len(members) < batch:
        return f"only {len(members)} of the decision's {batch} records exist"
    engine = state.engine
    vc = unbound[0].record.vc
    if engine.tenants.get(vc) is None:
        return f"virtual cluster {vc!r} does not exist"
    for member in unbound:
        node = member.record.node
        view = state.views.get(node)
        if view is None or view.node is None or node not in engine.book.index:
            return f"node {node} is not one kubecell places on"
        if view.excluded:
            return f"node {node} is {view.excluded}"
        try:
            allowed, _ = intake.allowed_nodes(state, [member.pod])
        except InvalidInputError as error:
            return str(error)
        if allowed is not None and node not in allowed:
            return f"the pod's node constraints do not allow node {node}"
        models = member.demand.request.gpu_models
        model = engine.book.nodes[engine.book.index[node]].gpu_model
        if member.record.gpus and models is not None and model not in models:
            return f"node {node}'s GPUs ({model}) are not a model the pod allows"
        if member.demand.request.wants_gpu:
            able, _ = isolation_nodes(state.views, member.demand.isolation)
            if able is not None and node not in able:
                return f"node {node} cannot isolate by {member.demand.isolation}"
    return None


def class_refused(state: Tracking, job: Job, record: AllocationRecord) -> str | None:
    """Why the engine would not have granted the class a rolled-forward record claims, or None."""
    engine = state.engine
    granted = job.job_class.value if job.job_class is not None else "?"
    if granted != record.job_class:
        return f"it claims class {record.job_class} but the engine grants {granted}"
    vc = engine.tenants.get(job.vc)
    if vc is None:
        return f"virtual cluster {job.vc!r} does not exist"
    usage = engine.usage.get(job.vc)
    if job.job_class == JobClass.BORROWED and usage is not None and vc.borrow_limit_milli is not None \
            and usage.borrowed_milli > vc.borrow_limit_milli:
        return f"VC {vc.name} would borrow {usage.borrowed_milli / 1000:g} GPUs, beyond its limit"
    if job.job_class == JobClass.GUARANTEED and engine.session.guarantee_room(vc) < 0:
        return f"VC {vc.name}'s guarantee has no room for it"
    return None
