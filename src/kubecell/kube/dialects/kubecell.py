"""kubecell's own dialect: its container resources and pod annotations (``kubecell.kube.names``).

Resources, summed over the pod as kube-scheduler sums them (``resources.pod_totals``):
``kubecell.io/gpu`` (N whole GPUs, exclusive), ``kubecell.io/gpu-milli`` (1..1000 of one GPU's compute),
``kubecell.io/gpu-memory`` (MiB of one GPU); whole GPUs and a share are never mixed.

Annotations: ``kubecell.io/vc`` (the tenant), ``kubecell.io/group`` with ``group-size`` (the headcount,
required) and ``group-min`` (the minimum; unstated, it is the ``minMember`` of a PodGroup of the same name
the pod names, else the headcount: all or nothing), ``kubecell.io/gpu-models`` (catalog names, matched
exactly; ``MIG-<profile>`` names MIG instances), ``kubecell.io/opportunistic`` (``"true"``: priority -1),
and the two placement constraints only kubecell states, read by the entry point after the merge:
``kubecell.io/topology`` (where a gang's GPUs sit; below a node, whole GPUs only) and
``kubecell.io/isolation`` (``accounting``, ``mps`` or ``mig``: one whole MIG instance).

The dialect is tabled in docs/kubernetes.md ("Asking for GPUs: the dialects"); values are trimmed, and the
keyword annotations are read case-insensitively.
"""

from __future__ import annotations

from typing import cast

from kubecell.core.model import MILLI_PER_GPU, Request, TopologyLevel
from kubecell.kube import names
from kubecell.kube.dialects.demand import MAX_NAME_CHARS, OPPORTUNISTIC, Isolation, PodMeta, show
from kubecell.kube.dialects.models import bounded, model_filter, split_list
from kubecell.kube.dialects.resources import WHOLE_ASK_HINT, count_text, gpu_count, share_memory_mib, whole_number
from kubecell.kube.dialects.statement import GpuAsk, GroupClaim, Reading, Stated, Statement, group_name
from kubecell.kube.mig import is_mig_model

_CARRIED = (names.ANNOTATION_VC, names.ANNOTATION_TOPOLOGY, names.ANNOTATION_ISOLATION,
            names.ANNOTATION_OPPORTUNISTIC)


