"""Generates the bundled example cluster and workload from published shape statistics.

The example must run on a laptop in seconds and look like a production GPU cluster without copying
any trace. It is drawn, with a fixed seed, from figures published about the Alibaba GPU trace v2023
(FGD, ATC'23 and the trace's documentation): ~13 % of pods are CPU-only; ~44 % of GPU pods share one
GPU, with per-GPU shares concentrated on a few values; multi-GPU pods are rare but carry ~7 % of the
GPU request; ~10 % of GPU pods are pinned to GPU models; the cluster mixes 8-GPU training nodes with
2- and 4-GPU inference nodes. The total GPU request is sized to ~100 % of capacity so the packing
experiment's inflation to 130 % has work to do.

Run ``python -m kubecell.sim.examples.generate`` to rewrite ``nodes.csv`` and ``pods.csv`` next to
this file; the output is deterministic.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SEED = 20231122

# (count, vCPU, memory GiB, GPUs, model): eight shapes, 64 nodes, 286 GPUs.
NODE_SHAPES = (
    (18, 96, 384, 8, "A100"),
    (6, 128, 768, 8, "V100M32"),
    (16, 104, 512, 2, "T4"),
    (6, 96, 384, 4, "T4"),
    (8, 64, 256, 2, "P100"),
    (4, 32, 128, 4, "V100M16"),
    (4, 8, 32, 1, "V100M16"),
    (2, 128, 1024, 1, "A10"),
)

SHARE_VALUES = (810, 470, 320, 650, 250, 500, 100, 200, 900, 300, 400, 600)
SHARE_WEIGHTS = (30, 21, 9, 7, 6, 6, 5, 5, 4, 3, 2, 2)
CPU_CHOICES_GPU = (2, 4, 6, 8, 12, 16, 24, 32)
CPU_WEIGHTS_GPU = (8, 20, 14, 24, 12, 12, 6, 4)
CPU_CHOICES_CPU_ONLY = (1, 2, 4, 8, 16, 32)
CPU_WEIGHTS_CPU_ONLY = (10, 22, 28, 22, 12, 6)
MODEL_CONSTRAINTS = ("A100", "T4", "V100M16|V100M32", "P100|T4")
MULTI_GPU_CONSTRAINTS = ("A100", "V100M32", "A100|V100M32")


def _choice(rng: np.random.Generator, values: tuple[int, ...], weights: tuple[int, ...]) -> int:
    p = np.array(weights, dtype=float)
    return int(values[int(rng.choice(len(values), p=p / p.sum()))])


def generate(out: Path = HERE, seed: int = SEED) -> tuple[Path, Path]:
    rng = np.random.default_rng(seed)
    nodes_path, pods_path = out / "nodes.csv", out / "pods.csv"
    capacity = 0
    with nodes_path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["sn", "cpu_milli", "memory_mib", "gpu", "model"])
        index = 0
        for count, vcpu, mem_gib, gpus, model in NODE_SHAPES:
            for _ in range(count):
                writer.writerow([f"example-node-{index:03d}", vcpu * 1000, mem_gib * 1024, gpus, model])
                capacity += gpus * 1000
                index += 1

    pods: list[list[object]] = []
    requested = 0
    index = 0
    while requested < capacity:
        kind = rng.random()
        spec = ""
        if kind < 0.133:
            cpu = _choice(rng, CPU_CHOICES_CPU_ONLY, CPU_WEIGHTS_CPU_ONLY)
            gpus, milli = 0, 0
        else:
            cpu = _choice(rng, CPU_CHOICES_GPU, CPU_WEIGHTS_GPU)
            roll = rng.random()
            if roll < 0.44:
                gpus, milli = 1, _choice(rng, SHARE_VALUES, SHARE_WEIGHTS)
            elif roll < 0.985:
                gpus, milli = 1, 1000
            else:
                gpus, milli = _choice(rng, (2, 4, 8), (4, 3, 3)), 1000
                cpu = min(cpu * gpus // 2, 64)
            if rng.random() < 0.10:
                choices = MODEL_CONSTRAINTS if gpus == 1 else MULTI_GPU_CONSTRAINTS
                spec = choices[int(rng.integers(len(choices)))]
        memory = int(cpu * 1024 * rng.choice((2, 3, 4, 6)))
        pods.append([f"example-pod-{index:04d}", cpu * 1000, memory, gpus, milli, spec])
        requested += gpus * milli
        index += 1
    with pods_path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec"])
        writer.writerows(pods)
    return nodes_path, pods_path


if __name__ == "__main__":
    for path in generate():
        print(path)
