"""Engine policies: one engine, three tenancy regimes, compared side by side in the simulator.

* ``quota``: a GPU-count quota per VC without topology (YARN capacity-scheduler / Kueue style).
  Jobs within quota are guaranteed, jobs beyond it borrow idle GPUs; a VC below quota reclaims
  borrowed GPUs by count, wherever they are, which frees the right number on the wrong nodes.
* ``hived``: HiveD's cells. Guarantees cover quantity, GPU type and topology; beyond its cells a VC's
  jobs wait (only opportunistic priority -1 jobs scavenge idle cells); priority preemption inside a VC
  kills its victims.
* ``kubecell``: HiveD's cells plus fair borrowing of idle capacity (weighted dominant share), topology-aware
  reclaim that evicts whole gangs chosen by simulation, lazy preemption, reservations for preemptors,
  a minimum-runtime guard, a preemption cap per job and reservation-based backfill against starvation.

Every preset shrinks elastic jobs (members above a threshold gang's minimum) before it preempts a whole job
(``shrink``), and resizes a job at most once per ``resize_min_interval_seconds``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from kubecell.core.errors import InvalidInputError
from kubecell.core.interference.admission import AdmissionRule

QUEUE_ORDERS = ("age", "shortest-expected")


@dataclass(frozen=True, slots=True)
class EngineOptions:
    name: str
    cells: bool = True
    """Guarantees are cells bound to physical cells (True) or a GPU count anywhere (False)."""
    borrowing: bool = True
    """Jobs beyond their VC's guarantee may run on idle capacity (reclaimable)."""
    fair_share: bool = True
    """Order VCs by weighted dominant-resource share; otherwise by submission time only."""
    lazy_preemption: bool = True
    """Priority preemption first downgrades victims to borrowed; they die only if their GPUs are needed."""
    topology_aware_reclaim: bool = True
    """Reclaim picks victims by simulating the preemptor's placement; otherwise frees GPUs by count."""
    starvation_seconds: float | None = 4 * 3600.0
    """A job pending this long gets a reservation: its region stops taking other work until it fits."""
    max_reservations: int = 1
    """Starvation reservations one VC may hold at a time."""
    max_preemptions: int = 3
    """A job preempted this often (opportunistic jobs excepted) no longer borrows, so it cannot be hit again."""
    reclaim_min_runtime_seconds: float = 0.0
    """Guarantees are restored at once by default; priority preemption honours each VC's minRuntime."""
    reservation_timeout_seconds: float = 600.0
    victim_search_regions: int = 8
    queue_order: str = "age"
    """Inside a VC, among jobs of one priority: ``age`` (first come, first served) or ``shortest-expected``
    (the job its history says is shortest first, by ``JobSpec.expected_seconds`` in powers of two, age
    within; a job without history counts as ``UNKNOWN_EXPECTED_SECONDS``). Only the VC's own order changes:
    fair share between VCs and every guarantee are as before, and starvation reservations keep long jobs
    from waiting forever."""
    backfill_margin: float | None = None
    """EASY backfill by history: a job may start on nodes held for a starving job when ``now + margin x`` its
    expected run time is no later than the expected end of every job running there (``Reservations.backfills``;
    run times from ``JobSpec.expected_seconds``). None: no backfill, reserved nodes take no other work."""
    colocation: AdmissionRule | None = None
    """Interference-aware sharing: a share goes only to a GPU where this rule admits it beside the shares
    already there (``placement.colocation``). None: shares pack by capacity alone."""
    resize_min_interval_seconds: float = 300.0
    """A running elastic job is neither grown nor shrunk more often than this (no thrash); shrinking it for
    another VC's guarantee is always allowed (a guarantee prevails), growth waits and is retried when the
    interval ends. 0: resize whenever capacity allows."""

    def __post_init__(self) -> None:
        if self.backfill_margin is not None and not (math.isfinite(self.backfill_margin)
                                                     and self.backfill_margin >= 1):
            raise InvalidInputError(f"backfill margin {self.backfill_margin!r}", field="backfill_margin",
                                    accepted="None (no backfill) or a finite number >= 1")
        if self.queue_order not in QUEUE_ORDERS:
            raise InvalidInputError(f"queue order {self.queue_order!r}", field="queue_order",
                                    accepted=", ".join(QUEUE_ORDERS))

    def with_(self, **changes: object) -> EngineOptions:
        return replace(self, **changes)  # type: ignore[arg-type]


PRESETS: dict[str, EngineOptions] = {
    "quota": EngineOptions("quota", cells=False, borrowing=True, fair_share=False, lazy_preemption=False,
                           topology_aware_reclaim=False, starvation_seconds=None, max_preemptions=1 << 30),
    "hived": EngineOptions("hived", cells=True, borrowing=False, fair_share=False, lazy_preemption=False,
                           topology_aware_reclaim=True, starvation_seconds=None, max_preemptions=1 << 30),
    "kubecell": EngineOptions("kubecell"),
}


PRESET_SUMMARIES: dict[str, str] = {
    "quota": "GPU-count quota per VC, anywhere; borrowing beyond it; reclaim by count (YARN / Kueue style)",
    "hived": "HiveD cells: guarantees of quantity, GPU type and topology; no borrowing, only opportunistic jobs",
    "kubecell": "HiveD cells plus fair borrowing, whole-gang reclaim by simulation, lazy preemption, reservations",
}
"""One line per preset for ``kubecell policies`` (the module docstring has the full rules)."""


def engine_options(name: str) -> EngineOptions:
    key = name.strip().lower()
    if key not in PRESETS:
        raise InvalidInputError(f"unknown tenancy policy {name!r}", field="policy", accepted=", ".join(PRESETS))
    return PRESETS[key]
