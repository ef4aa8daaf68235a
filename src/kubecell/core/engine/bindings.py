"""Cell bindings as jobs come and go: release idle cells, adopt cells on a reload, bind cells for growth.

HiveD binds a virtual cluster's cells to physical cells only while guaranteed work uses them, so an idle
guarantee pins no machine. Releasing changes what other VCs may bind (and, while hardware is bad, who
is doomed), so the engine releases at the start of every cycle, before any job is tried, and again at
its end; a release at the end makes the cycle run another round for the jobs that waited.
"""

from __future__ import annotations

from collections.abc import Sequence

from kubecell.core.engine.containers import cell_holds, container_level
from kubecell.core.engine.job import Job
from kubecell.core.engine.session import Session
from kubecell.core.model import TopologyLevel
from kubecell.core.topology import Cell


def release_idle_cells(session: Session, *, everything: bool = False) -> bool:
    """Unbind preassigned cells no guaranteed job uses any more; True if any was unbound."""
    released = session.ledger.take_released()
    if not session.options.cells:
        return False
    tenancy = session.tenancy
    cells = list(tenancy.binding) if everything else tenancy.cells_touching(released)
    unbound = False
    for cell in cells:
        if cell in tenancy.binding and cell not in tenancy.pinned and not session.ledger.cell_has_guaranteed(cell):
            tenancy.unbind(cell)
            unbound = True
    return unbound


def adopt_cells(session: Session, job: Job) -> bool:
    """Bind, under the current configuration, cells that cover a running guaranteed job: one cell per
    member (or one for the whole gang when it must share a node or rack) that could have held it.
    A member placed on GPUs of several of its VC's cells (the region of a per-member job is all of its
    VC's bound cells, so a 2-GPU member may take the last free GPU of two NVLink pairs) is covered by one
    such cell per GPU instead; else a reload or a restart would demote work the engine itself started as
    guaranteed, and the next guarantee would reclaim it. Returns False, binding nothing, when some part
    fits no cell the VC may hold."""
    if not session.options.cells:
        vc = session.tenants.require(job.vc)
        return session.ledger.of(job.vc).guaranteed_milli <= vc.guaranteed_milli
    tenancy, book = session.tenancy, session.book
    if tenancy.vc_index.get(job.vc) is None:
        return False
    level = container_level(job.spec)
    members = [[(book.index[book.allocations[a].node], g) for g in book.allocations[a].gpu_indices]
               for a in job.running_members]
    groups = members if level == TopologyLevel.GPU else [[gpu for member in members for gpu in member]]
    bound_now: list[Cell] = []
    for group in groups:
        if not group:
            continue
        if _cover(session, job, group, level, bound_now):
            continue
        if level == TopologyLevel.GPU and len(group) > 1 and all(
                _cover(session, job, [gpu], level, bound_now) for gpu in group):
            continue
        for done in reversed(bound_now):
            tenancy.unbind(done)
        return False
    return True


def _cover(session: Session, job: Job, gpus: list[tuple[int, int]], level: TopologyLevel,
           bound_now: list[Cell]) -> bool:
    """Find or bind the smallest cell holding all of ``gpus`` that is the job's VC's or that the VC may bind
    (and that could hold the job's container); True when one covers them now."""
    tenancy = session.tenancy
    wanted = set(gpus)
    cell: Cell | None = session.forest.gpu_cell.get(gpus[0])
    while cell is not None and not wanted.issubset(cell.gpus):
        cell = cell.parent
    while cell is not None:
        holder = tenancy.cell_bound_above(cell)
        if holder is not None and tenancy.binding[holder] == job.vc:
            return True
        if holder is None and cell_holds(cell.size, cell.level, cell.chain, job.spec, level):
            if tenancy.can_bind(job.vc, cell):
                tenancy.bind(job.vc, cell)
                bound_now.append(cell)
                return True
            if tenancy.adopt(job.vc, cell):  # not free only for bad or closed hardware under the work
                bound_now.append(cell)
                return True
        cell = cell.parent
    return False


def bind_for_growth(session: Session, job: Job, scope: Sequence[int], members: int, gpus: int) -> list[Cell]:
    """Bind free cells of the job's VC inside ``scope`` until they could hold ``members`` more, which need
    ``gpus`` GPUs (``regions.gpus_to_place``)."""
    spec = job.spec
    vc = session.tenants.require(job.vc)
    in_scope = set(scope)
    allowed = session.allowed_nodes(job)
    need = gpus - session.regions.bound_free(vc, spec, allowed)
    bound: list[Cell] = []
    for region in session.regions.guaranteed(vc, spec, members, allowed):
        if need <= 0:
            break
        if len(region.binds) != 1 or not in_scope.issuperset(region.binds[0].nodes):
            continue
        cell = region.binds[0]
        if session.tenancy.can_bind(job.vc, cell):
            session.tenancy.bind(job.vc, cell)
            bound.append(cell)
            need -= region.free_gpus
    return bound
