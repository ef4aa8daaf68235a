"""What the scheduler is started with, and the one way from it to the engine's options.

A module of its own because the command line, the extender, the replay and the tests build these without
starting a scheduler, and ``engine_options`` must be the only place a flag turns into an engine setting.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from kubecell.core.engine.options import PRESETS, EngineOptions
from kubecell.core.interference.admission import AdmissionRule
from kubecell.core.placement.frag import TypicalPod
from kubecell.core.placement.registry import DEFAULT_POLICY
from kubecell.scheduler.knowledge import Knowledge


@dataclass(frozen=True)
class SchedulerOptions:
    name: str = "kubecell"
    """The ``schedulerName`` of the pods this scheduler places."""
    tenancy: str = "kubecell"
    placement: str = DEFAULT_POLICY
    tenants_namespace: str = "kubecell-system"
    tenants_configmap: str = "kubecell-tenants"
    tenants_key: str = "tenants.yaml"
    default_vc: str = "default"
    """The VC of pods that name none; the default tenants (no ConfigMap) guarantee it the whole cluster."""
    idle_cycle_seconds: float = 5.0
    """Longest wait between cycles when nothing happens (time-based rules: starvation, minimum runtime)."""
    typical_pods: tuple[TypicalPod, ...] = ()
    """The workload's typical pod shapes, given to the placement policy in advance (FGD needs them; the
    kubecell policy starts from them and keeps learning). Empty: the policy learns from arrivals only."""
    tie_ranks: Mapping[str, int] = field(default_factory=dict)
    """Node name -> rank breaking ties between equal scores (lower first); unnamed nodes rank after, by
    name. A replay sets the packing experiment's seeded order so both make the same decision."""
    extender: bool = False
    """Serve kube-scheduler as its extender (``kubecell extender``): the same engine decides the pods asking
    for a managed resource, kube-scheduler tells their story, and ``kubecell.scheduler.extender.holds`` keeps each
    decision until kube-scheduler asks to bind it (``Binder.sink``, ``Intake.node_limit``, ``before_cycle``)."""
    extra_names: tuple[str, ...] = ()
    """Further ``schedulerName`` values whose pods kubecell places (extender mode: other kube-scheduler
    profiles whose GPU pods it should place, e.g. ``default-scheduler``)."""
    resize_interval_seconds: float | None = None
    """Least seconds between two resizes of one elastic gang (None: the tenancy preset's, 300 s)."""
    queue_order: str = "age"
    """Inside a VC: ``age`` or ``shortest-expected`` (by the run time ``knowledge`` gives; ``EngineOptions``)."""
    backfill_margin: float | None = None
    """EASY backfill by history on starvation reservations (``EngineOptions.backfill_margin``); None: none."""
    colocation: AdmissionRule | None = None
    """Interference-aware sharing (``EngineOptions.colocation``); None: shares pack by capacity."""
    knowledge: Knowledge | None = None
    """What the job history says of a pod's family (``--history``); None: nothing is known beyond requests."""
    place_by_use: bool = False
    """Place a share at its family's advised share, within what it asked (``scheduler.knowledge.informed``)."""
    release_terminating: bool = False
    """Free a pod's GPUs when its deletion starts. By default, as kube-scheduler, a terminating pod holds
    them until it is gone, so work that checkpoints on SIGTERM never shares its GPUs with its successor."""

    @property
    def names(self) -> frozenset[str]:
        return frozenset((self.name, *self.extra_names))


def engine_options(o: SchedulerOptions) -> EngineOptions:
    """The tenancy preset with what the command line changed in it: one place, so no flag is dropped on the
    way from ``SchedulerOptions`` to the engine."""
    preset = PRESETS[o.tenancy]
    if o.resize_interval_seconds is not None:
        preset = dataclasses.replace(preset, resize_min_interval_seconds=o.resize_interval_seconds)
    return dataclasses.replace(preset, queue_order=o.queue_order, colocation=o.colocation,
                               backfill_margin=o.backfill_margin)
