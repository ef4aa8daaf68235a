"""A small elastic training job for torchrun: data-parallel regression on CPU (gloo), resumable at any step.

Run by ``torchrun --nnodes=MIN:MAX --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT train.py
--checkpoint DIR``. torchrun restarts every worker whenever the group changes (a worker joins, leaves or dies),
so the script treats each start as a resume: rank 0 writes a checkpoint (model, optimizer, step, what the
batch advisor learned) every ``--checkpoint-every`` steps and when it is told to stop (SIGTERM: a shrink or a
deletion gives the grace period for it), and every start loads the newest one.

The batch: where the ElasticJob bounds it (``spec.batchSize``, handed to the workers as
``KUBECELL_BATCH_SIZE_MIN``/``_MAX``) and kubecell is importable, the global batch is the one the job's goodput
model chooses for the world it runs in (``kubecell.elastic.batch``, Pollux's adaptive batch: the batch the
scheduler priced when it sized the job), chosen at each start and again every ``--choose-every`` steps (rank 0
chooses, every rank follows), with SGD's learning rate scaled by AdaScale's gain (capped at
``--max-lr-scale``). Otherwise the global batch is ``--batch`` at every size. Either way each rank takes its
share of the step's examples (``batch / world_size``), in micro-batches of at most ``--max-local-batch``.

``DIR/steps.jsonl`` (appended by rank 0) is the run's record for whoever wants to check it: one
``{"resume": STEP, "world": N, ...}`` line each time the workers start (STEP is where the checkpoint put them),
then one ``{"step": S, "loss": L, "world": N, "seconds": T, "sync_seconds": T, "batch": B, "local": b,
"accumulation": k, "lr_scale": r}`` line per optimizer step.

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


class Chosen(Protocol):
    """What this script uses of ``kubecell.elastic.batch.Batch``."""

    @property
    def local_batch(self) -> int: ...

    @property
    def accumulation_steps(self) -> int: ...

    @property
    def lr_scale(self) -> float: ...


class Advisor(Protocol):
    """What this script uses of ``kubecell.elastic.batch.BatchAdvisor``."""

    min_batch: int

    def batch(self) -> Chosen: ...

    def observe(self, *, step_seconds: float, sync_seconds: float, local_batch: int, accumulation_steps: int = 1,
                grad_sqr: float | None = None, grad_var: float | None = None) -> bool: ...

    def state_dict(self) -> dict[str, Any]: ...


def batch_advisor(args: argparse.Namespace, state: dict[str, Any] | None) -> Advisor | None:
    """kubecell's batch advisor when kubecell is importable (with no batch range in the environment it keeps
    ``--batch``), else None: the script then trains at ``--batch``."""
    try:
        from kubecell.elastic.batch import BatchAdvisor  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    advisor: Advisor = BatchAdvisor.from_environment(default_batch=args.batch, max_local_batch=args.max_local_batch,
                                                     gpu_type="cpu", state=state)
    return advisor


def step_reporter(max_local_batch: int) -> Reporter | None:
    """kubecell's step reporter when kubecell is importable (it does nothing outside a kubecell pod), else
    None: the script runs the same on any torchrun cluster, with or without kubecell installed. It states the
    largest micro-batch the script runs (``--max-local-batch``), so the scheduler prices the accumulation."""
    try:
        from kubecell.elastic.report import StepReporter  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    reporter: Reporter = StepReporter.from_environment(max_local_batch=max_local_batch)
    return reporter


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="directory shared by every worker")
    parser.add_argument("--steps", type=int, default=200, help="total optimizer steps of the job")
    parser.add_argument("--batch", type=int, default=96,
                        help="global batch size, kept across resizes where the job sets no batch range")
    parser.add_argument("--max-local-batch", type=int, default=512,
                        help="the largest micro-batch a worker runs in one pass (beyond it, it accumulates)")
    parser.add_argument("--choose-every", type=int, default=20,
                        help="steps between two choices of the batch within one start")
    parser.add_argument("--max-lr-scale", type=float, default=4.0,
                        help="cap on AdaScale's learning-rate gain (this small model's SGD diverges beyond)")
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
    """The rank's slice of the step's global batch of ``size`` examples: the same examples whatever the world
    size."""
    generator = torch.Generator().manual_seed(step)
    inputs = torch.randn(size, FEATURES, generator=generator)
    truth = torch.Generator().manual_seed(12345)
    weights = torch.randn(FEATURES, 1, generator=truth)
    targets = torch.tanh(inputs @ weights / FEATURES**0.5) + 0.01 * torch.randn(size, 1, generator=generator)
    share = size // world
    start = rank * share
    stop = size if rank == world - 1 else start + share
    return inputs[start:stop], targets[start:stop]


def load(directory: Path, net: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[int, dict[str, Any] | None]:
    """The step to resume at and the batch advisor's saved state (None: none saved)."""
    path = directory / "checkpoint.pt"
    if not path.exists():
        return 0, None
    state: dict[str, Any] = torch.load(path, weights_only=True)
    net.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"]), state.get("batch_advisor")


