"""What one pod's annotations can cost the scheduler: the time ``pod_demand`` takes to read (or refuse) a pod
whose annotation or label is a pathological value, for every name kubecell reads, worst first.

The scheduler reads a pod's demand on its scheduling thread each time the pod changes, and anyone who can
create a pod writes its annotations (the API server allows 256 KiB of them). So no value may cost more than
a few milliseconds: the HiveD spec's YAML once took 0.2-0.4 s (16 KiB of ``[1, 1, ...]``, docs/kubernetes.md).

    python bench/annotation_cost.py [--size 200000] [--repeats 3] [--top 10]

Each value is tried as an annotation and as a label (the API server would refuse most labels; the reader must
not care), with the best of ``--repeats`` timings. Values: long runs of ``[``, ``{a: ``, JSON objects, digits,
commas, spaces, quotes, aliases, non-ASCII text; and, for the HiveD spec, the densest YAML that fits under its
length bound. The baseline row is a valid HiveD spec.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from typing import Any

import kubecell.kube.names as names
from kubecell.kube.dialects.hived import MAX_SPEC_CHARS
from kubecell.kube.dialects.pod import pod_demand


def pathological(size: int) -> dict[str, str]:
    """Values of about ``size`` characters, each of a kind a reader might spend long on."""
    fit = MAX_SPEC_CHARS - 16
    return {
        "[ run": "[" * size, "{a: run": "{a: " * (size // 4), "JSON nesting": '{"a":' * (size // 5),
        "digits": "9" * size, "commas": "a," * (size // 2), "spaces": " " * size, "quotes": '"' * size,
        "aliases": "&a [*a]" * (size // 7), "non-ASCII": "\u00e9" * size, "YAML keys": "a: 1\n" * (size // 5),
        "JSON list": json.dumps({"v": 1, "x": ["a"] * (size // 6)}),
        "YAML values within the HiveD bound": "a: [" + ", ".join(["1"] * (fit // 3)) + "]",
        "YAML block list within the HiveD bound": "a:\n" + "- 1\n" * (fit // 4),
        "YAML [ within the HiveD bound": "a: " + "[" * (fit // 2) + "]" * (fit // 2),
        "YAML escapes within the HiveD bound": 'a: "' + "\\u00e9" * (fit // 6) + '"',
    }


def read_names() -> list[str]:
    """Every annotation and label name of ``kubecell.kube.names`` (``domain/name``)."""
    found = {value for value in vars(names).values()
             if isinstance(value, str) and "/" in value and "." in value.split("/", 1)[0] and " " not in value}
    return sorted(found)


def pod(where: str, key: str, value: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns", "uid": "u", "annotations": {}, "labels": {}},
        "spec": {"schedulerName": "kubecell", "containers": [
            {"name": "c", "image": "i", "resources": {"limits": {"kubecell.io/gpu-milli": "500"}}}]}}
    body["metadata"][where][key] = value
    return body


def timed(body: dict[str, Any], repeats: int) -> tuple[float, str]:
    best, outcome = float("inf"), ""
    for _ in range(repeats):
        trial = copy.deepcopy(body)
        started = time.perf_counter()
        try:
            pod_demand(trial)
            outcome = "read"
        except Exception as error:  # the outcome is reported, whatever it is
            outcome = type(error).__name__
        best = min(best, time.perf_counter() - started)
    return best, outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=200_000, help="characters per value (before length bounds)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args()
    valid = "virtualCluster: vc1\npriority: 0\nleafCellType: A100\nleafCellNumber: 1\n"
    baseline, _ = timed(pod("annotations", names.HIVED_POD_SCHEDULING_SPEC, valid), args.repeats)
    rows = []
    keys = read_names()
    for key in keys:
        for kind, value in pathological(args.size).items():
            for where in ("annotations", "labels"):
                seconds, outcome = timed(pod(where, key, value), args.repeats)
                rows.append((seconds, key, kind, where, outcome))
    rows.sort(reverse=True)
    print(f"{len(keys)} names x {len(pathological(args.size))} values x annotation/label; best of {args.repeats}")
    print(f"baseline: a valid HiveD spec, {baseline * 1000:.2f} ms")
    print(f"{'ms':>8}  {'x baseline':>10}  name / value / where -> outcome")
    for seconds, key, kind, where, outcome in rows[:args.top]:
        print(f"{seconds * 1000:8.2f}  {seconds / baseline:10.1f}  {key} / {kind} / {where} -> {outcome}")


if __name__ == "__main__":
    main()
