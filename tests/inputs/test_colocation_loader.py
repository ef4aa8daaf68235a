"""Co-location tables: every error names ``file:line`` and the column; good tables load in Lucid's format."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubecell.core.errors import InvalidInputError
from kubecell.core.interference import JobKey
from kubecell.inputs.colocation import load_shared_runs, load_solo_profiles

SOLO = """model,dataset,batchsize,amp,speed,gpu_util,gmem_util,gmem,label
ResNet18,CIFAR-10,32,0,1763.9,58.667,25.0,2360.0,0
VGG,CIFAR-10,64,1,5112.5,34.0,16.5,3588.0,1
"""
PAIRS = """,model1,dataset1,gpu_num1,batchsize1,amp1,speed1,model2,dataset2,gpu_num2,batchsize2,amp2,speed2,gpu_util
0,ResNet18,CIFAR-10,1,32,0,0.91,VGG,CIFAR-10,1,64,1,0.88,80.1
1,VGG,CIFAR-10,1,64,1,0.95,VGG,CIFAR-10,1,64,1,0.94,60.0
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_good_tables_load(tmp_path: Path) -> None:
    solos = load_solo_profiles(write(tmp_path, "solo.csv", SOLO))
    vgg = JobKey("VGG", "CIFAR-10", 64, True)
    assert solos[vgg].gpu_util == 34.0
    assert solos[vgg].memory_mib == 3588.0
    runs = load_shared_runs(write(tmp_path, "pairs.csv", PAIRS), solos)
    assert runs[0].jobs == (JobKey("ResNet18", "CIFAR-10", 32, False), vgg)
    assert runs[0].speeds == (0.91, 0.88)
    assert runs[0].gpu_util == 80.1


def test_the_pair_reading_is_optional_and_a_percentage(tmp_path: Path) -> None:
    without = PAIRS.replace(",gpu_util\n", "\n").replace(",80.1\n", "\n").replace(",60.0\n", "\n")
    assert [run.gpu_util for run in load_shared_runs(write(tmp_path, "pairs.csv", without))] == [None, None]
    blank = PAIRS.replace(",60.0\n", ",\n")
    assert [run.gpu_util for run in load_shared_runs(write(tmp_path, "pairs.csv", blank))] == [80.1, None]
    path = write(tmp_path, "pairs.csv", PAIRS.replace("80.1", "0.801e3"))
    assert error(lambda: load_shared_runs(path)) == \
        f"{path}:2: field 'gpu_util': must be a percentage, got 801 (accepted: 0 to 100)"
    path = write(tmp_path, "pairs.csv", PAIRS.replace("80.1", "nan"))
    assert error(lambda: load_shared_runs(path)) == f"{path}:2: field 'gpu_util': must be a finite number, got 'nan'"


def test_a_minimal_solo_table_loads(tmp_path: Path) -> None:
    solos = load_solo_profiles(write(tmp_path, "solo.csv", "model,gpu_util,gmem_util,gmem\nmine,40,10,1024\n"))
    assert solos[JobKey("mine")].gmem_util == 10.0


def error(call: object) -> str:
    assert callable(call)
    with pytest.raises(InvalidInputError) as caught:
        call()
    return str(caught.value)


def test_a_missing_column_names_the_header_line(tmp_path: Path) -> None:
    path = write(tmp_path, "solo.csv", SOLO.replace("gmem_util,", "gmemutil,"))
    assert error(lambda: load_solo_profiles(path)).startswith(f"{path}:1: missing column(s) gmem_util")
    path = write(tmp_path, "pairs.csv", PAIRS.replace("speed2", "spd2"))
    assert error(lambda: load_shared_runs(path)).startswith(f"{path}:1: missing column(s) speed2")


def test_a_non_number_names_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "solo.csv", SOLO.replace("34.0,16.5", "34.0,high"))
    assert error(lambda: load_solo_profiles(path)) == f"{path}:3: field 'gmem_util': not a number: 'high'"
    path = write(tmp_path, "pairs.csv", PAIRS.replace("0.88", "0.8.8"))
    assert error(lambda: load_shared_runs(path)) == f"{path}:2: field 'speed2': not a number: '0.8.8'"
    path = write(tmp_path, "pairs.csv", PAIRS.replace(",32,0,0.91", ",32,maybe,0.91"))
    assert error(lambda: load_shared_runs(path)).startswith(f"{path}:2: field 'amp1': not a flag")


