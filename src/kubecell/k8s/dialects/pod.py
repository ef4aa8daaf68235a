"""A Pod, as the API server returns it, read into one ``PodDemand``: all dialects side by side.

This is the only entry point the scheduler calls. It reads every dialect the pod carries, checks that
the ones present agree, and builds the core ``Request`` of one member; it does no I/O, so the same
function serves the scheduler, the extender, the replay tool and the tests.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, cast

from kubecell.core.errors import InvalidInputError
from kubecell.core.model import MILLI_PER_GPU, Request, TopologyLevel
from kubecell.k8s import names
from kubecell.k8s.dialects.demand import MAX_NAME_CHARS, DialectOptions, Isolation, PodDemand, PodMeta, show, shown
from kubecell.k8s.dialects.gpu import (
    GpuAsk,
    aliyun_ask,
    alnair_ask,
    kubecell_ask,
    kubeshare_ask,
    merge_asks,
    nvidia_ask,
)
from kubecell.k8s.dialects.groups import (
    PodGroups,
    hived_group,
    kubecell_group,
    kubeshare_group,
    merge_groups,
    podgroup_groups,
)
from kubecell.k8s.dialects.hived import OPPORTUNISTIC, HivedSpec, parse_hived
from kubecell.k8s.dialects.models import Matching, known_list, match_models, split_list
from kubecell.k8s.dialects.resources import MAX_NUMBER_CHARS, mib_up, number_text, pod_totals
from kubecell.k8s.mig import is_mig_model

MAX_MODEL_FILTER_CHARS = 1024
"""The longest GPU model filter read (``kubecell.io/gpu-models``, HAMi's ``use-gputype``...): real ones name a
few models; each name is matched against every model the cluster has, so the length bounds a pod's cost (a
quarter-megabyte list of distinct names took seconds)."""

PRIORITY_RANGE = (-(2**31), 2**31 - 1)
"""``spec.priority`` is an int32 in the API (PriorityClass values; system classes reach 2,000,001,000)."""

DIALECT_ORDER = ("kubecell", "nvidia", "hami", "aliyun", "alnair", "kubeshare", "hived", "coscheduling", "volcano",
                 "kai")


def _models(pod: PodMeta, hived: HivedSpec | None, options: DialectOptions) -> tuple[frozenset[str] | None, set[str]]:
    """Allowed GPU models: every filter the pod states, intersected; a filter that selects nothing (or
    filters that exclude each other) is refused."""
    known = options.known_models
    filters: list[tuple[str, str, str, frozenset[str]]] = []  # (dialect, field, subject, models)

    def add(dialect: str, field: str, subject: str, wanted: list[str], how: Matching, *, exclude: bool = False) -> None:
        # MIG profiles differ by GPU and driver, so a MIG model is taken as written (kubecell.k8s.mig)
        chosen = match_models(wanted, known, how) | frozenset(name for name in wanted if is_mig_model(name))
        if exclude:
            chosen = known - chosen
        if not wanted or not chosen:
            raise pod.error(subject, "excludes every GPU model" if exclude else "matches no GPU model the cluster "
                            "has", field=field, accepted=known_list(known))
        filters.append((dialect, field, subject, chosen))

    def bounded(field: str, subject: str, text: str) -> str:
        """A model filter's text; its length bounds the matching work (per name, against every model)."""
        if len(text) > MAX_MODEL_FILTER_CHARS:
            raise pod.error(subject, f"is {len(text)} characters long", field=field,
                            accepted=f"GPU models in at most {MAX_MODEL_FILTER_CHARS} characters")
        return text

    notes, labels = pod.annotations, pod.labels
    if names.ANNOTATION_GPU_MODELS in notes:
        text = notes[names.ANNOTATION_GPU_MODELS]
        subject = f"annotation {names.ANNOTATION_GPU_MODELS} {show(text)}"
        add("kubecell", names.ANNOTATION_GPU_MODELS, subject,
            split_list(bounded(names.ANNOTATION_GPU_MODELS, subject, text)), "exact")
    for key, exclude in ((names.HAMI_USE_GPU_TYPE, False), (names.HAMI_NOUSE_GPU_TYPE, True)):
        if notes.get(key, "").strip():
            subject = f"annotation {key} {show(notes[key])}"
            add("hami", key, subject, split_list(bounded(key, subject, notes[key])), "substring", exclude=exclude)
    if labels.get(names.KUBESHARE_GPU_MODEL, "").strip():
        text = labels[names.KUBESHARE_GPU_MODEL]
        subject = f"label {names.KUBESHARE_GPU_MODEL} {show(text)}"
        add("kubeshare", names.KUBESHARE_GPU_MODEL, subject,
            [bounded(names.KUBESHARE_GPU_MODEL, subject, text).strip()], "product")
    if hived is not None and hived.gpu_type:
        subject = f"annotation {names.HIVED_POD_SCHEDULING_SPEC}: leafCellType {show(hived.gpu_type)}"
        add("hived", names.HIVED_POD_SCHEDULING_SPEC, subject,
            [bounded(names.HIVED_POD_SCHEDULING_SPEC, subject, hived.gpu_type)], "substring")
    if not filters:
        return None, set()
    first_dialect, first_field, first_subject, allowed = filters[0]
    for dialect, _, subject, chosen in filters[1:]:
        if not allowed & chosen:
            raise pod.error(f"{first_subject} and {subject}", f"{first_dialect} and {dialect} allow no GPU model in "
                            "common", field=first_field, accepted="model filters that overlap")
        allowed &= chosen
    return allowed, {dialect for dialect, _, _, _ in filters}


