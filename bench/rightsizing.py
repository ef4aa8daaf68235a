"""Right-sizing on real production series: how much GPU the Alibaba GenAI serving pods (GenTD26: 143 Stable
Diffusion pods that each hold a whole GPU) would give back at the share ``kubecell profile recommend`` advises,
and how often the pods it is checked on would then have wanted more.

Honest split, so the advice is never judged on the data it came from: the pods are dealt at random (seeded)
into a history half and a check half, and, separately, every pod's first half-day is history and the rest is
the check (the same pods later: what an operator who sizes from yesterday sees today). Advice comes from the
history only (``core.rightsizing``'s default rule: the p90 of the pods' p90 utilization + 25 %, peak memory +
10 % + CUDA context); on the check side it reports the share of pods whose own p90 / p99 lies above the
advised share and the share of all samples above it (the time a pod would have been held back under an
enforced limit such as MPS's), and the GPU compute given back per pod.

    python bench/rightsizing.py [--data ../shared/data/alibaba-genai-v2026] [--seed 0]
"""

from __future__ import annotations

import argparse
import csv
import io
import random
import sys
import tarfile
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

from kubecell.core.model import MILLI_PER_GPU
from kubecell.core.rightsizing import Recommendation, UsageProfile, recommend
from kubecell.profiler.collect import sample_weights
from kubecell.profiler.distribution import distribution

DEFAULT_DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "alibaba-genai-v2026"
MIB = 2**20
Series = dict[str, list[tuple[float, float]]]


def load(path: Path) -> Series:
    rows: Series = defaultdict(list)
    with tarfile.open(path, "r:gz") as archive:
        member = next(m for m in archive.getmembers() if m.name.endswith(".csv"))
        handle = archive.extractfile(member)
        if handle is None:
            raise SystemExit(f"{path}: {member.name} is not a file")
        for row in csv.DictReader(io.TextIOWrapper(handle, encoding="utf-8")):
            rows[row["container_ip"]].append((float(row["timestamp_anon"]), float(row["value"])))
    for samples in rows.values():
        samples.sort()
    return dict(rows)


def deciles(samples: Sequence[tuple[float, float]], scale: float) -> tuple[float, ...]:
    times = [t for t, _ in samples]
    return distribution([v * scale for _, v in samples], sample_weights(times)).deciles


def profile(pod: str, util: Sequence[tuple[float, float]], memory: Sequence[tuple[float, float]]) -> UsageProfile:
    return UsageProfile(pod, tuple(min(1.0, v) for v in deciles(util, 0.01)), deciles(memory, 1 / MIB),
                        util[-1][0] - util[0][0])


def check(advice: Recommendation, util: Mapping[str, Sequence[tuple[float, float]]]) -> dict[str, float]:
    """On the check pods: shares above the advised share."""
    share = (advice.milli or MILLI_PER_GPU) / MILLI_PER_GPU
    over_p90 = over_p99 = samples_over = samples = 0
    for series in util.values():
        values = sorted(v / 100 for _, v in series)
        over_p90 += values[int(0.9 * (len(values) - 1))] > share
        over_p99 += values[int(0.99 * (len(values) - 1))] > share
        samples_over += sum(v > share for v in values)
        samples += len(values)
    pods = max(len(util), 1)
    return {"pods": len(util), "over_p90": over_p90 / pods, "over_p99": over_p99 / pods,
            "samples_over": samples_over / max(samples, 1)}


def report(title: str, advice: Recommendation, figures: Mapping[str, float]) -> None:
    milli = advice.milli or MILLI_PER_GPU
    print(f"{title}: {advice.jobs} pods of history -> {milli} milli-GPU, {advice.memory_mib} MiB per pod "
          f"(gives back {MILLI_PER_GPU - milli} milli-GPU of each whole GPU)")
    print(f"    on {figures['pods']:.0f} check pods: p90 above the share {figures['over_p90']:.1%}, "
          f"p99 above {figures['over_p99']:.1%}, samples above {figures['samples_over']:.2%}")
    print(f"    why: {advice.reason}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    util_path = args.data / "pod_gpu_duty_cycle_anon.tar.gz"
    memory_path = args.data / "pod_gpu_memory_used_bytes_anon.tar.gz"
    if not util_path.is_file() or not memory_path.is_file():
        print(f"GenTD26 series absent under {args.data} (see its SOURCE.md): nothing to measure", file=sys.stderr)
        return 2
    util, memory = load(util_path), load(memory_path)
    pods = sorted(pod for pod in util if pod in memory and len(util[pod]) >= 10 and len(memory[pod]) >= 10)
    means = sorted(sum(v for _, v in util[pod]) / len(util[pod]) for pod in pods)
    print(f"{len(pods)} pods with both series; median mean utilization {means[len(means) // 2]:.1f} %, "
          f"{sum(m < 10 for m in means) / len(means):.0%} of pods average under 10 %; each holds a whole GPU")

    shuffled = pods[:]
    random.Random(args.seed).shuffle(shuffled)
    history, held = shuffled[: len(pods) // 2], shuffled[len(pods) // 2:]
    advice = recommend("sd-serving", [profile(p, util[p], memory[p]) for p in history])
    report(f"pods split at random (seed {args.seed})", advice, check(advice, {p: util[p] for p in held}))

    early: list[UsageProfile] = []
    late: dict[str, list[tuple[float, float]]] = {}
    for pod in pods:
        cut = util[pod][0][0] + 12 * 3600
        before = [s for s in util[pod] if s[0] < cut]
        memory_before = [s for s in memory[pod] if s[0] < cut]
        after = [s for s in util[pod] if s[0] >= cut]
        if len(before) >= 10 and len(memory_before) >= 10 and after:
            early.append(profile(pod, before, memory_before))
            late[pod] = after
    advice = recommend("sd-serving", early)
    report("first 12 h of every pod -> the rest", advice, check(advice, late))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
