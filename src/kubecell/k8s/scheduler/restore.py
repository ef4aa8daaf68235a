"""Rebuilding the engine's running work from the allocation records on the pods (after a start or a rebuild).

The records are the truth: every pod with one is restored as the job it belongs to. A gang whose records
were not all written before a crash (fewer records than its ``batch``) is rolled back: its unbound
records are removed. One whose records all exist is bound the rest of the way. Pods bound but not yet
acknowledged on a node served by kubecell's device plugin hold that node's gate again.
"""

from __future__ import annotations

import logging
from typing import Any

from kubecell.core.engine.job import JobClass
from kubecell.core.engine.restore import RunningMember
from kubecell.core.errors import InvalidInputError
from kubecell.k8s.dialects import DemandError, pod_demand
from kubecell.k8s.records import AllocationRecord, RecordError
from kubecell.k8s.scheduler import pods
from kubecell.k8s.scheduler.actions import Actions, retry
from kubecell.k8s.scheduler.cluster import Mirror
from kubecell.k8s.scheduler.gate import NodeGate
from kubecell.k8s.scheduler.intake import Intake
from kubecell.k8s.scheduler.jobs import Tracked, job_spec
from kubecell.k8s.scheduler.tracking import Tracking

log = logging.getLogger("kubecell.scheduler")


class Restorer:
    """Restores a new engine's running jobs from the pods' records."""

    def __init__(self, mirror: Mirror, actions: Actions, intake: Intake, gate: NodeGate, names: frozenset[str]) -> None:
        self.mirror = mirror
        self.actions = actions
        self.intake = intake
        self.gate = gate
        self.names = names

    def restore(self, state: Tracking) -> None:
        """Running work first: every pod with a record is restored (a gang whose records were not all
        written before a crash is rolled back; one whose records all exist is bound the rest of the way)."""
        by_job: dict[str, list[tuple[dict[str, Any], AllocationRecord]]] = {}
        for pod in self.mirror.pods.values():
            if not pods.ours(pod, self.names) or pods.is_done(pod):
                continue
            try:
                record = pods.record_of(pod)
            except RecordError as error:
                self.actions.unschedulable(pod, f"allocation record ignored: {error}", reason="InvalidRecord")
                continue
            if record is not None:
                by_job.setdefault(record.job, []).append((pod, record))
        for name, members in sorted(by_job.items()):
            self._job(state, name, members)

    def _job(self, state: Tracking, name: str,
                     members: list[tuple[dict[str, Any], AllocationRecord]]) -> None:
        pod, record = members[0]
        try:
            demand = pod_demand(pod, pod_groups=self.mirror.all_podgroups())
        except DemandError as error:
            log.warning("cannot restore %s: %s", name, error)
            return
        batch = max(r.batch for _, r in members)
        bound = [p for p, _ in members if pods.node_of(p)]
        if len(members) < batch and len(bound) < len(members):  # the crash came before every record existed
            for p, _ in members:
                if not pods.node_of(p):
                    retry("roll back a record", lambda p=p: self.actions.clear_record(p))
            members = [(p, r) for p, r in members if pods.node_of(p)]
            if not members:
                return
        group = demand.group
        size = group.size if group is not None and group.size is not None else len(members)
        minimum = group.minimum if group is not None and group.minimum is not None else None
        try:
            nodes, _ = self.intake.allowed_nodes(state, [p for p, _ in members])
        except InvalidInputError:
            nodes = None  # it runs where its record says; a malformed constraint only stops new placements
        spec = job_spec(name, demand, max(size, len(members)), minimum and min(minimum, len(members)),
                        record.vc, pods.created(pod), nodes)
        running = [RunningMember(r.member, r.node, held_indices(state, r)) for _, r in members]
        started = min(r.created_at for _, r in members).timestamp()
        try:
            state.engine.restore(spec, running, JobClass(record.job_class), started_at=started)
        except InvalidInputError as error:
            log.error("cannot restore %s as recorded: %s", name, error)
            return
        tracked = Tracked(name, group.key if group else None, [pods.uid(p) for p, _ in members],
                          {r.member: pods.uid(p) for p, r in members}, isolation=record.isolation)
        state.track(tracked)
        self.intake.note_generation(tracked)
        for p, r in members:
            if not pods.node_of(p):  # records all written before the crash: finish the binds
                retry("bind", lambda p=p, r=r: self.actions.bind(p, r.node))
            else:
                self.gate.note_bound(state, p)
            tracked.bound.add(pods.uid(p))


def held_indices(state: Tracking, record: AllocationRecord) -> tuple[int, ...]:
    """The node's GPU indices a record holds, found by UUID: a GPU's index can change under a running pod (MIG
    instances recreated in another order, a board replaced), and its UUID is what the pod was given. A UUID
    the node no longer reports keeps the recorded index (the pod still holds that capacity)."""
    view = state.views.get(record.node)
    where = {uuid: index for index, uuid in enumerate(view.uuids)} if view is not None else {}
    found = tuple(where.get(gpu.uuid, gpu.index) for gpu in record.gpus)
    if found != tuple(gpu.index for gpu in record.gpus):
        log.info("%s: its GPUs are now at indices %s on %s (recorded %s)", record.allocation_id, found, record.node,
                 [gpu.index for gpu in record.gpus])
    return found
