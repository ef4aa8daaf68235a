"""The profile loaders: what they read, and the one-line ``file:line`` errors of malformed tables."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kubecell.core.errors import InvalidInputError
from kubecell.sim.elastic.profiles import (
    load_application,
    load_placements,
    load_scalability,
    load_seed,
    load_validation,
)
from tests.sim.elastic.support import PLACEMENTS_8, SCALABILITY, VALIDATION_32, write_models


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_placements_in_any_column_order(tmp_path: Path) -> None:
    curves = load_placements(write(tmp_path, "placements-rtx.csv", PLACEMENTS_8))
    assert sorted(curves) == ["1", "2", "4", "8", "88"]
    one = curves["1"]
    assert one.local_bsz.tolist() == [32, 64]
    assert one.step_time.tolist() == [0.1, 0.2]
    assert one.at(48) == pytest.approx((0.15, 0.0))


def test_duplicate_rows_are_averaged(tmp_path: Path) -> None:
    text = "num_nodes,num_replicas,local_bsz,step_time,sync_time\n2,4,8,1.0,0.2\n2,4,8,2.0,0.4\n"
    curve = load_scalability(write(tmp_path, "s.csv", text))[(2, 4)]
    assert curve.step_time.tolist() == [1.5]
    assert curve.sync_time.tolist() == pytest.approx([0.3])


def test_scalability_and_validation(tmp_path: Path) -> None:
    points = load_scalability(write(tmp_path, "scalability-aws.csv", SCALABILITY))
    assert sorted(points) == [(3, 6), (3, 12), (5, 10), (5, 20)]
    curve = load_validation(write(tmp_path, "validation-32.csv", VALIDATION_32))
    assert curve.batch_size == 32
    assert curve.epochs == 2
    np.testing.assert_allclose(curve.progress, [100, 200])
    np.testing.assert_allclose(curve.grad_var, [3.0, 1.0])


def test_application_folder(tmp_path: Path) -> None:
    models = write_models(tmp_path)
    profile = load_application(models, "cifar10", ["aws", "rtx"])
    assert set(profile.tables) == {"aws", "rtx"}
    assert [c.batch_size for c in profile.validation] == [32, 128]
    assert {row.gpu_type for row in profile.seeds} == {"t4", "rtx", "dgx", "v100"}


BAD_TABLES = [
    # (file name, text, what the message must contain)
    ("placements-aws.csv", "placement,local_bsz,step_time\n1,32,0.1\n", "missing column 'sync_time'"),
    ("placements-aws.csv", "placement,local_bsz,step_time,sync_time\n1,32,0.1,0.2\n",
     "placements-aws.csv:2: field 'sync_time': sync_time 0.2 is longer than step_time 0.1"),
    ("placements-aws.csv", "placement,local_bsz,step_time,sync_time\n1,32,0.1,0\n1a,32,0.1,0\n",
     "placements-aws.csv:3: field 'placement': '1a' is not a placement"),
    ("placements-aws.csv", "placement,local_bsz,step_time,sync_time\n10,32,0.1,0\n", "'10' is not a placement"),
    ("placements-aws.csv", "placement,local_bsz,step_time,sync_time\n1,32,fast,0\n",
     "placements-aws.csv:2: field 'step_time': 'fast' is not a number"),
    ("placements-aws.csv", "placement,local_bsz,step_time,sync_time\n1,32,0,0\n",
     "field 'step_time': '0' is out of range"),
    ("placements-aws.csv", "placement,local_bsz,step_time,sync_time\n1,32.5,0.1,0\n", "not a whole number"),
    ("placements-aws.csv", "placement,local_bsz,step_time,sync_time\n1,32,0.1\n",
     "placements-aws.csv:2: field 'sync_time': has 3 fields"),
    ("placements-aws.csv", "placement,local_bsz,step_time,sync_time\n", "has a header but no rows"),
    ("placements-aws.csv", "", "the file is empty"),
    ("scalability-aws.csv", "num_nodes,num_replicas,local_bsz,step_time,sync_time\n4,2,8,1,0.5\n",
     "scalability-aws.csv:2: field 'num_replicas': 2 replicas on 4 nodes"),
    ("validation-32.csv", "progress,iteration,metric,grad_sqr,grad_var\n100,1,0,1,1\n90,2,0,1,1\n",
     "validation-32.csv:3: field 'progress': progress 90 is below the previous epoch's 100"),
    ("validation-32.csv", "progress,iteration,metric,grad_sqr,grad_var\n100,1,0,-1,1\n",
     "validation-32.csv:2: field 'grad_sqr'"),
    ("validation-big.csv", "progress,iteration,metric,grad_sqr,grad_var\n100,1,0,1,1\n",
     "cannot read the batch size from the file name"),
]


@pytest.mark.parametrize(("name", "text", "message"), BAD_TABLES)
def test_malformed_tables_name_file_line_and_field(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = write(tmp_path, name, text)
    loader = {"placements": load_placements, "scalability": load_scalability,
              "validation": load_validation}[name.split("-")[0]]
    with pytest.raises(InvalidInputError) as info:
        loader(path)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_seed_profiles_are_one_gpu(tmp_path: Path) -> None:
    path = write(tmp_path, "s.csv", "gpu_type,local_bsz,placement,step_time,sync_time\nt4,32,2,0.1,0.0\n")
    with pytest.raises(InvalidInputError, match=r"s\.csv:2: field 'placement': placement '2' in a 1-GPU seed"):
        load_seed(path)


def test_missing_application_and_missing_table(tmp_path: Path) -> None:
    models = write_models(tmp_path)
    with pytest.raises(InvalidInputError, match="no profiles for application 'bert'"):
        load_application(models, "bert", ["aws"])
    with pytest.raises(InvalidInputError, match=r"placements-quad\.csv: profile file not found"):
        load_application(models, "cifar10", ["quad"])
