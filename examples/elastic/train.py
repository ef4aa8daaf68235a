"""A small elastic training job for torchrun: data-parallel regression on CPU (gloo), resumable at any step.

Run by ``torchrun --nnodes=MIN:MAX --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT train.py
--checkpoint DIR``. torchrun restarts every worker whenever the group changes (a worker joins, leaves or dies),
so the script treats each start as a resume: rank 0 writes a checkpoint (model, optimizer, step) every
``--checkpoint-every`` steps and when it is told to stop (SIGTERM: a shrink or a deletion gives the grace
period for it), and every start loads the newest one. The global batch is kept constant across sizes (each
rank takes ``batch / world_size`` examples), so the loss curve continues across resizes. Each step's loss
and world size are appended to ``DIR/steps.jsonl`` (rank 0) for whoever wants to check the run.

The model and data are built here from a fixed seed: nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

FEATURES = 32


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="directory shared by every worker")
    parser.add_argument("--steps", type=int, default=200, help="total optimizer steps of the job")
    parser.add_argument("--batch", type=int, default=96, help="global batch size, kept across resizes")
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep per step, to make the job last")
    parser.add_argument("--lr", type=float, default=0.1)
    return parser.parse_args()


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 64), nn.Tanh(), nn.Linear(64, 1))


def batch_of(step: int, rank: int, world: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rank's slice of the step's global batch: the same examples whatever the world size."""
    generator = torch.Generator().manual_seed(step)
    inputs = torch.randn(size, FEATURES, generator=generator)
    truth = torch.Generator().manual_seed(12345)
    weights = torch.randn(FEATURES, 1, generator=truth)
    targets = torch.tanh(inputs @ weights / FEATURES**0.5) + 0.01 * torch.randn(size, 1, generator=generator)
    share = size // world
    start = rank * share
    stop = size if rank == world - 1 else start + share
    return inputs[start:stop], targets[start:stop]


def load(directory: Path, net: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    path = directory / "checkpoint.pt"
    if not path.exists():
        return 0
    state: dict[str, Any] = torch.load(path, weights_only=True)
    net.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])


def save(directory: Path, net: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    """Written to a temporary name and renamed: a worker killed mid-write leaves the previous checkpoint."""
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / f"checkpoint.pt.{os.getpid()}"
    torch.save({"model": net.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, partial)
    partial.replace(directory / "checkpoint.pt")


def main() -> None:
    args = parse()
    stopping = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stopping.update(now=True))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr)
    args.checkpoint.mkdir(parents=True, exist_ok=True)
    step = load(args.checkpoint, net, optimizer)
    ddp = DistributedDataParallel(net)
    log = (args.checkpoint / "steps.jsonl").open("a") if rank == 0 else None
    print(f"rank {rank}/{world} resumes at step {step}", flush=True)
    while step < args.steps and not stopping["now"]:
        started = time.monotonic()
        inputs, targets = batch_of(step, rank, world, args.batch)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(ddp(inputs), targets)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        step += 1
        if log is not None:
            log.write(json.dumps({"step": step, "loss": total.item() / world, "world": world,
                                  "seconds": time.monotonic() - started}) + "\n")
            log.flush()
        if rank == 0 and step % args.checkpoint_every == 0:
            save(args.checkpoint, net, optimizer, step)
        if args.step_seconds:
            time.sleep(args.step_seconds)
    if rank == 0:
        save(args.checkpoint, net, optimizer, step)
    dist.destroy_process_group()
    print(f"rank {rank} stops at step {step}", flush=True)


if __name__ == "__main__":
    main()
