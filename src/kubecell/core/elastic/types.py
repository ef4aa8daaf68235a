"""The vocabulary every elastic-training component shares: what a job reports, what a goodput estimate
answers, what a sizing policy sees and decides.

The simulator (``kubecell.sim.elastic``) and the Kubernetes drivers hand the same plain values to the same
policy, so the policy measured against Sia's published figures is the one that sizes jobs in a cluster.
Nothing here knows where the numbers come from (a profile table, a training script's reports).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class ClusterNode:
    """A node as an elastic policy sees it: its name, its GPUs' type (one type per node) and how many."""

    name: str
    gpu_type: str
    gpus: int


@dataclass(frozen=True, slots=True)
class StepReport:
    """One measurement a running job reports (Pollux's inputs): seconds per iteration at a placement and a
    per-replica batch size, and optionally its gradient statistics (squared norm of the mean gradient and
    the variance of per-replica gradients) from which the gradient noise scale is computed."""

    gpu_type: str
    num_nodes: int
    num_replicas: int
    local_bsz: int
    step_time: float
    """Seconds per iteration, synchronisation included."""
    sync_time: float
    """Seconds of each iteration spent synchronising gradients (0 for one replica)."""
    grad_sqr: float | None = None
    grad_var: float | None = None


class GoodputEstimate(Protocol):
    """What a sizing policy asks of a job's model."""

    def goodput(self, gpu_type: str, num_nodes: int, num_replicas: int) -> float:
        """Useful training progress per second (examples per second times statistical efficiency, Pollux's
        goodput) at that placement with the best batch size the job allows; 0.0 where the job cannot run
        there or nothing is known yet."""
        ...


@dataclass(frozen=True, slots=True)
class ElasticJobView:
    """One job as a sizing policy sees it at a decision."""

    name: str
    submitted: float
    """Seconds, in the caller's clock."""
    min_replicas: int
    max_replicas: int
    current: tuple[str, ...]
    """Node name per replica it holds now (empty: not running)."""
    last_resize: float | None
    """When its allocation last changed (None: never started)."""
    attained_gpu_seconds: float
    """GPU-seconds it has held so far (its attained service)."""
    restart_seconds: float
    """What a change of allocation costs it (checkpoint, restart, rendezvous), in seconds of no progress."""
    estimate: GoodputEstimate
    vc: str = "default"
    gpu_types: frozenset[str] | None = None
    """GPU types it may use (None: any)."""


class ElasticPolicy(Protocol):
    """Sizes and places every elastic job at once; called at each scheduling round."""

    name: str

    def allocate(self, now: float, jobs: Sequence[ElasticJobView],
                 nodes: Sequence[ClusterNode]) -> Mapping[str, tuple[str, ...]]:
        """Node name per replica for each job (an empty tuple: the job does not run). A job left out keeps
        what it holds. Never more replicas on a node than it has GPUs, in total over all jobs."""
        ...
