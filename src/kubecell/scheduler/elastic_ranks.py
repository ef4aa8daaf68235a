"""Which workers of an ElasticJob a shrink takes: the engine is told each member's worker index.

An ElasticJob's controller keeps workers ``0..target-1``: when the scheduler lowers the target it removes the
highest indices, and replaces any worker below the target that is gone. The engine, left to itself, gives up a
job's newest members, and its newest member is not always the highest worker: a worker the cluster took and
the controller replaced joins last (and a gang's pods were matched to members in name order, so
``worker-10`` came before ``worker-2``). The shrink then evicted, say, worker 0; the controller replaced it and
removed the highest worker too: two workers, two rendezvous rounds, for a shrink of one. So before each cycle
every running ElasticJob's members are ranked by their pods' worker indices (``Engine.rank_members``), and a
shrink takes the highest. Where a preemptor needs a particular member's place (a guarantee's cell on one node),
the place still decides.

The index is read as the controller reads it (the label, which must match the pod's name); a pod whose index
cannot be read is ranked first to go, as an unranked member is.
"""

from __future__ import annotations

from kubecell.core.engine.job import JobPhase, member_index
from kubecell.kube.elasticjobs import worker_index
from kubecell.scheduler.cluster import Mirror
from kubecell.scheduler.tracking import Tracking


def rank_elastic_members(state: Tracking, mirror: Mirror) -> None:
    """Rank every running ElasticJob's members by their workers' indices, where that changed."""
    engine = state.engine
    for name, tracked in state.tracked.items():
        if tracked.elastic is None:
            continue
        job = engine.jobs.get(name)
        if job is None or job.phase != JobPhase.RUNNING or job.spec.heterogeneous:
            continue
        ranks: dict[str, int] = {}
        for member in job.running_members:
            uid = tracked.members.get(member_index(member))
            pod = mirror.pods.get(uid) if uid is not None else None
            index = worker_index(pod, tracked.elastic.name) if pod is not None else None
            if index is not None:
                ranks[member] = index
        if ranks != job.ranks:
            engine.rank_members(name, ranks)