class Kubecell(Statement):
    """What kubecell's own resources and annotations state."""

    dialect = "kubecell"

    def ask(self) -> GpuAsk | None:
        """``kubecell.io/gpu`` (whole GPUs), or a share of ``gpu-milli`` and/or ``gpu-memory``."""
        pod, totals = self.pod, self.reading.totals
        whole = totals.get(names.RESOURCE_GPU)
        milli_raw = totals.get(names.RESOURCE_GPU_MILLI)
        memory_raw = totals.get(names.RESOURCE_GPU_MEMORY)
        count = gpu_count(pod, names.RESOURCE_GPU, whole) if whole is not None else 0
        if count:
            if milli_raw is not None or memory_raw is not None:
                other = names.RESOURCE_GPU_MILLI if milli_raw is not None else names.RESOURCE_GPU_MEMORY
                raise pod.error(f"{names.RESOURCE_GPU} {count} with {other}", "whole GPUs are exclusive, so a "
                                "share of each makes no sense", field=names.RESOURCE_GPU,
                                accepted=f"{names.RESOURCE_GPU} alone, or {names.RESOURCE_GPU_MILLI} and/or "
                                f"{names.RESOURCE_GPU_MEMORY} alone")
            return GpuAsk("kubecell", names.RESOURCE_GPU, f"{names.RESOURCE_GPU} {count}", count, MILLI_PER_GPU)
        if milli_raw is None and memory_raw is None:
            return None
        milli = 0
        subject = []
        if milli_raw is not None:
            milli = whole_number(pod, names.RESOURCE_GPU_MILLI, milli_raw)
            where = f"{names.RESOURCE_GPU_MILLI} {milli}"
            subject.append(where)
            if milli <= 0:
                raise pod.error(where, "a share of 0 milli-GPU or less is no share", field=names.RESOURCE_GPU_MILLI,
                                accepted="1..999 for a share of one GPU, 1000 for one whole GPU")
            if milli > MILLI_PER_GPU:
                raise pod.error(where, "asks more than one GPU's compute; a share is a part of one GPU",
                                field=names.RESOURCE_GPU_MILLI, accepted=f"1..1000, or {WHOLE_ASK_HINT}")
        memory = 0
        if memory_raw is not None:
            memory_value = whole_number(pod, names.RESOURCE_GPU_MEMORY, memory_raw)
            where = f"{names.RESOURCE_GPU_MEMORY} {memory_value}"
            subject.append(where)
            memory = share_memory_mib(pod, where, names.RESOURCE_GPU_MEMORY, memory_value, self.reading.options,
                                      "MiB")
        if milli == MILLI_PER_GPU and memory:
            raise pod.error(" with ".join(subject), "a whole GPU (1000 milli) is exclusive, so a memory share of "
                            "it makes no sense", field=names.RESOURCE_GPU_MEMORY,
                            accepted=f"{names.RESOURCE_GPU_MILLI} below 1000 with a memory share, or no memory")
        field = names.RESOURCE_GPU_MILLI if milli_raw is not None else names.RESOURCE_GPU_MEMORY
        return GpuAsk("kubecell", field, " with ".join(subject), 1, milli, memory)

    def models(self) -> list[Stated[frozenset[str]]]:
        """``kubecell.io/gpu-models``: a comma list of models as nodes report them, matched exactly."""
        name = names.ANNOTATION_GPU_MODELS
        if name not in self.pod.annotations:
            return []
        text = self.pod.annotations[name]
        subject = f"annotation {name} {show(text)}"
        return [model_filter(self.pod, self.reading.options.known_models, "kubecell", name, subject,
                             split_list(bounded(self.pod, name, subject, text)), "exact")]

    def groups(self) -> list[GroupClaim]:
        """``kubecell.io/group``, ``group-size``, ``group-min`` and, for an elastic gang, ``group-max``."""
        pod, notes = self.pod, self.pod.annotations
        name = notes.get(names.ANNOTATION_GROUP)
        if name is None:
            for extra in (names.ANNOTATION_GROUP_SIZE, names.ANNOTATION_GROUP_MIN, names.ANNOTATION_GROUP_MAX):
                if extra in notes:
                    raise pod.annotation_error(extra, f"is set without {names.ANNOTATION_GROUP}",
                                               f"{names.ANNOTATION_GROUP} naming the group, or neither")
            return []
        group = group_name(pod, name, f"annotation {names.ANNOTATION_GROUP} {show(name)}", names.ANNOTATION_GROUP)
        if names.ANNOTATION_GROUP_SIZE not in notes:
            raise pod.annotation_error(names.ANNOTATION_GROUP, f"names a group without {names.ANNOTATION_GROUP_SIZE}",
                                       f"{names.ANNOTATION_GROUP_SIZE}: the number of pods in the group")
        size_text = notes[names.ANNOTATION_GROUP_SIZE]
        size = count_text(pod, size_text, f"annotation {names.ANNOTATION_GROUP_SIZE} {show(size_text)}",
                          names.ANNOTATION_GROUP_SIZE, 1)
        minimum = None  # unstated: all or nothing, unless a PodGroup of the same name states a minimum
        if names.ANNOTATION_GROUP_MIN in notes:
            min_text = notes[names.ANNOTATION_GROUP_MIN]
            subject = f"annotation {names.ANNOTATION_GROUP_MIN} {show(min_text)}"
            minimum = count_text(pod, min_text, subject, names.ANNOTATION_GROUP_MIN, 1)
            if minimum > size:
                raise pod.error(subject, f"is above the group's size {size}", field=names.ANNOTATION_GROUP_MIN,
                                accepted=f"1..{size}")
        maximum = None
        if names.ANNOTATION_GROUP_MAX in notes:
            max_text = notes[names.ANNOTATION_GROUP_MAX]
            subject = f"annotation {names.ANNOTATION_GROUP_MAX} {show(max_text)}"
            maximum = count_text(pod, max_text, subject, names.ANNOTATION_GROUP_MAX, 1)
            if maximum < size:
                raise pod.error(subject, f"is below the group's size {size}", field=names.ANNOTATION_GROUP_MAX,
                                accepted=f"{size} or more: the most members the elastic group may grow to")
            if minimum is None:
                raise pod.error(subject, f"is set without {names.ANNOTATION_GROUP_MIN}",
                                field=names.ANNOTATION_GROUP_MAX,
                                accepted=f"{names.ANNOTATION_GROUP_MIN} too: an elastic group states the members "
                                         "it needs and the most it may use")
        return [GroupClaim("kubecell", names.ANNOTATION_GROUP, f"annotation {names.ANNOTATION_GROUP} {show(name)}",
                           group, size, minimum, maximum=maximum)]

    def vc(self) -> Stated[str] | None:
        """``kubecell.io/vc``, trimmed."""
        text = self.pod.annotations.get(names.ANNOTATION_VC)
        if text is None:
            return None
        vc = text.strip()
        if not vc:
            raise self.pod.annotation_error(names.ANNOTATION_VC, "is empty", "the name of a virtual cluster")
        if len(vc) > MAX_NAME_CHARS:
            raise self.pod.annotation_error(names.ANNOTATION_VC, f"is {len(vc)} characters long",
                                            f"the name of a virtual cluster, at most {MAX_NAME_CHARS} characters")
        return Stated("kubecell", names.ANNOTATION_VC, f"annotation {names.ANNOTATION_VC} {show(vc)}", vc)

    def priority(self) -> Stated[int] | None:
        """``kubecell.io/opportunistic: "true"`` states priority -1; ``"false"`` states none."""
        text = self.pod.annotations.get(names.ANNOTATION_OPPORTUNISTIC)
        if text is None:
            return None
        flag = text.strip().lower()
        if flag not in ("true", "false"):
            raise self.pod.annotation_error(names.ANNOTATION_OPPORTUNISTIC, "is not true or false",
                                            '"true" or "false"')
        if flag != "true":
            return None
        return Stated("kubecell", names.ANNOTATION_OPPORTUNISTIC,
                      f"annotation {names.ANNOTATION_OPPORTUNISTIC} \"true\"", OPPORTUNISTIC)

    def carried(self) -> bool:
        return any(key in self.pod.annotations for key in _CARRIED)


