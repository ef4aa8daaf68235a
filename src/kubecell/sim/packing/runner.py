"""Runs the packing experiment grid (policies x seeds), in parallel processes when asked.

Each worker process loads the node and pod lists once and returns only bucketed curves, so fanning
out costs one file parse per process, not per run.
"""

from __future__ import annotations

import functools
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


_SEED_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+))?\s*$")


def parse_seeds(text: str) -> list[int]:
    """'42-51' or '42,43,50' or '7' -> list of distinct non-negative seeds, in order."""
    seeds: list[int] = []
    for part in text.split(","):
        match = _SEED_RANGE.match(part)
        if match is None or (match.group(2) and int(match.group(2)) < int(match.group(1))):
            raise InvalidInputError(
                f"cannot read seeds {text!r} (at {part.strip()!r})",
                field="seeds",
                accepted="'42-51', '1,2,3' or '7' (non-negative integers, ranges low-high)",
            )
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) else low
        seeds.extend(range(low, high + 1))
    return list(dict.fromkeys(seeds))


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
    """Run every (policy, seed); results grouped per policy in the order given."""
    nodes_path, pods_path = str(nodes_path), str(pods_path)
    load_inputs(nodes_path, pods_path, allow_impossible)  # validate here, before forking work
    if inflate < 0:
        raise InvalidInputError(f"inflate {inflate} is negative", field="inflate", accepted="a ratio such as 1.3")
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
