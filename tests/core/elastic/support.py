"""Synthetic jobs for the elastic tests: reports generated from known throughput parameters."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kubecell.core.elastic.goodput import OnlineGoodput
from kubecell.core.elastic.throughput import ThroughputParams, compute_time, step_time
from kubecell.core.elastic.types import ElasticJobView, GoodputEstimate, StepReport

TRUE = ThroughputParams(alpha_c=0.02, beta_c=0.001, alpha_r=0.01, beta_r=0.004, alpha_n=0.05, beta_n=0.01,
                        gamma=1.0)
SHAPES = ((1, 1), (1, 2), (1, 4), (1, 8), (2, 4), (2, 8), (4, 16))
BATCHES = (16, 32, 64, 128)


def report(params: ThroughputParams, gpu_type: str, nodes: int, replicas: int, local_bsz: int,
           grad: tuple[float, float] | None = None) -> StepReport:
    """What a job with ``params`` would measure at that placement and micro-batch."""
    step = float(step_time(params, nodes, replicas, local_bsz))
    sync = step - float(compute_time(params, local_bsz))
    return StepReport(gpu_type, nodes, replicas, local_bsz, step, sync,
                      grad_sqr=None if grad is None else grad[0], grad_var=None if grad is None else grad[1])


def reports(params: ThroughputParams, gpu_type: str, shapes: Iterable[tuple[int, int]] = SHAPES,
            batches: Iterable[int] = BATCHES) -> list[StepReport]:
    return [report(params, gpu_type, n, r, b) for n, r in shapes for b in batches]


def scaled(params: ThroughputParams, factor: float) -> ThroughputParams:
    """The same job on a GPU ``factor`` times faster at compute (synchronisation unchanged)."""
    return ThroughputParams(params.alpha_c / factor, params.beta_c / factor, params.alpha_r, params.beta_r,
                            params.alpha_n, params.beta_n, params.gamma)


def known_job(speeds: dict[str, float], *, phi: float = 20.0, params: ThroughputParams = TRUE,
              initial_bsz: int = 128, max_bsz: int = 4096) -> OnlineGoodput:
    """A job whose model has seen every shape of ``SHAPES`` on each GPU type (compute ``speed`` x faster)."""
    prior: list[StepReport] = []
    for gpu_type, factor in speeds.items():
        prior.extend(reports(scaled(params, factor), gpu_type))
    model = OnlineGoodput(initial_bsz=initial_bsz, max_bsz=max_bsz, prior=prior)
    model.observe(report(params, next(iter(speeds)), 1, 1, 64, grad=(1.0, phi)))
    return model


class TableGoodput:
    """A fixed goodput table: ``speed[type] * count ** exponent`` (for policy tests that must not depend on fits)."""

    def __init__(self, speed: dict[str, float], exponent: float = 0.8) -> None:
        self.speed = speed
        self.exponent = exponent

    def goodput(self, gpu_type: str, num_nodes: int, num_replicas: int) -> float:
        if gpu_type not in self.speed or num_replicas < 1 or num_nodes < 1:
            return 0.0
        return float(self.speed[gpu_type] * num_replicas**self.exponent * (0.9 if num_nodes > 1 else 1.0))


def view(name: str, estimate: GoodputEstimate, *, current: Sequence[str] = (), submitted: float = 0.0,
         min_replicas: int = 1, max_replicas: int = 64, last_resize: float | None = None, attained: float = 0.0,
         restart: float = 30.0, gpu_types: frozenset[str] | None = None) -> ElasticJobView:
    return ElasticJobView(name=name, submitted=submitted, min_replicas=min_replicas, max_replicas=max_replicas,
                          current=tuple(current), last_resize=last_resize, attained_gpu_seconds=attained,
                          restart_seconds=restart, estimate=estimate, gpu_types=gpu_types)
