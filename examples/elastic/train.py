"""A small elastic training job for torchrun: data-parallel regression on CPU (gloo), resumable at any step.

Run by ``torchrun --nnodes=MIN:MAX --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT train.py
--checkpoint DIR``. torchrun restarts every worker whenever the group changes (a worker joins, leaves or dies),
so the script treats each start as a resume: rank 0 writes a checkpoint (model, optimizer, step) every
``--checkpoint-every`` steps and when it is told to stop (SIGTERM: a shrink or a deletion gives the grace
period for it), and every start loads the newest one. The global batch is kept constant across sizes (each
rank takes ``batch / world_size`` examples), so the loss curve continues across resizes.

``DIR/steps.jsonl`` (appended by rank 0) is the run's record for whoever wants to check it: one
``{"resume": STEP, "world": N, ...}`` line each time the workers start (STEP is where the checkpoint put them),
then one ``{"step": S, "loss": L, "world": N, "seconds": T, "sync_seconds": T}`` line per optimizer step.

Gradients are averaged by one explicit ``all_reduce`` of all of them (and the loss) flattened into a single
tensor, rather than by DistributedDataParallel's hooks: the time spent in that call is exactly the step's
synchronisation time, which the step report (``kubecell.elastic.report``, when kubecell is installed) sends to
the scheduler beside the step time, for its goodput model. The first step of each start is not reported: it
carries the start's one-off costs (gloo's first collective, lazy initialisation), which would price every
placement as if it always paid them.

A model this small computes in microseconds, so two options stand in for the compute of a real one, to make the
job last long enough to be resized: ``--example-seconds`` sleeps that long per example of the rank's share of
the batch before synchronising (a larger world steps faster, as data-parallel training does, which is what the
scheduler's goodput model learns from the reports), and ``--step-seconds`` sleeps a fixed time after each step.

The model and data are built here from a fixed seed: nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

FEATURES = 32


class Reporter(Protocol):
    """What this script uses of ``kubecell.elastic.report.StepReporter``."""

    def step(self, *, step_seconds: float, sync_seconds: float, local_batch: int, accumulation_steps: int = 1,
             grad_sqr: float | None = None, grad_var: float | None = None) -> bool: ...

    def flush(self) -> bool: ...


def step_reporter() -> Reporter | None:
    """kubecell's step reporter when kubecell is importable (it does nothing outside a kubecell pod), else
    None: the script runs the same on any torchrun cluster, with or without kubecell installed."""
    try:
        from kubecell.elastic.report import StepReporter  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    reporter: Reporter = StepReporter.from_environment()
    return reporter


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="directory shared by every worker")
    parser.add_argument("--steps", type=int, default=200, help="total optimizer steps of the job")
    parser.add_argument("--batch", type=int, default=96, help="global batch size, kept across resizes")
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--step-seconds", type=float, default=0.0,
                        help="sleep after each step (counted as compute time), to make the job last")
    parser.add_argument("--example-seconds", type=float, default=0.0,
                        help="sleep per example of the rank's share of the batch, before synchronising: compute "
                             "that shrinks as the world grows")
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


@dataclass(frozen=True, slots=True)
class Synced:
    """One step's synchronisation: the mean loss over the world, the seconds the ``all_reduce`` took, and
    Pollux's gradient statistics (None with one replica: a single gradient has no spread to measure)."""

    loss: float
    seconds: float
    grad_sqr: float | None
    grad_var: float | None


def synchronise(net: nn.Module, loss: torch.Tensor, world: int) -> Synced:
    """Average the gradients over the world (what DistributedDataParallel does) with one ``all_reduce`` of
    every gradient, the loss and this replica's squared gradient norm, flattened together.

    The squared norms give the gradient statistics the step report asks for (``kubecell.elastic.report``):
    with ``n`` replicas, ``local_sqr`` the mean of their squared norms and ``total_sqr`` the averaged gradient's,
    ``grad_sqr = (n * total_sqr - local_sqr) / (n - 1)`` and ``grad_var = (local_sqr - total_sqr) / (n - 1)``
    (the global batch never changes here, so its ratio to the first is 1), both clamped at 0."""
    grads = [p.grad for p in net.parameters() if p.grad is not None]
    local = torch.cat([g.reshape(-1) for g in grads])
    flat = torch.cat([local, loss.detach().reshape(1), local.square().sum().reshape(1)])
    started = time.monotonic()
    dist.all_reduce(flat)
    seconds = time.monotonic() - started
    flat /= world
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
        offset += grad.numel()
    if world == 1:
        return Synced(float(flat[-2].item()), seconds, None, None)
    total_sqr = float(flat[:offset].square().sum().item())
    local_sqr = float(flat[-1].item())
    return Synced(float(flat[-2].item()), seconds, max(0.0, (world * total_sqr - local_sqr) / (world - 1)),
                  max(0.0, (local_sqr - total_sqr) / (world - 1)))


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
    for parameter in net.parameters():  # every rank starts from rank 0's copy, as DDP's constructor ensures
        dist.broadcast(parameter.data, src=0)
    reporter = step_reporter() if os.environ.get("LOCAL_RANK", "0") == "0" else None
    log = (args.checkpoint / "steps.jsonl").open("a") if rank == 0 else None
    if log is not None:
        log.write(json.dumps({"resume": step, "world": world, "time": time.time()}) + "\n")
        log.flush()
    print(f"rank {rank}/{world} resumes at step {step}", flush=True)
    warm = False
    while step < args.steps and not stopping["now"]:
        started = time.monotonic()
        inputs, targets = batch_of(step, rank, world, args.batch)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(net(inputs), targets)
        loss.backward()  # type: ignore[no-untyped-call]
        if args.example_seconds:
            time.sleep(args.example_seconds * len(inputs))
        synced = synchronise(net, loss, world)
        optimizer.step()
        step += 1
        if rank == 0 and step % args.checkpoint_every == 0:
            save(args.checkpoint, net, optimizer, step)
        if args.step_seconds:
            time.sleep(args.step_seconds)
        seconds = time.monotonic() - started
        if log is not None:
            log.write(json.dumps({"step": step, "loss": synced.loss, "world": world, "seconds": seconds,
                                  "sync_seconds": synced.seconds}) + "\n")
            log.flush()
        if reporter is not None and warm:
            reporter.step(step_seconds=seconds, sync_seconds=synced.seconds, local_batch=len(inputs),
                          grad_sqr=synced.grad_sqr, grad_var=synced.grad_var)
        warm = True
    if rank == 0:
        save(args.checkpoint, net, optimizer, step)
    if reporter is not None:
        reporter.flush()
    dist.destroy_process_group()
    print(f"rank {rank} stops at step {step}", flush=True)


if __name__ == "__main__":
    main()
