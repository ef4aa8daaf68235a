"""Loaders for the Alibaba GPU trace v2023 ("openb") node and pod lists used by the FGD paper.

Node list columns: ``sn, cpu_milli, memory_mib, gpu, model``. Pod list columns: ``name, cpu_milli,
memory_mib, num_gpu, gpu_milli`` and optionally ``gpu_spec`` (allowed GPU models, ``A|B``) plus fields
the packing experiment ignores (qos, phase, timestamps). Every problem is reported as
``file:line: field 'x': what is wrong (accepted: ...)``; reading the file, its header and its fields is
``rows.py``'s job, shared with the other trace formats.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kubecell.core.errors import InvalidInputError
from kubecell.core.limits import MAX_CPU_MILLI, MAX_GPUS_PER_NODE, MAX_MEMORY_MIB
from kubecell.core.model import GPU_MODELS, MILLI_PER_GPU, Node, Request, gpu_model_spec, make_node
from kubecell.core.placement.frag import PodShape
from kubecell.inputs.csv_table import Row, open_csv

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
REQUEST_FIELD_COLUMNS = {
    "cpu_milli": "cpu_milli",
    "memory_mib": "memory_mib",
    "gpu_count": "num_gpu",
    "gpu_milli": "gpu_milli",
    "gpu_models": "gpu_spec",
    "topology": "num_gpu",
    "gpu_memory_mib": "gpu_milli",
}
"""Which pod-list column carries each field of a core Request (for error messages)."""


@dataclass(frozen=True, slots=True)
class TracePod:
    """One row of an openb pod list. ``gpu_spec`` keeps the raw text; ``gpu_models`` is its set."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpu_count: int
    gpu_milli: int
    gpu_spec: str = ""
    line: int = field(default=0, compare=False)
    """Line of the source file (for error messages); 0 for pods not read from a file."""

    @property
    def gpu_models(self) -> frozenset[str] | None:
        models = frozenset(m for m in self.gpu_spec.split("|") if m)
        return models or None

    @property
    def total_gpu_milli(self) -> int:
        return self.gpu_count * self.gpu_milli

    @property
    def shape(self) -> PodShape:
        """The fragmentation-measure shape; a pod without a CPU request counts as 100m, as in
        kube-scheduler's scoring."""
        return PodShape(self.cpu_milli or 100, self.gpu_milli, self.gpu_count, self.gpu_spec)

    def request(self, name: str | None = None) -> Request:
        return Request(
            name=name or self.name,
            cpu_milli=self.cpu_milli,
            memory_mib=self.memory_mib,
            gpu_count=self.gpu_count,
            gpu_milli=self.gpu_milli if self.gpu_count else 0,
            gpu_models=self.gpu_models,
        )


def _check_spec(spec: str, where: str) -> str:
    for model in (m for m in spec.split("|") if m):
        if model not in GPU_MODELS:
            raise InvalidInputError(f"unknown GPU model {model!r}", location=where, field="gpu_spec",
                                    accepted="'|'-separated names from " + ", ".join(sorted(GPU_MODELS)))
    return spec


def _unique_name(row: Row, column: str, what: str, seen: dict[str, int]) -> str:
    """The row's name, refused when empty or already used (naming the line of its first use)."""
    name = row.values[column].strip()
    if not name:
        raise InvalidInputError(f"empty {what} name", location=row.where, field=column)
    if name in seen:
        raise InvalidInputError(f"duplicate {what} name {name!r} (first at line {seen[name]})",
                                location=row.where, field=column, accepted="unique names")
    seen[name] = row.line
    return name


def load_nodes(path: str | Path, *, include_cpu_nodes: bool = False) -> list[Node]:
    """Read a node list. CPU-only nodes are skipped unless asked for (the FGD experiments skip them)."""
    path = Path(path)
    nodes: list[Node] = []
    seen: dict[str, int] = {}
    with open_csv(path) as table:
        table.require(NODE_COLUMNS, kind="node list")
        for row in table.rows():
            if row.problem:
                raise row.problem
            where = row.where
            name = _unique_name(row, "sn", "node", seen)
            gpus = row.integer("gpu", high=MAX_GPUS_PER_NODE, blank=0)
            model = row.values["model"].strip()
            if gpus and not model:
                raise InvalidInputError(f"{gpus} GPUs but no model", location=where, field="model",
                                        accepted=", ".join(sorted(GPU_MODELS)))
            if gpus:
                gpu_model_spec(model, location=where, field="model")
            cpu_milli = row.integer("cpu_milli", high=MAX_CPU_MILLI)  # validated even on rows then skipped
            memory_mib = row.integer("memory_mib", high=MAX_MEMORY_MIB)
            if not gpus and not include_cpu_nodes:
                continue
            nodes.append(
                make_node(
                    name,
                    cpu_milli=cpu_milli,
                    memory_mib=memory_mib,
                    gpu_count=gpus,
                    gpu_model=model if gpus else "",
                    location=where,
                )
            )
    if not nodes:
        raise InvalidInputError("no usable (GPU) nodes", location=str(path))
    return nodes


def load_pods(path: str | Path) -> list[TracePod]:
    """Read a pod list, validating each row's GPU request."""
    path = Path(path)
    pods: list[TracePod] = []
    seen: dict[str, int] = {}
    with open_csv(path) as table:
        table.require(POD_COLUMNS, kind="pod list")
        for row in table.rows():
            if row.problem:
                raise row.problem
            where = row.where
            name = _unique_name(row, "name", "pod", seen)
            count = row.integer("num_gpu", high=MAX_GPUS_PER_NODE, blank=0)
            milli = row.integer("gpu_milli", high=MILLI_PER_GPU, blank=0)
            if count == 0 and milli:
                raise InvalidInputError(f"gpu_milli {milli} with num_gpu 0", location=where, field="gpu_milli",
                                        accepted="0 for CPU-only pods")
            if count and milli == 0:
                raise InvalidInputError(f"num_gpu {count} with gpu_milli 0", location=where, field="gpu_milli",
                                        accepted="1..1000")
            if count > 1 and milli != MILLI_PER_GPU:
                raise InvalidInputError(f"{count} GPUs with a share of {milli} each", location=where,
                                        field="gpu_milli", accepted="1000 for multi-GPU pods")
            spec = _check_spec(row.optional("gpu_spec"), where)
            pods.append(
                TracePod(
                    name=name,
                    cpu_milli=row.integer("cpu_milli", high=MAX_CPU_MILLI),
                    memory_mib=row.integer("memory_mib", high=MAX_MEMORY_MIB),
                    gpu_count=count,
                    gpu_milli=milli,
                    gpu_spec=spec,
                    line=row.line,
                )
            )
    if not pods:
        raise InvalidInputError("no pods", location=str(path))
    return pods
