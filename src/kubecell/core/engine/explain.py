"""What the engine tells people: why a job waits, and what each virtual cluster holds.

Every waiting job carries one specific sentence: the rule that stopped it and the numbers behind it
("VC a guarantee in use (16 of 16 GPUs) by work of equal or higher priority", "needs 2 member(s) of
8 GPU within one rack in its VC's cells; the roomiest node takes 1 member(s) now").
"""

from __future__ import annotations

from kubecell.core.engine.attempt import Attempt
from kubecell.core.engine.placement import member_capacity
from kubecell.core.engine.regions import Region
from kubecell.core.engine.session import Session


def no_room_reason(session: Session, attempt: Attempt, region: Region | None, where: str) -> str:
    spec = attempt.job.spec
    mask, nodes = session.filters(region, attempt) if region is not None else (None, None)
    cap = member_capacity(session.book, spec.member_request(0), mask, nodes)
    best = int(cap.max(initial=0))
    shape = (f"{spec.member.gpu_count} GPU" if spec.member.is_whole
             else f"{spec.member.gpu_milli} milli-GPU" if spec.member.gpu_milli
             else f"{spec.member.gpu_memory_mib} MiB of GPU memory" if spec.member.wants_gpu else "CPU")
    what = f"{spec.minimum} member(s) of {shape}"
    if spec.topology is not None and spec.members > 1:
        what += f" within one {spec.topology.name.lower()}"
    blocked = (" (some capacity is reserved for starving jobs)"
               if session.reservations.blocking(attempt, session.jobs) is not None else "")
    return f"needs {what} {where}; the roomiest node takes {best} member(s) now{blocked}"


def status(session: Session) -> dict[str, dict[str, float]]:
    """Per VC: guaranteed, doomed, and used GPUs by class, and the cells bound to it."""
    out: dict[str, dict[str, float]] = {}
    for vc in session.tenants.vcs:
        usage = session.ledger.of(vc.name)
        out[vc.name] = {
            "guaranteed_gpus": vc.guaranteed_gpus,
            "doomed_gpus": session.tenancy.doomed_gpus(vc.name) if session.options.cells else 0,
            "guaranteed_used_gpus": usage.guaranteed_milli / 1000,
            "borrowed_gpus": usage.borrowed_milli / 1000,
            "opportunistic_gpus": usage.opportunistic_milli / 1000,
            "bound_cells": len(session.tenancy.bound_cells(vc.name)),
        }
    return out
