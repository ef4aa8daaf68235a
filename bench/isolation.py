"""MPS isolation on a real GPU: does the memory limit hold, and what compute share does each client get?

Runs on a machine with an NVIDIA GPU, the MPS control binary (``nvidia-cuda-mps-control``) and PyTorch:

    python bench/isolation.py [--gpu 0] [--seconds 10] [--shares 50 25] [--memory-mib 2048]

1. A baseline: one process alone multiplies matrices for ``--seconds`` (matmuls/s = 100 %).
2. Under one MPS control daemon for that GPU (pipe and log directories as the node agent makes them),
   one client per share runs the same loop at once with ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` = its share;
   each client's throughput is divided by the baseline (the target: within 15 % of its share).
3. A client with ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` = ``--memory-mib`` tries to allocate twice that:
   the limit held if the allocation fails.

Prints one line per measure. Without a GPU, PyTorch with CUDA, or the MPS binary it prints why and exits
0 (a skip, not a failure), so it can run anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NoReturn

CLIENT = r"""
import json, os, sys, time
import torch
mode, seconds, limit = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
torch.cuda.init()
if mode == "memory":
    try:
        block = torch.empty(2 * limit * 2**20, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        print(json.dumps({"allocated_mib": 2 * limit, "held": False}))
    except RuntimeError as error:
        print(json.dumps({"held": True, "error": str(error)[:120]}))
    sys.exit(0)
a = torch.randn(4096, 4096, device="cuda"); b = torch.randn(4096, 4096, device="cuda")
torch.cuda.synchronize(); done = 0; end = time.monotonic() + seconds
while time.monotonic() < end:
    for _ in range(8):
        a @ b
    torch.cuda.synchronize(); done += 8
print(json.dumps({"matmuls_per_second": done / seconds}))
"""


def skip(reason: str) -> NoReturn:
    print(f"skipped: {reason}")
    raise SystemExit(0)


def run_clients(script: Path, env: dict[str, str], clients: list[dict[str, str]], mode: str, seconds: float,
                limit: int) -> list[dict[str, float]]:
    processes = [subprocess.Popen([sys.executable, str(script), mode, str(seconds), str(limit)],
                                  env={**env, **extra}, stdout=subprocess.PIPE, text=True) for extra in clients]
    results = []
    for process in processes:
        out, _ = process.communicate(timeout=seconds + 120)
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--shares", type=int, nargs="+", default=[50, 25])
    parser.add_argument("--memory-mib", type=int, default=2048)
    args = parser.parse_args()
    if shutil.which("nvidia-smi") is None:
        skip("no NVIDIA driver (nvidia-smi not found)")
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        skip("nvidia-cuda-mps-control not found (MPS is part of the CUDA driver package)")
    try:
        import torch  # type: ignore[import-not-found,unused-ignore]  # torch is an optional extra
    except ImportError:
        skip("PyTorch is not installed")
    if not torch.cuda.is_available():
        skip("PyTorch sees no CUDA GPU")
    with tempfile.TemporaryDirectory(prefix="kubecell-mps-") as scratch:
        root = Path(scratch)
        script = root / "client.py"
        script.write_text(CLIENT)
        base = {**os.environ, "CUDA_VISIBLE_DEVICES": str(args.gpu)}
        alone = run_clients(script, base, [{}], "compute", args.seconds, 0)[0]["matmuls_per_second"]
        print(f"baseline, one process alone: {alone:.1f} matmuls/s")
        mps = {**base, "CUDA_MPS_PIPE_DIRECTORY": str(root / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(root / "log")}
        for directory in ("pipe", "log"):
            (root / directory).mkdir()
        subprocess.run([control, "-d"], env=mps, check=True, timeout=30)
        try:
            shares = [{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(share)} for share in args.shares]
            for share, result in zip(args.shares, run_clients(script, mps, shares, "compute", args.seconds, 0),
                                     strict=True):
                achieved = 100 * result["matmuls_per_second"] / alone
                verdict = "within 15 %" if abs(achieved - share) <= 0.15 * share else "OUTSIDE 15 %"
                print(f"client with share {share} %: achieved {achieved:.1f} % of the baseline ({verdict})")
            memory = run_clients(script, mps, [{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={args.memory_mib}M"}],
                                 "memory", 0, args.memory_mib)[0]
            print(f"memory limit {args.memory_mib} MiB, allocating twice that: "
                  f"{'held (allocation refused)' if memory['held'] else 'NOT held'}")
        finally:
            subprocess.run([control], input="quit\n", env=mps, text=True, timeout=30, check=False)


if __name__ == "__main__":
    main()
