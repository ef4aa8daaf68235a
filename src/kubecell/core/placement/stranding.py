"""Fragmentation that also counts GPUs stranded by the host: CPU, memory and GPU-model scarcity.

FGD's measure asks, per typical request type, "could one such request still land here?" and counts
the free GPU share it could not use. Two things it does not see leave most of the capacity that FGD
strands on the Alibaba trace *outside* the slivers of partly used GPUs:

* **Host stranding.** A node with four free GPUs but CPU (or memory) for one more typical request
  passes FGD's test, yet three of those GPUs will stay idle. Here a type's usable GPUs on a node are
  the GPUs that fit it, capped by how many copies of it the free CPU and memory can feed
  (``min(cpu_free / cpu, mem_free / mem) x gpus per copy``, a continuous count). The share on fitting
  GPUs beyond that cap is a fragment, weighted by ``stranding_weight``: the cap is a worst case for
  that type alone, and other types with a lighter host footprint will use part of it.
  FGD also ignores host memory in its satisfiability test; here a type whose memory does not fit is
  unsatisfied like one whose CPU does not fit.
* **Model scarcity.** FGD weighs each type by its share of requests. A request that may only run on
  one GPU model sees only that model's capacity, so losing a T4 hurts T4-only requests by the ratio
  of cluster GPUs to T4 GPUs more than losing a GPU anywhere hurts unconstrained ones. Types are
  weighted by ``share x cluster GPUs / GPUs of their allowed models`` (renormalised), i.e. by the
  pressure they put on the capacity they can use.

Everything else (typical types, the per-GPU "too small" fragment, the gradient step) is FGD's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from kubecell.core.errors import InvalidInputError
from kubecell.core.placement.demand import DemandType
from kubecell.core.placement.frag import TypicalPod

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


class HostAwareMeasure:
    """Vectorized host-aware fragmentation of many node states against one demand distribution.

    Arrays follow ``FragmentationMeasure``: free CPU (K,), free memory (K,), per-GPU free milli (K, G)
    with absent or unusable GPUs at 0, and a model id (K,) into ``model_names``. The typical axis is
    last in every result.
    """

    def __init__(
        self,
        demand: Sequence[DemandType],
        model_names: Sequence[str],
        model_gpus: Sequence[int],
        *,
        stranding_weight: float = 0.5,
    ) -> None:
        if not 0 <= stranding_weight <= 1:
            raise InvalidInputError(
                f"stranding weight {stranding_weight} out of range", field="stranding_weight", accepted="0..1"
            )
        if len(model_gpus) != len(model_names):
            raise ValueError("model_gpus must have one entry per model name")
        self.demand = tuple(demand)
        self.model_names = tuple(model_names)
        self.stranding_weight = float(stranding_weight)
        shapes = [t.shape for t in self.demand]
        self.cpu: IntArray = np.array([s.cpu_milli for s in shapes], np.int64)
        self.memory: IntArray = np.array([t.memory_mib for t in self.demand], np.int64)
        self.milli: IntArray = np.array([s.gpu_milli for s in shapes], np.int64)
        self.count: IntArray = np.array([s.gpu_count for s in shapes], np.int64)
        self.is_gpu: BoolArray = self.milli > 0
        access = np.ones((len(self.model_names), len(shapes)), np.bool_)
        for j, shape in enumerate(shapes):
            allowed = shape.gpu_models
            if allowed is not None:
                access[:, j] = [model in allowed for model in self.model_names]
        self.access: BoolArray = access
        self.weight: FloatArray = self._scarcity_weights(np.array([t.share for t in self.demand], np.float64),
                                                         np.asarray(model_gpus, np.float64))
        # Per-copy host footprint; a zero request still takes a sliver so that division is defined.
        self._cpu_per_copy: FloatArray = np.maximum(self.cpu, 1).astype(np.float64)
        self._mem_per_copy: FloatArray = np.maximum(self.memory, 1).astype(np.float64)
        self._gpus_per_copy: FloatArray = np.maximum(self.count, 1).astype(np.float64)

    def _scarcity_weights(self, share: FloatArray, model_gpus: FloatArray) -> FloatArray:
        if not share.size:
            return share
        eligible = (self.access * model_gpus[:, None]).sum(axis=0)
        total = float(model_gpus.sum())
        pressure = np.where(self.is_gpu & (eligible > 0), share * total / np.maximum(eligible, 1.0), share)
        weights: FloatArray = pressure / pressure.sum()
        return weights

    @property
    def size(self) -> int:
        return len(self.demand)

    def summary(self, gpu_avail: IntArray) -> tuple[IntArray, IntArray, IntArray]:
        """Per node and type: (GPUs that fit one copy, free milli on GPUs too small, total free)."""
        fits = gpu_avail[:, :, None] >= self.milli[None, None, :]
        fit_count: IntArray = fits.sum(axis=1)
        total: IntArray = gpu_avail.sum(axis=1)
        small: IntArray = total[:, None] - (gpu_avail[:, :, None] * fits).sum(axis=1)
        return fit_count, small, total

    def host(self, cpu_free: IntArray, mem_free: IntArray, model_id: IntArray) -> tuple[BoolArray, FloatArray]:
        """Per node and type: can the host take one more copy (model allowed, CPU and memory fit), and
        how many GPUs its free CPU and memory can feed (continuous). Shapes broadcast; the typical
        axis is last. Kept apart from ``fragment`` because a share's candidate GPUs on one node all
        leave the same host state."""
        cpu = cpu_free[..., None]
        mem = mem_free[..., None]
        ok = self.access[model_id] & (cpu >= self.cpu) & (mem >= self.memory) & self.is_gpu
        copies = np.minimum(cpu / self._cpu_per_copy, mem / self._mem_per_copy)
        feeds: FloatArray = copies * self._gpus_per_copy
        return ok, feeds

    def fragment(
        self,
        host_ok: BoolArray,
        host_feeds: FloatArray,
        fit_count: IntArray,
        small: IntArray,
        total: IntArray,
    ) -> FloatArray:
        """Fragment milli per type from ``host`` and ``summary`` figures (shapes broadcast)."""
        satisfied = host_ok & (fit_count >= self.count)
        fed = np.minimum(1.0, host_feeds / np.maximum(fit_count, 1))
        totals = total[..., None]
        stranded = (totals - small) * (1.0 - fed) * self.stranding_weight
        result: FloatArray = np.where(satisfied, small + stranded, totals)
        return result

    def node_fragmentation(
        self, cpu_free: IntArray, mem_free: IntArray, gpu_avail: IntArray, model_id: IntArray
    ) -> FloatArray:
        """Expected (weighted) fragment milli per node."""
        if not self.size:
            return np.zeros(len(cpu_free), np.float64)
        fit_count, small, total = self.summary(gpu_avail)
        frag = self.fragment(*self.host(cpu_free, mem_free, model_id), fit_count, small, total)
        result: FloatArray = frag @ self.weight
        return result


def demand_from_typical(typical: Sequence[TypicalPod], memory_mib: int = 0) -> list[DemandType]:
    """Wrap an offline typical-pod list (no memory information) as a demand list."""
    return [DemandType(t.shape, t.share, memory_mib) for t in typical]
