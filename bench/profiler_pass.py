"""What observing sharing costs one profiling pass, on a real Prometheus.

    python bench/profiler_pass.py [--gpus 64] [--hours 2] [--scrape 15] [--repeat 3]

A synthetic cluster: ``--gpus`` GPUs, 8 to a node, each shared by two time-sliced pods of two families (a Job
each, half a GPU each): the first runs the whole window, the second joins halfway. Their series carry the node
agent's names and labels (``kubecell_node_gpu_pod_utilization_ratio`` and ``..._memory_bytes``), one sample
every ``--scrape`` seconds over ``--hours``, backfilled into a real Prometheus (Debian's ``prometheus`` and
``promtool``) on 127.0.0.1, with a job history in SQLite in a temporary directory.

The same jobs are profiled ``--repeat`` times each way, alternating:

- **without** observing sharing: what a pass did before (``record_of`` without partners);
- **with** it: ``profile_jobs``, which also reads every pod's series on each GPU a share job used.

It prints the best wall time of each way, the Prometheus queries of each, and the ratio; and, as a check, the
pairs the history then reads back (each family's speed beside the other, from the utilizations chosen below).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubecell.kube.names import ANNOTATION_ALLOCATION
from kubecell.kube.records import AllocationRecord, GpuGrant
from kubecell.profiler.history import JobHistory
from kubecell.profiler.jobs import FoundJob, group_pods
from kubecell.profiler.pairs import pair_speeds
from kubecell.profiler.prometheus import Prometheus
from kubecell.profiler.run import profile_jobs, record_of
from kubecell.testbed.prometheus import (
    BASE_TIME,
    CountingPrometheus,
    Family,
    PrometheusMissingError,
    backfilled,
    binaries,
)

FIRST_ALONE, FIRST_BESIDE, SECOND = 0.6, 0.3, 0.5
"""Busy fractions: the first pod alone, then beside the second; the second beside the first."""


def pod(name: str, family: str, node: str, gpu: str, start: float) -> dict[str, Any]:
    uid = f"uid-{name}"
    stamp = datetime.fromtimestamp(start, UTC)
    record = AllocationRecord(allocation_id=f"{uid}-0", pod_uid=uid, attempt=0, node=node,
                              gpus=[GpuGrant(index=0, uuid=gpu, milli=500, memory_mib=1000)], cpu_milli=0,
                              memory_mib=0, isolation="accounting", job=f"bench/{name}", vc="v",
                              job_class="guaranteed", member=0, batch=1, scheduler="kubecell", created_at=stamp)
    text = stamp.isoformat().replace("+00:00", "Z")
    return {"metadata": {"name": name, "namespace": "bench", "uid": uid, "creationTimestamp": text,
                         "ownerReferences": [{"kind": "Job", "name": name.rsplit("-", 1)[0],
                                              "uid": f"owner-{name}", "controller": True}],
                         "annotations": {ANNOTATION_ALLOCATION: record.to_annotation()}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "img:1", "resources": {
                "limits": {"kubecell.io/gpu-milli": "500", "kubecell.io/gpu-memory": "1000"}}}]},
            "status": {"phase": "Running", "startTime": text}}


def cluster(gpus: int, hours: float, scrape: float) -> tuple[list[dict[str, Any]], list[Family]]:
    """The pods and their series (see the module)."""
    samples = int(hours * 3600 / scrape)
    half = samples // 2
    pods: list[dict[str, Any]] = []
    util: list[tuple[dict[str, str], list[tuple[float, float]]]] = []
    memory: list[tuple[dict[str, str], list[tuple[float, float]]]] = []
    for index in range(gpus):
        node, gpu = f"node-{index // 8}", f"GPU-{index:04d}"
        first, second = f"resnet-{index}-x", f"bert-{index}-y"
        pods += [pod(first, "resnet", node, gpu, BASE_TIME), pod(second, "bert", node, gpu, BASE_TIME + half * scrape)]
        labels = {"namespace": "bench", "node": node, "gpu": gpu}
        first_series = [(BASE_TIME + i * scrape, FIRST_ALONE if i < half else FIRST_BESIDE) for i in range(samples)]
        second_series = [(BASE_TIME + i * scrape, SECOND) for i in range(half, samples)]
        for name, series in ((first, first_series), (second, second_series)):
            util.append(({**labels, "pod": name}, series))
            memory.append(({**labels, "pod": name}, [(t, 2.0**30) for t, _ in series]))
    return pods, [Family("kubecell_node_gpu_pod_utilization_ratio", "gauge", util),
                  Family("kubecell_node_gpu_pod_memory_bytes", "gauge", memory)]


def without_sharing(jobs: list[FoundJob], client: Prometheus, history: JobHistory, now: datetime) -> None:
    for job in jobs:
        history.save(record_of(job, client, now))


@contextmanager
def timed(into: list[float]) -> Iterator[None]:
    started = time.perf_counter()
    yield
    into.append(time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--hours", type=float, default=2.0)
    parser.add_argument("--scrape", type=float, default=15.0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if args.gpus < 1 or args.hours <= 0 or args.scrape <= 0 or args.repeat < 1:
        sys.exit("--gpus and --repeat must be at least 1, --hours and --scrape above 0")
    pods, families = cluster(args.gpus, args.hours, args.scrape)
    jobs = group_pods(pods)
    now = datetime.fromtimestamp(BASE_TIME + args.hours * 3600, UTC)
    try:
        binaries()
    except PrometheusMissingError as error:
        sys.exit(f"{error}; this bench needs a real Prometheus")
    before: list[float] = []
    after: list[float] = []
    queries = {"without": 0, "with": 0}
    with tempfile.TemporaryDirectory() as scratch, backfilled(Path(scratch) / "prometheus", families) as url:
        client = CountingPrometheus(url)
        with JobHistory.open(f"sqlite:///{Path(scratch) / 'history.db'}") as history:
            for _ in range(args.repeat):
                client.queries.clear()
                with timed(before):
                    without_sharing(jobs, client, history, now)
                queries["without"] = len(client.queries)
                client.queries.clear()
                with timed(after):
                    profile_jobs(jobs, client, history, now=now)
                queries["with"] = len(client.queries)
            speeds = {(p.family, p.partner): p.speed for p in pair_speeds(history.sharing())}
    print(f"{len(jobs)} share jobs on {args.gpus} GPUs, {args.hours:g} h of samples every {args.scrape:g} s "
          f"(best of {args.repeat})")
    print(f"  without observing sharing: {min(before):6.2f} s, {queries['without']} queries")
    print(f"  with it:                   {min(after):6.2f} s, {queries['with']} queries")
    print(f"  ratio: {min(after) / min(before):.2f}x time, {queries['with'] / queries['without']:.2f}x queries; "
          f"{1000 * (min(after) - min(before)) / len(jobs):.1f} ms more per job")
    print(f"  read back: resnet beside bert {speeds.get(('bench/resnet', 'bench/bert'))} "
          f"(expected {FIRST_BESIDE / FIRST_ALONE:g}), bert beside resnet {speeds.get(('bench/bert', 'bench/resnet'))} "
          "(no time alone: none)")


if __name__ == "__main__":
    main()