def read(reading: Reading) -> Statement:
    """kubecell's own dialect on the pod (read when asked)."""
    return Kubecell(reading)


def isolation(pod: PodMeta, models: frozenset[str] | None) -> Isolation:
    """The pod's isolation mode (``kubecell.io/isolation``); a pod whose model filter (of any dialect) names
    only MIG profiles asks for ``mig``."""
    text = pod.annotations.get(names.ANNOTATION_ISOLATION)
    only_mig = models is not None and all(is_mig_model(model) for model in models)
    if text is None:
        return "mig" if only_mig else cast(Isolation, names.DEFAULT_ISOLATION)
    value = text.strip().lower()
    if value not in names.ISOLATION_MODES:
        raise pod.annotation_error(names.ANNOTATION_ISOLATION, "is not an isolation mode",
                                   ", ".join(names.ISOLATION_MODES))
    if only_mig and value != "mig":
        raise pod.annotation_error(names.ANNOTATION_ISOLATION, f"asks for {value} on MIG instances (its GPU model "
                                   f"filter names MIG profiles only), which are given in mig isolation alone",
                                   "mig, or a GPU model filter without MIG profiles")
    return cast(Isolation, value)


def topology(pod: PodMeta, ask: GpuAsk | None) -> TopologyLevel | None:
    """The topology constraint (``kubecell.io/topology``): a level below a node (NVLink, NUMA) constrains
    where whole GPUs sit, so it needs the merged ask to be whole GPUs."""
    text = pod.annotations.get(names.ANNOTATION_TOPOLOGY)
    if text is None:
        return None
    value = text.strip().lower()
    if value not in names.TOPOLOGY_VALUES:
        raise pod.annotation_error(names.ANNOTATION_TOPOLOGY, "is not a topology level",
                                   ", ".join(names.TOPOLOGY_VALUES))
    level = TopologyLevel[value.upper()]
    whole = ask is not None and ask.milli == MILLI_PER_GPU
    if level < TopologyLevel.NODE and not whole:
        raise pod.annotation_error(names.ANNOTATION_TOPOLOGY, "constrains where whole GPUs sit, and this pod asks "
                                   "for " + ("a share of one GPU" if ask else "no GPU"), "node, rack or zone")
    return level


def check_mig(pod: PodMeta, request: Request, models: frozenset[str] | None) -> None:
    """A pod in ``mig`` isolation takes one whole MIG instance: CUDA sees one MIG device per process, and an
    instance is not shared (a share of one is a share of a GPU in accounting or mps isolation)."""
    if not request.wants_gpu:
        return
    if request.gpu_count != 1 or not request.is_whole:
        asked = (f"{request.gpu_count} GPUs" if request.gpu_count > 1
                 else f"a share ({request.gpu_milli} milli, {request.gpu_memory_mib} MiB)")
        raise pod.annotation_error(names.ANNOTATION_ISOLATION, f"places one whole MIG instance, and the pod asks for "
                                   f"{asked}", f"{names.RESOURCE_GPU}: 1 (with {names.ANNOTATION_GPU_MODELS}: "
                                   "MIG-<profile> to choose the instance size)")
    if models is not None and not all(is_mig_model(model) for model in models):
        others = ", ".join(sorted(model for model in models if not is_mig_model(model)))
        raise pod.annotation_error(names.ANNOTATION_ISOLATION, f"places MIG instances, and the pod's GPU model filter "
                                   f"allows {others}", "MIG-<profile> models (MIG-1g.5gb, MIG-3g.20gb, ...) or none")
