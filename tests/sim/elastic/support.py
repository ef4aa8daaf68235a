"""Shared helpers of the elastic-simulator tests: the shared Sia data (or a skip), and a tiny synthetic
``models/`` folder whose numbers are simple enough to compute expected values by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.sim.support import REPO

SIA_DATA = REPO / ".." / "shared" / "data" / "sia-sosp23-workloads"
WORKLOAD_HEADER = "name,time,application,num_replicas,batch_size"


def sia_file(*parts: str) -> Path:
    """A file of the shared Sia data set, or skip the test with a message naming what is absent."""
    path = SIA_DATA.joinpath(*parts)
    if not SIA_DATA.is_dir():
        pytest.skip(f"Sia workload data set absent: {SIA_DATA}")
    if not path.exists():
        pytest.skip(f"Sia data file absent: {path}")
    return path


# Synthetic cifar10 profile: per-replica step time 0.1 s at batch 32 and 0.2 s at 64 on one GPU; a
# replica on a second GPU of the same node adds 0.05 s of sync, across nodes 0.1 s.
PLACEMENTS_4 = """placement,local_bsz,step_time,sync_time
1,32,0.1,0.0
1,64,0.2,0.0
2,32,0.15,0.05
2,64,0.25,0.05
4,32,0.15,0.05
4,64,0.25,0.05
11,32,0.2,0.1
11,64,0.3,0.1
22,32,0.2,0.1
22,64,0.3,0.1
44,32,0.2,0.1
44,64,0.3,0.1
"""
PLACEMENTS_8 = """local_bsz,step_time,sync_time,placement
32,0.1,0.0,1
64,0.2,0.0,1
32,0.15,0.05,2
64,0.25,0.05,2
32,0.15,0.05,4
64,0.25,0.05,4
32,0.15,0.05,8
64,0.25,0.05,8
32,0.2,0.1,88
64,0.3,0.1,88
"""
SCALABILITY = """num_nodes,num_replicas,local_bsz,step_time,sync_time
3,6,32,0.3,0.2
3,6,64,0.4,0.2
3,12,32,0.6,0.5
3,12,64,0.7,0.5
5,10,32,0.5,0.4
5,10,64,0.6,0.4
5,20,32,0.8,0.7
"""
# Two epochs; the end of epoch 1 is at progress 100 (the smaller of the two curves), of epoch 2 at 200.
VALIDATION_32 = """progress,iteration,metric,grad_sqr,grad_var
100,100,0.5,1.0,3.0
200,200,0.9,1.0,1.0
"""
VALIDATION_128 = """progress,iteration,metric,grad_sqr,grad_var
101,30,0.5,1.0,5.0
202,60,0.9,1.0,1.0
"""
SEED = """gpu_type,local_bsz,placement,step_time,sync_time
t4,32,1,0.1,0.0
t4,64,1,0.2,0.0
rtx,32,1,0.1,0.0
dgx,32,1,0.05,0.0
v100,32,1,0.07,0.0
"""


def write_models(root: Path, app: str = "cifar10") -> Path:
    """``root/models/<app>/`` with the synthetic tables for the three sia64 GPU profiles; returns models/."""
    folder = root / "models" / app
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "placements-aws.csv").write_text(PLACEMENTS_4)
    (folder / "scalability-aws.csv").write_text(SCALABILITY)
    for profile in ("rtx", "dgx-ext"):
        (folder / f"placements-{profile}.csv").write_text(PLACEMENTS_8)
        (folder / f"scalability-{profile}.csv").write_text(SCALABILITY)
    (folder / "validation-32.csv").write_text(VALIDATION_32)
    (folder / "validation-128.csv").write_text(VALIDATION_128)
    seed = root / "models" / "seed-1gpu"
    seed.mkdir(parents=True, exist_ok=True)
    (seed / f"{app}.csv").write_text(SEED)
    return root / "models"


def write_workload(root: Path, rows: str, family: str = "tiny", name: str = "workload-1") -> Path:
    path = root / family / f"{name}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{WORKLOAD_HEADER}\n{rows}")
    return path
