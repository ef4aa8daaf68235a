"""A job's goodput model asked in workers, the unit the engine, the allocator and ``/scale`` count in.

A step report states the world torchrun formed: ``WORLD_SIZE`` processes, ``nprocPerNode`` of them per worker
(one GPU each), and the model is fitted in those processes, as Pollux's and Sia's are in GPUs. The engine places
members, the allocator sizes them and an ElasticJob's target is a count of them, and a member is a worker: a
pod of ``nprocPerNode`` GPUs. Asked about 2 workers of 8 GPUs, the model must answer for a world of 16
processes: asked for 2, it priced a world it never ran at (and its exploration limit, set in processes, was 8
times looser than meant). With one process per worker (the simulator, most jobs) the model is asked as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from kubecell.core.elastic.goodput import OnlineGoodput, Shape
from kubecell.core.elastic.types import GoodputEstimate


@dataclass(frozen=True, slots=True)
class PerWorker:
    """``model`` asked in workers of ``processes`` processes each: a placement of ``n`` workers on ``k`` nodes is
    the model's world of ``n x processes`` replicas on ``k`` nodes."""

    model: OnlineGoodput
    processes: int

    def __post_init__(self) -> None:
        if self.processes < 1:
            raise ValueError(f"a worker runs at least one process, got {self.processes}")

    def goodput(self, gpu_type: str, num_nodes: int, num_replicas: int) -> float:
        return self.model.goodput(gpu_type, num_nodes, num_replicas * self.processes)

    def goodput_many(self, gpu_type: str, shapes: Sequence[Shape]) -> NDArray[np.float64]:
        return self.model.goodput_many(gpu_type, [(nodes, workers * self.processes) for nodes, workers in shapes])

    def best_batch(self, gpu_type: str, num_nodes: int, num_replicas: int) -> tuple[int, int] | None:
        """``(local_bsz, accum_steps)`` per process for that many workers (``OnlineGoodput.best_batch``)."""
        return self.model.best_batch(gpu_type, num_nodes, num_replicas * self.processes)


def in_workers(model: OnlineGoodput, processes: int | None) -> GoodputEstimate:
    """``model`` as the engine's members are priced: itself where a worker is one process (None: not known,
    taken as one), else :class:`PerWorker`."""
    return model if processes is None or processes == 1 else PerWorker(model, processes)
