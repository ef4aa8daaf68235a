"""GPU fragmentation, measured against a distribution of typical requests (FGD, ATC'23).

Free GPU capacity is a *fragment* for a request type when that type cannot use it: the node lacks the
CPU, the allowed GPU model, or enough GPUs with the per-GPU share free; or the free share sits on GPUs
whose free amount is below the type's per-GPU request. A node's fragmentation is the expectation of
that amount over the typical request types; the cluster's is the sum over nodes. The same measure
drives the FGD placement policy and the packing experiment's reported metric.

Definitions follow the FGD simulator (``pkg/utils/frag.go`` in hkust-adsl/kubernetes-scheduler-simulator,
read, not copied): CPU-only typical pods count *all* idle GPU milli as fragment, host memory is ignored,
and typical pods are the most frequent request shapes covering 95 % of the original pod list.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kubecell.core.errors import InvalidInputError

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True, order=True)
class PodShape:
    """The fields of a request that the fragmentation measure looks at.

    ``gpu_models_label`` is the allowed-models text as the source wrote it ("" = any). Shapes are
    counted by it, as the FGD simulator counts its raw ``gpu_spec`` strings; ``gpu_models`` is the
    parsed set used for matching nodes.
    """

    cpu_milli: int
    gpu_milli: int
    gpu_count: int
    gpu_models_label: str = ""

    @property
    def gpu_models(self) -> frozenset[str] | None:
        models = frozenset(m for m in self.gpu_models_label.split("|") if m)
        return models or None


@dataclass(frozen=True, slots=True)
class TypicalPod:
    """A request shape and its share of the workload (shares over a typical set sum to 1)."""

    shape: PodShape
    share: float


def typical_pods(
    shapes: Iterable[PodShape], *, coverage: float = 0.95, include_cpu_pods: bool = True
) -> list[TypicalPod]:
    """The most frequent shapes, most frequent first, until they cover ``coverage`` of all pods.

    Ties in frequency go to the larger shape (CPU, then per-GPU share, then GPU count, then models),
    the order the FGD simulator's sort produces. Shares are renormalised over the kept shapes.
    """
    if not 0 < coverage <= 1:
        raise InvalidInputError(f"coverage {coverage} out of range", accepted="0 < coverage <= 1")
    counts = Counter(s for s in shapes if include_cpu_pods or s.gpu_count > 0)
    total = sum(counts.values())
    if total == 0:
        return []
    ordered = sorted(counts.items(), key=lambda item: (item[1], item[0]), reverse=True)
    kept: list[tuple[PodShape, int]] = []
    covered = 0
    for shape, count in ordered:
        if covered >= coverage * total:
            break
        kept.append((shape, count))
        covered += count
    return [TypicalPod(shape, count / covered) for shape, count in kept]


class FragmentationMeasure:
    """Vectorized fragmentation of many node states at once against one typical-pod distribution.

    Node states are given as arrays: free CPU (K,), per-GPU free milli (K, G) with absent or unusable
    GPUs at 0, and a model id (K,) into ``model_names``.
    """

    def __init__(self, typical: Sequence[TypicalPod], model_names: Sequence[str]) -> None:
        self.typical = tuple(typical)
        self.model_names = tuple(model_names)
        shapes = [t.shape for t in self.typical]
        self.cpu: IntArray = np.array([s.cpu_milli for s in shapes], np.int64)
        self.milli: IntArray = np.array([s.gpu_milli for s in shapes], np.int64)
        self.count: IntArray = np.array([s.gpu_count for s in shapes], np.int64)
        self.share: FloatArray = np.array([t.share for t in self.typical], np.float64)
        self.is_gpu: BoolArray = self.milli > 0
        access = np.ones((len(self.model_names), len(shapes)), np.bool_)
        for j, shape in enumerate(shapes):
            allowed = shape.gpu_models
            for i, model in enumerate(self.model_names):
                if allowed is not None:
                    access[i, j] = model in allowed
        self.access: BoolArray = access

    @property
    def size(self) -> int:
        return len(self.typical)

    def components(
        self, cpu_free: IntArray, gpu_avail: IntArray, model_id: IntArray
    ) -> tuple[IntArray, IntArray, IntArray, IntArray]:
        """Per node and typical pod: (fragment milli f, GPUs that fit, free milli on GPUs too small,
        total free milli). ``f`` is what the measure sums; the others let callers derive the state
        after a hypothetical placement without recomputing from scratch."""
        fits = gpu_avail[:, :, None] >= self.milli[None, None, :]
        fit_count = fits.sum(axis=1)
        total = gpu_avail.sum(axis=1)
        small = total[:, None] - (gpu_avail[:, :, None] * fits).sum(axis=1)
        frag = self.fragment(cpu_free, fit_count, small, total, model_id)
        return frag, fit_count, small, total

    def fragment(
        self,
        cpu_free: npt.NDArray[np.int64],
        fit_count: npt.NDArray[np.int64],
        small: npt.NDArray[np.int64],
        total: npt.NDArray[np.int64],
        model_id: npt.NDArray[np.int64],
    ) -> IntArray:
        """Fragment milli per typical pod from the summary figures (shapes broadcast; the typical
        axis is last). A GPU type is satisfied when its model is allowed, CPU suffices and enough
        GPUs fit; then only the free milli on too-small GPUs is a fragment, otherwise all of it."""
        satisfied = (
            self.access[model_id]
            & (cpu_free[..., None] >= self.cpu)
            & (fit_count >= self.count)
            & self.is_gpu
        )
        return np.where(satisfied, small, total[..., None])

    def node_fragmentation(self, cpu_free: IntArray, gpu_avail: IntArray, model_id: IntArray) -> FloatArray:
        """Expected fragment milli per node."""
        if not self.size:
            return np.zeros(len(cpu_free), np.float64)
        frag, _, _, _ = self.components(cpu_free, gpu_avail, model_id)
        return frag.astype(np.float64) @ self.share
