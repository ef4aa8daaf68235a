"""Runs the packing experiment grid (policies x seeds), in parallel processes when asked.

Each worker process loads the node and pod lists once and returns only bucketed curves, so fanning
out costs one file parse per process, not per run.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from kubecell.core.book import AllocationBook
from kubecell.core.errors import InvalidInputError
from kubecell.core.model import Node
from kubecell.core.placement.filters import Impossible, never_fits
from kubecell.core.placement.frag import TypicalPod
from kubecell.core.shown import shown
from kubecell.sim.packing.experiment import run_packing, typical_pods_of
from kubecell.sim.packing.metrics import PolicySummary, RunCurves, curves_of
from kubecell.sim.traces.openb import REQUEST_FIELD_COLUMNS, TracePod, load_nodes, load_pods


@dataclass(frozen=True, slots=True)
class PackingInputs:
    nodes: list[Node]
    pods: list[TracePod]
    typical: list[TypicalPod]
    impossible: list[tuple[TracePod, Impossible]]
    """Pods no node of the cluster could ever hold (replayed as failures only when allowed)."""


@functools.lru_cache(maxsize=8)
def load_inputs(nodes_path: str, pods_path: str, allow_impossible: bool = False) -> PackingInputs:
    """Parse and validate both lists once per process.

    A pod that no node could hold even on an empty cluster is an input error unless
    ``allow_impossible``: the FGD protocol replays such pods (a few 8-GPU pods of the gpuspec
    variants are pinned to models without 8-GPU nodes) and counts them as failed.
    """
    nodes = load_nodes(nodes_path)
    pods = load_pods(pods_path)
    book = AllocationBook(nodes)
    verdicts: dict[tuple[int, int, int, int, str], Impossible | None] = {}
    impossible: list[tuple[TracePod, Impossible]] = []
    for pod in pods:
        key = (pod.cpu_milli, pod.memory_mib, pod.gpu_count, pod.gpu_milli, pod.gpu_spec)
        if key not in verdicts:
            verdicts[key] = never_fits(book, pod.request())
        verdict = verdicts[key]
        if verdict is not None:
            impossible.append((pod, verdict))
    if impossible and not allow_impossible:
        pod, verdict = impossible[0]
        more = f" ({len(impossible) - 1} more such pods)" if len(impossible) > 1 else ""
        raise InvalidInputError(
            f"pod {pod.name!r} can never be placed on the cluster of {nodes_path}: {verdict.reason}{more}",
            location=f"{pods_path}:{pod.line}",
            field=REQUEST_FIELD_COLUMNS.get(verdict.field, verdict.field),
            accepted="requests that fit at least one node; pass --allow-impossible to replay such pods "
            "as failures, as the FGD protocol does",
        )
    return PackingInputs(nodes, pods, typical_pods_of(pods), impossible)


_SEED_RANGE = re.compile(r"^\s*(\d{1,18})\s*(?:-\s*(\d{1,18}))?\s*$")

MAX_SEEDS = 1000
"""Seeds one grid may run. Each seed is a full replay per placement policy (seconds on the bundled example,
tens of seconds on openb), so 1,000 seeds already mean hours; the FGD paper reports 10. The cap also
keeps a typo such as ``0-99999999999`` from allocating the list before anything runs."""

_SEEDS_ACCEPTED = (f"'42-51', '1,2,3' or '7' (non-negative integers of at most 18 digits, ranges low-high, at most "
                   f"{MAX_SEEDS} seeds: each is a full replay per placement policy, the FGD paper uses 10)")


def parse_seeds(text: str) -> list[int]:
    """'42-51' or '42,43,50' or '7' -> list of distinct non-negative seeds, in order.

    Every range is sized before it is expanded, so no input can make this allocate more than
    ``MAX_SEEDS`` seeds."""
    seeds: dict[int, None] = {}
    for part in text.split(","):
        match = _SEED_RANGE.match(part)
        if match is None:
            raise InvalidInputError(f"cannot read seeds {shown(text)} (at {shown(part.strip())})", field="seeds",
                                    accepted=_SEEDS_ACCEPTED)
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) else low
        if high < low:
            raise InvalidInputError(f"range goes down: {low}-{high}; write low-high, e.g. {high}-{low}",
                                    field="seeds", accepted=_SEEDS_ACCEPTED)
        if high - low + 1 > MAX_SEEDS:  # sized before expanding: '0-99999999999' must not allocate
            raise InvalidInputError(f"seed range {low}-{high} holds {high - low + 1:,} seeds, more than the "
                                    f"{MAX_SEEDS} one run may take", field="seeds", accepted=_SEEDS_ACCEPTED)
        seeds.update(dict.fromkeys(range(low, high + 1)))
        if len(seeds) > MAX_SEEDS:
            raise InvalidInputError(f"seeds {text.strip()!r} hold more than the {MAX_SEEDS} seeds one run may take",
                                    field="seeds", accepted=_SEEDS_ACCEPTED)
    return list(seeds)


def format_seeds(seeds: Sequence[int]) -> str:
    """The inverse of ``parse_seeds``: ``[42, 43, 44, 50]`` -> ``'42-44,50'`` (order kept), so a report can
    print the command that reproduces it."""
    parts: list[str] = []
    start = previous = None
    for seed in seeds:
        if previous is not None and seed == previous + 1:
            previous = seed
            continue
        if start is not None:
            parts.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = seed
    if start is not None:
        parts.append(str(start) if start == previous else f"{start}-{previous}")
    return ",".join(parts)


MAX_INFLATE = 2.0
"""Largest workload inflation the CLI accepts. Inflation appends pods until the arrived GPU request reaches
``inflate`` x the cluster's GPU capacity, and every reported figure lies at or below 130 % arrived
(``metrics.ARRIVED_PCT``); beyond 200 % each extra pod arrives at a cluster that has been full for a long
while, so it only adds run time and memory (``inf`` would append pods forever, ``13`` for ``1.3`` would
run ten times longer)."""


def check_inflate(inflate: float) -> float:
    """Reject inflation factors that cannot give a meaningful run, before any input is read."""
    accepted = (f"a share of the cluster's GPU capacity in (0, {MAX_INFLATE:g}], e.g. 1.3 (the FGD protocol); the "
                f"curves stop at 130 % arrived, so more only adds run time")
    if math.isnan(inflate):
        raise InvalidInputError("inflate nan is not a number", field="inflate", accepted=accepted)
    if math.isinf(inflate) and inflate > 0:
        raise InvalidInputError("inflate inf would append pods forever", field="inflate", accepted=accepted)
    if inflate <= 0:
        raise InvalidInputError(f"inflate {inflate:g} leaves no GPU load to measure", field="inflate",
                                accepted=accepted)
    if inflate > MAX_INFLATE:
        raise InvalidInputError(f"inflate {inflate:g} asks for {inflate * 100:,.0f} % of the cluster's GPU capacity",
                                field="inflate", accepted=accepted)
    return inflate


def check_measurable(inputs: PackingInputs, pods_path: str) -> None:
    """Stop before running when the run could measure nothing: every figure of the experiment is a share of
    GPU capacity taken by GPU requests, so a pod list without a GPU request leaves all of them undefined."""
    if not any(pod.gpu_count for pod in inputs.pods):
        raise InvalidInputError(
            f"the pod list has {len(inputs.pods)} pod(s) and none asks for a GPU: the packing experiment measures "
            "GPU allocation and fragmentation, "
            "which only GPU pods create", location=pods_path, field="num_gpu",
            accepted="a pod list with at least one pod whose num_gpu is 1 or more")


def _run_one(
    nodes_path: str, pods_path: str, policy: str, seed: int, inflate: float, allow_impossible: bool
) -> RunCurves:
    inputs = load_inputs(nodes_path, pods_path, allow_impossible)
    record = run_packing(inputs.nodes, inputs.pods, policy, seed, inflate=inflate, typical=inputs.typical)
    return curves_of(record)


def run_grid(
    nodes_path: str | Path,
    pods_path: str | Path,
    policies: Sequence[str],
    seeds: Sequence[int],
    *,
    inflate: float = 1.3,
    jobs: int = 1,
    allow_impossible: bool = False,
    on_done: Callable[[RunCurves], None] | None = None,
) -> list[PolicySummary]:
    """Run every (policy, seed); results grouped per policy in the order given.

    ``inflate`` is checked by ``check_inflate``, except 0, which replays the pod list unchanged."""
    nodes_path, pods_path = str(nodes_path), str(pods_path)
    if inflate != 0:  # 0 replays the list unchanged (library use; the CLI asks for a load)
        check_inflate(inflate)
    check_measurable(load_inputs(nodes_path, pods_path, allow_impossible), pods_path)  # before forking work
    summaries = {policy: PolicySummary(policy) for policy in policies}
    tasks = [(policy, seed) for policy in policies for seed in seeds]

    def record(curves: RunCurves) -> None:
        summaries[curves.policy].runs.append(curves)
        if on_done is not None:
            on_done(curves)

    if jobs <= 1 or len(tasks) <= 1:
        for policy, seed in tasks:
            record(_run_one(nodes_path, pods_path, policy, seed, inflate, allow_impossible))
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            pending: set[Future[RunCurves]] = {
                pool.submit(_run_one, nodes_path, pods_path, policy, seed, inflate, allow_impossible)
                for policy, seed in tasks
            }
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    record(future.result())
    for summary in summaries.values():
        summary.runs.sort(key=lambda run: run.seed)
    return list(summaries.values())