def _topology(pod: PodMeta) -> TopologyLevel | None:
    text = pod.annotations.get(names.ANNOTATION_TOPOLOGY)
    if text is None:
        return None
    value = text.strip().lower()
    if value not in names.TOPOLOGY_VALUES:
        raise pod.annotation_error(names.ANNOTATION_TOPOLOGY, "is not a topology level",
                                   ", ".join(names.TOPOLOGY_VALUES))
    return TopologyLevel[value.upper()]


def _isolation(pod: PodMeta, models: frozenset[str] | None) -> Isolation:
    """The pod's isolation mode; a pod whose model filter names only MIG profiles asks for ``mig``."""
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


def _check_mig(pod: PodMeta, request: Request, models: frozenset[str] | None) -> None:
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


def _vc(pod: PodMeta, hived: HivedSpec | None) -> str | None:
    text = pod.annotations.get(names.ANNOTATION_VC)
    vc = None
    if text is not None:
        vc = text.strip()
        if not vc:
            raise pod.annotation_error(names.ANNOTATION_VC, "is empty", "the name of a virtual cluster")
        if len(vc) > MAX_NAME_CHARS:
            raise pod.annotation_error(names.ANNOTATION_VC, f"is {len(vc)} characters long",
                                       f"the name of a virtual cluster, at most {MAX_NAME_CHARS} characters")
    if hived is not None:
        if vc is not None and vc != hived.vc:
            raise pod.error(f"annotation {names.ANNOTATION_VC} {show(vc)} and {names.HIVED_POD_SCHEDULING_SPEC}: "
                            f"virtualCluster {show(hived.vc)}", "name different virtual clusters",
                            field=names.ANNOTATION_VC, accepted="one virtual cluster, named the same in both")
        vc = hived.vc
    return vc


def _priority(pod: PodMeta, hived: HivedSpec | None) -> tuple[int, set[str]]:
    """``spec.priority`` (from the PriorityClass), unless a dialect states one; stated ones must agree."""
    raw = pod.spec.get("priority", 0)
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise pod.error(f"spec.priority {shown(raw)}", "is not a whole number", field="spec.priority",
                        accepted="an integer (set through a PriorityClass)")
    low, high = PRIORITY_RANGE
    if not low <= raw <= high:
        raise pod.error(f"spec.priority {shown(raw)}", "is beyond the API's int32", field="spec.priority",
                        accepted=f"an integer in {low}..{high} (set through a PriorityClass)")
    stated: list[tuple[str, str, str, int]] = []  # (dialect, field, subject, priority)
    text = pod.annotations.get(names.ANNOTATION_OPPORTUNISTIC)
    if text is not None:
        flag = text.strip().lower()
        if flag not in ("true", "false"):
            raise pod.annotation_error(names.ANNOTATION_OPPORTUNISTIC, "is not true or false", '"true" or "false"')
        if flag == "true":
            stated.append(("kubecell", names.ANNOTATION_OPPORTUNISTIC,
                           f"annotation {names.ANNOTATION_OPPORTUNISTIC} \"true\"", OPPORTUNISTIC))
    if hived is not None and hived.priority is not None:
        stated.append(("hived", names.HIVED_POD_SCHEDULING_SPEC,
                       f"annotation {names.HIVED_POD_SCHEDULING_SPEC}: priority {hived.priority}", hived.priority))
    if names.KUBESHARE_PRIORITY in pod.labels:
        value = pod.labels[names.KUBESHARE_PRIORITY].strip()
        # ASCII digits (``\d`` would read "١" as 1), and never thousands of them (``int`` refuses > 4,300)
        number = int(value) if len(value) <= MAX_NUMBER_CHARS and re.fullmatch(r"-?[0-9]+", value) else None
        if number is None or not -1 <= number <= 100:
            raise pod.label_error(names.KUBESHARE_PRIORITY, "is not a KubeShare priority",
                                  "0 (opportunistic) or 1..100 (guaranteed)")
        stated.append(("kubeshare", names.KUBESHARE_PRIORITY, f"label {names.KUBESHARE_PRIORITY} {show(value)}",
                       OPPORTUNISTIC if number <= 0 else number))
    for dialect, _, subject, other in stated[1:]:
        first_dialect, first_field, first_subject, first_value = stated[0]
        if other != first_value:
            raise pod.error(f"{first_subject} and {subject}", f"{first_dialect} states priority {first_value} but "
                            f"{dialect} states {other}", field=first_field,
                            accepted="one priority (-1 = opportunistic), stated the same everywhere")
    priority = stated[0][3] if stated else raw
    if priority < OPPORTUNISTIC:
        raise pod.error(f"spec.priority {priority}", "is below -1", field="spec.priority",
                        accepted="-1 (opportunistic) or a priority >= 0")
    return priority, {dialect for dialect, _, _, _ in stated}


