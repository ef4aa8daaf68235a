"""Reproduce the FGD paper's packing results (ATC'23) on every openb pod list we have.

For each pod list in ../shared/data/alibaba-gpu-v2023-openb/csv that the authors published results for,
run the six baselines over seeds 42..51 and print, per trace and policy, unallocated GPU % at 130 % and
100 % arrived workload: ours, published (the authors' expected_results, mean of their 10 seeds), delta.
Also checks that the policies rank in the published order.

    python bench/fgd_reproduction.py [--seeds 42-51] [--jobs 2] [--traces default,cpu050] [--markdown]

Results are also written to bench/results/fgd_reproduction.json and per-trace report folders.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import numpy as np

from kubecell.core.placement.registry import FGD_BASELINES
from kubecell.sim.packing.report import write_curves, write_plots, write_summary
from kubecell.sim.packing.runner import parse_seeds, run_grid

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / ".." / "shared" / "data" / "alibaba-gpu-v2023-openb"
PUBLISHED_NAMES = {
    "01-Random": "random",
    "02-DotProd": "dotprod",
    "03-GpuClustering": "gpuclustering",
    "04-GpuPacking": "gpupacking",
    "05-BestFit": "bestfit",
    "06-FGD": "fgd",
}


def published_results(data: Path) -> dict[tuple[str, str], dict[str, float]]:
    """(trace, policy) -> unallocated GPU % at 100 and 130 %, mean over the authors' seeds."""
    per_seed: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with (data / "expected_results" / "analysis_allo_discrete.csv").open(newline="") as handle:
        for row in csv.DictReader(handle):
            trace = row["workload"].removeprefix("openb_pod_list_")
            policy = PUBLISHED_NAMES.get(row["sc_policy"])
            if policy is None or not row.get("130") or not row.get("100"):
                continue
            per_seed.setdefault((trace, policy), []).append((100 - float(row["100"]), 100 - float(row["130"])))
    return {
        key: {"at_100": float(np.mean([v[0] for v in values])), "at_130": float(np.mean([v[1] for v in values]))}
        for key, values in per_seed.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--traces", default="", help="comma-separated trace names (default: all present)")
    parser.add_argument("--placement", default=",".join(FGD_BASELINES), help="comma-separated placement policies")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()

    if not (DATA / "csv").is_dir():
        print(f"skipped: {DATA / 'csv'} is absent (the openb trace lives in ../shared/data)")
        return 0
    published = published_results(DATA)
    available = sorted(p.stem.removeprefix("openb_pod_list_") for p in (DATA / "csv").glob("openb_pod_list_*.csv"))
    wanted = [t for t in args.traces.split(",") if t] or [t for t in available if (t, "fgd") in published]
    missing = [t for t in wanted if t not in available]
    if missing:
        print(f"skipped traces not present in {DATA / 'csv'}: {', '.join(missing)}")
    traces = [t for t in wanted if t in available]
    policies = [p.strip().lower() for p in args.placement.split(",") if p.strip()]
    seeds = parse_seeds(args.seeds)
    nodes = DATA / "csv" / "openb_node_list_gpu_node.csv"

    rows: list[dict[str, object]] = []
    for trace in traces:
        started = time.perf_counter()
        summaries = run_grid(nodes, DATA / "csv" / f"openb_pod_list_{trace}.csv", policies, seeds, jobs=args.jobs,
                             allow_impossible=True)
        out = args.out / trace
        write_summary(out, summaries, {"trace": trace, "seeds": seeds})
        write_curves(out, summaries)
        write_plots(out, summaries, title=f"openb {trace}")
        for summary in summaries:
            ours100 = summary.at("unallocated_pct", 100)
            ours130 = summary.at("unallocated_pct", 130)
            ref = published.get((trace, summary.policy))
            rows.append(
                {
                    "trace": trace,
                    "policy": summary.policy,
                    "ours_at_130": ours130.mean,
                    "ours_sd_at_130": ours130.sd,
                    "published_at_130": ref["at_130"] if ref else None,
                    "ours_at_100": ours100.mean,
                    "published_at_100": ref["at_100"] if ref else None,
                    "seconds": summary.seconds,
                }
            )
        print(f"# {trace}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)

    header = ["trace", "policy", "ours @130", "published @130", "delta @130", "ours @100", "published @100",
              "delta @100"]
    lines = []
    for row in rows:
        def fmt(value: object) -> str:
            return f"{value:.2f}" if isinstance(value, float) else "n/a"

        p130, p100 = row["published_at_130"], row["published_at_100"]
        d130 = row["ours_at_130"] - p130 if isinstance(p130, float) else None  # type: ignore[operator]
        d100 = row["ours_at_100"] - p100 if isinstance(p100, float) else None  # type: ignore[operator]
        lines.append([str(row["trace"]), str(row["policy"]), fmt(row["ours_at_130"]), fmt(p130),
                      f"{d130:+.2f}" if d130 is not None else "n/a", fmt(row["ours_at_100"]), fmt(p100),
                      f"{d100:+.2f}" if d100 is not None else "n/a"])
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for line in lines:
            print("| " + " | ".join(line) + " |")
    else:
        widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)] if lines else []
        print("  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
        for line in lines:
            print("  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)))

    worst = max((abs(float(r["ours_at_130"]) - float(r["published_at_130"]))  # type: ignore[arg-type]
                 for r in rows if r["published_at_130"] is not None), default=float("nan"))
    rank_ok = []
    for trace in traces:
        mine = [r for r in rows if r["trace"] == trace and r["published_at_130"] is not None]
        ours = [r["policy"] for r in sorted(mine, key=lambda r: float(r["ours_at_130"]))]  # type: ignore[arg-type]
        theirs = [r["policy"] for r in sorted(mine, key=lambda r: float(r["published_at_130"]))]  # type: ignore[arg-type]
        rank_ok.append(ours == theirs)
        if ours != theirs:
            print(f"rank differs on {trace}: ours {ours} vs published {theirs}")
    print(f"largest |delta| at 130 %: {worst:.2f} points; same ranking on {sum(rank_ok)}/{len(rank_ok)} traces")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fgd_reproduction.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