def test_out_of_range_profiles_name_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "solo.csv", SOLO.replace("58.667", "158.667"))
    assert error(lambda: load_solo_profiles(path)).startswith(f"{path}:2: field 'gpu_util': must be at most 100")
    path = write(tmp_path, "solo.csv", SOLO.replace("2360.0", "-1"))
    assert error(lambda: load_solo_profiles(path)).startswith(f"{path}:2: field 'gmem': must not be negative")


def test_a_pair_job_without_a_solo_row_names_line_and_column(tmp_path: Path) -> None:
    solos = load_solo_profiles(write(tmp_path, "solo.csv", SOLO))
    path = write(tmp_path, "pairs.csv", PAIRS.replace("1,VGG,CIFAR-10,1,64,1,0.95", "1,VGG,CIFAR-10,1,128,1,0.95"))
    text = error(lambda: load_shared_runs(path, solos))
    assert text.startswith(f"{path}:3: field 'model1': job VGG/CIFAR-10/bs128/amp has no row in the solo table")


def test_duplicates_ragged_rows_and_missing_files(tmp_path: Path) -> None:
    path = write(tmp_path, "solo.csv", SOLO + SOLO.splitlines()[1] + "\n")
    assert error(lambda: load_solo_profiles(path)) == \
        f"{path}:4: field 'model': job ResNet18/CIFAR-10/bs32 is listed twice (first at {path}:2)"
    path = write(tmp_path, "pairs.csv", PAIRS + "2,VGG,CIFAR-10\n")
    assert error(lambda: load_shared_runs(path)).startswith(f"{path}:4: field 'gpu_num1': has 3 fields, header has 14")
    assert "file not found" in error(lambda: load_solo_profiles(tmp_path / "absent.csv"))
    path = write(tmp_path, "pairs.csv", PAIRS.replace("0.94", "0"))
    assert error(lambda: load_shared_runs(path)) == f"{path}:3: field 'speed2': must be above 0, got 0"


def test_a_throughput_typed_for_a_speed_ratio_and_a_bom_are_told(tmp_path: Path) -> None:
    path = write(tmp_path, "pairs.csv", PAIRS.replace("0.88", "98.3"))
    assert error(lambda: load_shared_runs(path)).startswith(f"{path}:2: field 'speed2': is 98.3: a speed here is")
    bom = tmp_path / "solo.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + SOLO.encode())
    assert len(load_solo_profiles(bom)) == 2, "a spreadsheet's byte-order mark is not part of the first column"


@pytest.mark.parametrize(("text", "says"), [
    ("model,model,dataset,batchsize,amp,gpu_util,gmem_util,gmem\n", "column 'model' appears twice"),
    ("model,dataset,batchsize,amp,gpu_util,gmem_util,gmem\nResNet18,CIFAR-10,\u00b2,0,50,10,1000\n", "'\u00b2'"),
    ("model,dataset,batchsize,amp,gpu_util,gmem_util,gmem\nResNet18,CIFAR-10," + "9" * 5000 + ",0,50,10,1000\n",
     "at most 9 digits"),
    ("model,dataset,batchsize,amp,gpu_util,gmem_util,gmem\nResNet18,\"" + "x" * 140_000 + "\",32,0,50,10,1000\n",
     "malformed CSV"),
], ids=["a column twice", "a superscript digit", "5000 digits", "a field past the csv limit"])
def test_what_python_would_raise_on_is_a_located_error(tmp_path: Path, text: str, says: str) -> None:
    """Before: a header naming a column twice let the last copy win; "\u00b2" passed ``isdigit`` and ``int``
    raised; 5,000 digits raised past Python's 4,300; a field past the csv module's limit escaped as csv.Error."""
    path = write(tmp_path, "solo.csv", text)
    message = error(lambda: load_solo_profiles(path))
    assert message.startswith(f"{path}:")
    assert says in message
