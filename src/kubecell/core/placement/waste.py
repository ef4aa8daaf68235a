"""Expected waste of a node: the GPU share that placing on it now makes likely never to be allocated.

The measure keeps FGD's question (Weng et al., ATC'23) and changes what counts as lost:

* **Can the next request use this node at all?** For each GPU request type of the demand estimate,
  the node *serves* it when the model is allowed, the free CPU and host memory fit, and enough GPUs
  have the per-GPU share free. ``S`` is the served fraction, each type weighted by its arrival share
  times the scarcity of the GPU models it may use (a T4-only request sees only the T4s, so losing a
  T4 hurts it ``cluster GPUs / T4 GPUs`` times more). When the next request cannot use the node, all
  its free share is lost to it, as in FGD.
* **If it can, what will stay idle?** Not FGD's "free share on GPUs too small for that type" but the
  expected share never allocated, ``SW = sum over GPUs of W(free)``, from the learned gap fates
  (``gap_fate``): a 530-milli gap that a 470 will fill costs 60, a 190-milli sliver that nothing
  fills costs almost all of it.
* **What will the host strand?** GPUs that the free CPU or memory cannot feed stay idle whatever
  their share. The share expected to be filled, ``total - SW``, needs CPU and memory at the rate the
  requests that fill it use them; whatever exceeds what the free CPU and memory can feed is stranded
  (``M``). A node is refilled by a handful of requests, so the true rate lies between the demand's
  mean (the mix) and one type's (each type alone, weighted by its share); ``M`` is the mean of the
  two (``host_blend`` 0.5). It is counted in full even where no request can use the node: CPU spent
  there still strands GPUs that a later release would free.

    waste = S * SW + (1 - S) * total + M

A placement is scored by how much it lowers the node's waste, as FGD scores by its fragment. Arrays
follow ``FragmentationMeasure``: free CPU (K,), free memory (K,), per-GPU free milli (K, G) with absent
or unusable GPUs at 0, model ids (K,); the type axis is last.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from kubecell.core.errors import InvalidInputError
from kubecell.core.placement.demand import DemandType

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

_TINY = 1e-12


class ExpectedWaste:
    """The measure for one demand estimate and one waste table; see the module docstring."""

    def __init__(
        self,
        demand: Sequence[DemandType],
        model_names: Sequence[str],
        model_gpus: Sequence[int],
        table: FloatArray,
        *,
        host_blend: float = 0.5,
    ) -> None:
        if not 0 <= host_blend <= 1:
            raise InvalidInputError(f"host blend {host_blend} out of range", field="host_blend", accepted="0..1")
        if len(model_gpus) != len(model_names):
            raise ValueError("model_gpus must have one entry per model name")
        self.types = tuple(t for t in demand if t.shape.gpu_count > 0)
        self.model_names = tuple(model_names)
        self.host_blend = float(host_blend)
        self.table = np.asarray(table, np.float64)
        shapes = [t.shape for t in self.types]
        self.cpu: IntArray = np.array([s.cpu_milli for s in shapes], np.int64)
        self.memory: IntArray = np.array([t.memory_mib for t in self.types], np.int64)
        self.milli: IntArray = np.array([s.gpu_milli for s in shapes], np.int64)
        self.count: IntArray = np.array([s.gpu_count for s in shapes], np.int64)
        access = np.ones((len(self.model_names), len(shapes)), np.bool_)
        for j, shape in enumerate(shapes):
            allowed = shape.gpu_models
            if allowed is not None:
                access[:, j] = [model in allowed for model in self.model_names]
        self.access: BoolArray = access
        share = np.array([t.share for t in self.types], np.float64)
        self.share: FloatArray = share / share.sum() if share.size else share
        self.weight: FloatArray = self._scarcity_weights(np.asarray(model_gpus, np.float64))
        volume = (self.milli * self.count).astype(np.float64)
        # CPU and memory per milli-GPU: each type's own, and the mix's (ratio of the means).
        self.cpu_rate: FloatArray = self.cpu / np.maximum(volume, 1.0)
        self.memory_rate: FloatArray = self.memory / np.maximum(volume, 1.0)
        mean_volume = float(self.share @ volume) if self.size else 0.0
        self.mix_cpu_rate = float(self.share @ self.cpu) / mean_volume if mean_volume else 0.0
        self.mix_memory_rate = float(self.share @ self.memory) / mean_volume if mean_volume else 0.0

    def _scarcity_weights(self, model_gpus: FloatArray) -> FloatArray:
        if not self.size:
            return self.share
        eligible = (self.access * model_gpus[:, None]).sum(axis=0)
        pressure = np.where(eligible > 0, self.share * float(model_gpus.sum()) / np.maximum(eligible, 1.0), 0.0)
        if pressure.sum() <= 0:
            return self.share
        weights: FloatArray = pressure / pressure.sum()
        return weights

    @property
    def size(self) -> int:
        return len(self.types)

    def fit_count(self, avail: IntArray) -> IntArray:
        """Per node and type: GPUs with at least the type's per-GPU share free."""
        result: IntArray = (avail[..., None] >= self.milli).sum(axis=-2)
        return result

    def served(self, cpu: IntArray, memory: IntArray, model: IntArray, fit_count: IntArray) -> FloatArray:
        """Weighted fraction of the demand the node could take one more copy of (shapes broadcast)."""
        ok = (
            self.access[model]
            & (cpu[..., None] >= self.cpu)
            & (memory[..., None] >= self.memory)
            & (fit_count >= self.count)
        )
        result: FloatArray = ok @ self.weight
        return result

    def gap_waste(self, avail: IntArray) -> FloatArray:
        """Expected never-allocated share per GPU slot (0 where there is no usable GPU)."""
        result: FloatArray = self.table[avail]
        return result

    def stranded(self, cpu: IntArray | FloatArray, memory: IntArray | FloatArray, fillable: FloatArray) -> FloatArray:
        """GPU share expected to be filled that the free CPU and memory cannot feed."""
        cpu = np.maximum(np.asarray(cpu, np.float64), 0.0)
        memory = np.maximum(np.asarray(memory, np.float64), 0.0)
        fed_by_mix = np.minimum(cpu / max(self.mix_cpu_rate, _TINY), memory / max(self.mix_memory_rate, _TINY))
        by_mix = np.maximum(0.0, fillable - fed_by_mix)
        fed_by_type = np.minimum(
            cpu[..., None] / np.maximum(self.cpu_rate, _TINY), memory[..., None] / np.maximum(self.memory_rate, _TINY)
        )
        by_type = np.maximum(0.0, fillable[..., None] - fed_by_type) @ self.share
        result: FloatArray = (1.0 - self.host_blend) * by_mix + self.host_blend * by_type
        return result

    def waste(self, cpu: IntArray, memory: IntArray, model: IntArray, fit_count: IntArray,
              gap: FloatArray, total: IntArray) -> FloatArray:
        """``S * SW + (1 - S) * total + M`` from a node's parts (shapes broadcast), so that scoring can
        update the parts a placement changes instead of recomputing them from the GPU arrays."""
        served = self.served(cpu, memory, model, fit_count)
        result: FloatArray = served * gap + (1.0 - served) * total + self.stranded(cpu, memory, total - gap)
        return result

    def node_waste(self, cpu: IntArray, memory: IntArray, avail: IntArray, model: IntArray) -> FloatArray:
        """Expected waste per node, in milli-GPU."""
        total = avail.sum(axis=1)
        if not self.size:
            free: FloatArray = total.astype(np.float64)
            return free
        return self.waste(cpu, memory, model, self.fit_count(avail), self.gap_waste(avail).sum(axis=1), total)