def save(directory: Path, net: nn.Module, optimizer: torch.optim.Optimizer, step: int,
         advisor: Advisor | None) -> None:
    """Written to a temporary name and renamed: a worker killed mid-write leaves the previous checkpoint."""
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / f"checkpoint.pt.{os.getpid()}"
    state = {"model": net.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
    if advisor is not None:
        state["batch_advisor"] = advisor.state_dict()
    torch.save(state, partial)
    partial.replace(directory / "checkpoint.pt")


@dataclass(frozen=True, slots=True)
class Synced:
    """One step's synchronisation: the mean loss over the world, the seconds the ``all_reduce`` took, and
    Pollux's gradient statistics (None with one replica: a single gradient has no spread to measure)."""

    loss: float
    seconds: float
    grad_sqr: float | None
    grad_var: float | None


def synchronise(net: nn.Module, loss: torch.Tensor, world: int, scale: float) -> Synced:
    """Average the gradients over the world (what DistributedDataParallel does) with one ``all_reduce`` of
    every gradient, the loss and this replica's squared gradient norm, flattened together.

    The squared norms give the gradient statistics the step report asks for (``kubecell.elastic.report``):
    with ``n`` replicas, ``local_sqr`` the mean of their squared norms and ``total_sqr`` the averaged gradient's,
    ``grad_sqr = (n * total_sqr - local_sqr) / (n - 1)`` and ``grad_var = (local_sqr - total_sqr) * scale / (n - 1)``
    with ``scale`` the global batch over the initial one (the variance of a gradient of the initial batch),
    both clamped at 0. A replica's gradient is the mean of its accumulated micro-batches: one sample of ``n``."""
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
                  max(0.0, (local_sqr - total_sqr) * scale / (world - 1)))


def choose(advisor: Advisor | None, args: argparse.Namespace, world: int) -> tuple[int, int, float]:
    """``(local batch, accumulation steps, learning-rate scale)``: rank 0's choice, broadcast, so that every rank
    trains at the same batch whatever each one's advisor learned."""
    if advisor is not None:
        chosen = advisor.batch()
        local, accumulation, scale = chosen.local_batch, chosen.accumulation_steps, chosen.lr_scale
    else:
        share = -(-args.batch // world)
        accumulation = -(-share // args.max_local_batch)
        local, scale = -(-share // accumulation), 1.0
    agreed = torch.tensor([float(local), float(accumulation), min(scale, args.max_lr_scale)], dtype=torch.float64)
    dist.broadcast(agreed, src=0)
    return int(agreed[0].item()), int(agreed[1].item()), float(agreed[2].item())


def main() -> None:
    args = parse()
    stopping = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stopping.update(now=True))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr)
    args.checkpoint.mkdir(parents=True, exist_ok=True)
    step, saved = load(args.checkpoint, net, optimizer)
    for parameter in net.parameters():  # every rank starts from rank 0's copy, as DDP's constructor ensures
        dist.broadcast(parameter.data, src=0)
    advisor = batch_advisor(args, saved)
    initial = advisor.min_batch if advisor is not None else args.batch
    reporter = step_reporter(args.max_local_batch) if os.environ.get("LOCAL_RANK", "0") == "0" else None
    log = (args.checkpoint / "steps.jsonl").open("a") if rank == 0 else None
    local, accumulation, lr_scale = choose(advisor, args, world)
    if log is not None:
        log.write(json.dumps({"resume": step, "world": world, "time": time.time(),
                              "batch": world * local * accumulation}) + "\n")
        log.flush()
    print(f"rank {rank}/{world} resumes at step {step}, batch {world * local * accumulation} "
          f"({local} x {accumulation} per rank, learning rate x{lr_scale:.3g})", flush=True)
    warm = False
    chosen_at = step
    while step < args.steps and not stopping["now"]:
        if step - chosen_at >= args.choose_every:
            local, accumulation, lr_scale = choose(advisor, args, world)
            chosen_at = step
        for group in optimizer.param_groups:
            group["lr"] = args.lr * lr_scale
        size = world * local * accumulation
        started = time.monotonic()
        inputs, targets = batch_of(step, rank, world, size)
        optimizer.zero_grad()
        losses = []
        for micro in range(accumulation):
            part = slice(micro * local, (micro + 1) * local)
            loss = nn.functional.mse_loss(net(inputs[part]), targets[part]) / accumulation
            loss.backward()  # type: ignore[no-untyped-call]
            losses.append(loss.detach())
        if args.example_seconds:
            time.sleep(args.example_seconds * len(inputs))
        synced = synchronise(net, torch.stack(losses).sum(), world, size / initial)
        optimizer.step()
        step += 1
        if rank == 0 and step % args.checkpoint_every == 0:
            save(args.checkpoint, net, optimizer, step, advisor)
        if args.step_seconds:
            time.sleep(args.step_seconds)
        seconds = time.monotonic() - started
        if log is not None:
            log.write(json.dumps({"step": step, "loss": synced.loss, "world": world, "seconds": seconds,
                                  "sync_seconds": synced.seconds, "batch": size, "local": local,
                                  "accumulation": accumulation, "lr_scale": lr_scale}) + "\n")
            log.flush()
        if warm and reporter is not None:
            reporter.step(step_seconds=seconds, sync_seconds=synced.seconds, local_batch=local,
                          accumulation_steps=accumulation, grad_sqr=synced.grad_sqr, grad_var=synced.grad_var)
        if warm and advisor is not None and rank == 0:  # rank 0 chooses for all (``choose``)
            advisor.observe(step_seconds=seconds, sync_seconds=synced.seconds, local_batch=local,
                            accumulation_steps=accumulation, grad_sqr=synced.grad_sqr, grad_var=synced.grad_var)
        warm = True
    if rank == 0:
        save(args.checkpoint, net, optimizer, step, advisor)
    if reporter is not None:
        reporter.flush()
    dist.destroy_process_group()
    print(f"rank {rank} stops at step {step}", flush=True)


if __name__ == "__main__":
    main()
