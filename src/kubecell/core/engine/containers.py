"""Which cells can hold a job: the container its topology constraint asks for, and whether a cell type
is that large.

A job's members go into the cells of its virtual cluster. Without a constraint (or with an intra-node
one) each member needs a cell of its own size only, so the container level is the GPU; a gang that must
share a node or a rack needs one cell that holds all of it. Guarantees (can this VC ever run the job
inside its cells?), regions (which free cells are candidates) and reloads (which cells cover a running
job) all ask the same two questions.

For a heterogeneous gang the members that count are those it starts with (the first ``minimum`` of its
fill order): each needs a cell as large as its largest member, and a node or rack container the GPUs of
all of them (a share counting one GPU, as for homogeneous gangs).
"""

from __future__ import annotations

from kubecell.core.engine.job import JobSpec
from kubecell.core.model import TopologyLevel
from kubecell.core.topology import CellChain


def container_level(spec: JobSpec) -> TopologyLevel:
    """GPU (each member on its own), NODE (one node holds the gang) or RACK (one rack holds it)."""
    if spec.topology is not None and TopologyLevel.RACK <= spec.topology < TopologyLevel.CLUSTER and spec.members > 1:
        return TopologyLevel.RACK
    if spec.topology == TopologyLevel.NODE and spec.members > 1:
        return TopologyLevel.NODE
    return TopologyLevel.GPU


def cell_holds(size: int, cell_level: int, chain: CellChain, spec: JobSpec, level: TopologyLevel) -> bool:
    """Could a cell of this type (``size`` GPUs at ``cell_level`` of ``chain``) hold the job's container?"""
    kind = chain.kinds[cell_level]
    if spec.heterogeneous:
        counts = spec.first_counts(spec.minimum)
        member_gpus = max(g.member.gpu_count for g, c in zip(spec.member_groups, counts, strict=True) if c)
        need = spec.gpus_of_first(spec.minimum)
    else:
        member_gpus = spec.member.gpu_count
        need = spec.minimum * member_gpus
    if member_gpus > min(size, chain.node_gpus):
        return False
    if level == TopologyLevel.RACK:
        return kind == "rack" and size >= need
    if level == TopologyLevel.NODE:
        return (kind != "rack" and size >= need) or (kind == "rack" and chain.node_gpus >= need)
    return True