def _request(pod: PodMeta, ask: GpuAsk | None, totals: Mapping[str, Decimal], models: frozenset[str] | None,
             topology: TopologyLevel | None) -> Request:
    cpu = totals.get("cpu", Decimal(0))
    memory = totals.get("memory", Decimal(0))
    count, milli, memory_mib = ask.shape if ask is not None else (0, 0, 0)
    whole = ask is not None and milli == MILLI_PER_GPU
    if topology is not None and topology < TopologyLevel.NODE and not whole:
        raise pod.annotation_error(names.ANNOTATION_TOPOLOGY, "constrains where whole GPUs sit, and this pod asks "
                                   "for " + ("a share of one GPU" if ask else "no GPU"), "node, rack or zone")
    try:
        return Request(name=pod.key, cpu_milli=math.ceil(cpu * 1000), memory_mib=mib_up(memory),
                       gpu_count=count, gpu_milli=milli, gpu_memory_mib=memory_mib,
                       gpu_models=models if ask is not None else None, topology=topology)
    except InvalidInputError as error:  # host CPU/memory beyond what the book can hold, negative amounts
        raise pod.error(f"cpu {number_text(cpu)} memory {number_text(memory)}", error.message,
                        field=error.field or "resources",
                        accepted=error.accepted) from None


def pod_demand(pod: Mapping[str, Any], *, pod_groups: PodGroups | None = None,
               options: DialectOptions | None = None) -> PodDemand:
    """What ``pod`` (a Pod dict with the API's camelCase fields) asks of kubecell.

    ``pod_groups`` holds the PodGroup objects the caller knows, by (namespace, name), as their ``spec``;
    a pod naming one that is missing gets a group ``waiting_for`` it. Raises ``DemandError`` for an ask
    kubecell cannot accept; the message is written for the pod's Warning Event.
    """
    meta = PodMeta.of(pod)
    options = options or DialectOptions()
    totals = pod_totals(meta)
    hived = parse_hived(meta)
    asks = [ask for ask in (kubecell_ask(meta, totals, options), nvidia_ask(meta, totals, options),
                            aliyun_ask(meta, totals, options), alnair_ask(meta, totals, options),
                            kubeshare_ask(meta, options)) if ask is not None]
    if hived is not None:
        asks.append(GpuAsk("hived", names.HIVED_POD_SCHEDULING_SPEC,
                           f"annotation {names.HIVED_POD_SCHEDULING_SPEC}: leafCellNumber {hived.gpus}",
                           hived.gpus, MILLI_PER_GPU))
    ask = merge_asks(meta, asks)
    models, model_dialects = _models(meta, hived, options)
    claims = [claim for claim in (kubecell_group(meta), hived_group(hived), kubeshare_group(meta))
              if claim is not None]
    podgroups = podgroup_groups(meta, pod_groups or {})
    group = merge_groups(meta, claims + podgroups)
    vc = _vc(meta, hived)
    priority, priority_dialects = _priority(meta, hived)
    isolation = _isolation(meta, models if ask is not None else None)
    request = _request(meta, ask, totals, models, _topology(meta))
    if isolation == "mig":
        _check_mig(meta, request, request.gpu_models)
    used = {a.dialect for a in asks} | model_dialects | priority_dialects | {c.source for c in claims + podgroups}
    if hived is not None:
        used.add("hived")
    if any(key in meta.annotations for key in (names.ANNOTATION_VC, names.ANNOTATION_TOPOLOGY,
                                               names.ANNOTATION_ISOLATION, names.ANNOTATION_OPPORTUNISTIC)):
        used.add("kubecell")
    return PodDemand(pod=meta.key, request=request, group=group, vc=vc, priority=priority, isolation=isolation,
                     dialects=tuple(d for d in DIALECT_ORDER if d in used))
