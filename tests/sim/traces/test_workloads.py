"""Trace loaders: each format's mapping of columns to jobs, the time window, and bad rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubecell.core.errors import InvalidInputError
from kubecell.core.model import TopologyLevel
from kubecell.sim.traces.jobs import CPU_MILLI_PER_GPU, MEMORY_MIB_PER_GPU, gang_shape
from kubecell.sim.traces.sia import SIA_GPU_HOURS
from kubecell.sim.traces.workloads import load_workloads
from tests.sim.dynamic.support import PCS_HEADER, SIA_HEADER, Writer, pcs_rows

RACK = TopologyLevel.RACK
NODE = TopologyLevel.NODE


@pytest.mark.parametrize(
    ("gpus", "shape"),
    [
        (1, (1, 1, None)),
        (4, (1, 4, None)),
        (6, (1, 6, None)),
        (8, (1, 8, None)),
        (16, (2, 8, RACK)),
        (24, (3, 8, RACK)),
        (48, (6, 8, RACK)),
        (12, (3, 4, RACK)),
        (20, (5, 4, RACK)),
        (9, (9, 1, RACK)),
        (10, (10, 1, RACK)),
    ],
)
def test_gang_shape(gpus: int, shape: tuple[int, int, TopologyLevel | None]) -> None:
    assert gang_shape(gpus) == shape
    members, per_member, _ = shape
    assert members * per_member == gpus


def test_pcs_rows_become_jobs(write: Writer) -> None:
    path = write("philly/trace_6214e9.csv", pcs_rows((0, 0.0, 3600.0, 1), (1, 60.0, 8 * 7200.0, 8),
                                                       (2, 120.0, 16 * 100.0, 16), (3, 180.0, 12 * 50.0, 12)))
    workload = load_workloads([path])
    jobs = {job.name: job for job in workload.jobs}
    assert list(jobs) == ["6214e9-0", "6214e9-1", "6214e9-2", "6214e9-3"]
    assert {job.vc for job in jobs.values()} == {"6214e9"}
    one, eight, sixteen, twelve = jobs.values()
    assert (one.members, one.member.gpu_count, one.topology, one.work) == (1, 1, None, 3600.0)
    assert (one.member.cpu_milli, one.member.memory_mib) == (CPU_MILLI_PER_GPU, MEMORY_MIB_PER_GPU)
    assert (eight.members, eight.member.gpu_count, eight.work, eight.submit_time) == (1, 8, 7200.0, 60.0)
    assert eight.member.cpu_milli == 8 * CPU_MILLI_PER_GPU
    assert (sixteen.members, sixteen.member.gpu_count, sixteen.topology, sixteen.work) == (2, 8, RACK, 100.0)
    assert (twelve.members, twelve.member.gpu_count, twelve.topology) == (3, 4, RACK)
    assert all(job.minimum == job.members for job in jobs.values())
    assert ("model", "ResNet") in one.labels
    assert sum(job.total_gpu_milli for job in jobs.values()) == (1 + 8 + 16 + 12) * 1000
    info = workload.files[0]
    assert (info.format, info.vc, info.rows, info.jobs, info.rejected) == ("philly-pcs", "6214e9", 4, 4, 0)


def test_host_defaults_can_be_overridden(write: Writer) -> None:
    path = write("trace_a.csv", pcs_rows((0, 0.0, 10.0, 2)))
    job = load_workloads(path, cpu_milli_per_gpu=1000, memory_mib_per_gpu=2048).jobs[0]
    assert (job.member.cpu_milli, job.member.memory_mib) == (2000, 4096)


def test_days_window_and_alignment(write: Writer) -> None:
    day = 86_400.0
    a = write("trace_a.csv", pcs_rows((0, 0.0, 10.0, 1), (1, 1.5 * day, 10.0, 1), (2, 2.5 * day, 10.0, 1)))
    b = write("trace_b.csv", pcs_rows((0, 0.0, 10.0, 1), (1, 1.9 * day, 10.0, 1)))
    workload = load_workloads([a, b], days=2)
    assert [job.name for job in workload.jobs] == ["a-0", "b-0", "a-1", "b-1"]  # both VCs start at 0
    assert [f.outside_window for f in workload.files] == [1, 0]
    assert workload.vcs == ["a", "b"]
    with pytest.raises(InvalidInputError, match="days"):
        load_workloads([a], days=0)


def test_sia_rows_become_jobs(write: Writer) -> None:
    path = write("philly/workload-1.csv", SIA_HEADER + "\n"
                 "cifar10-0,107,cifar10,4,2048\n"
                 "imagenet-1,110.5,imagenet,16,1024\n"
                 "bert-2,200,BERT,1,12\n")
    jobs = load_workloads(path).jobs
    assert [job.name for job in jobs] == ["philly-w1-cifar10-0", "philly-w1-imagenet-1", "philly-w1-bert-2"]
    assert {job.vc for job in jobs} == {"philly-w1"}
    cifar, imagenet, bert = jobs
    assert (cifar.members, cifar.member.gpu_count, cifar.topology) == (4, 1, NODE)
    assert cifar.work == pytest.approx(SIA_GPU_HOURS["cifar10"][1] * 3600 / 4)
    assert (imagenet.members, imagenet.topology, imagenet.submit_time) == (16, RACK, 110.5)
    assert imagenet.work == pytest.approx(300 * 3600 / 16)
    assert (bert.members, bert.topology) == (1, None)
    assert ("application", "bert") in bert.labels


def test_formats_mix_and_directories_expand(write: Writer, tmp_path: Path) -> None:
    write("traces/trace_x.csv", pcs_rows((0, 5.0, 10.0, 1)))
    write("traces/trace_y.csv", pcs_rows((0, 1.0, 10.0, 1)))
    sia = write("saturn/workload-3.csv", SIA_HEADER + "\nbert-0,3,bert,2,32\n")
    workload = load_workloads([tmp_path / "traces", sia, tmp_path / "traces" / "trace_x.csv"])  # repeat dropped
    assert [job.name for job in workload.jobs] == ["y-0", "saturn-w3-bert-0", "x-0"]
    assert [f.format for f in workload.files] == ["philly-pcs", "philly-pcs", "sia"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InvalidInputError, match=r"no \*\.csv files"):
        load_workloads([empty])


BAD_ROWS = [
    ("0,abc,10,1,0,m", "submit_time", "'abc' is not a number"),
    ("0,-5,10,1,0,m", "submit_time", "out of range"),
    ("0,5,-10,1,0,m", "service", "out of range"),
    ("0,5,inf,1,0,m", "service", "out of range"),
    ("0,5,10,0,0,m", "num_jobs", "'0' GPUs"),
    ("0,5,10,2.5,0,m", "num_jobs", "'2.5' GPUs"),
    ("0,5,10,x,0,m", "num_jobs", "not a number"),
    ("0,5,10", "num_jobs", "has 3 fields, header has 6"),
    ("0,5,10,1,0,m,extra", None, "has 7 fields, header has 6"),
    (",5,10,1,0,m", "app_id", "is empty"),
    ("1,5,10,1,0,m", None, "duplicate job 't-1' (first at"),
]


@pytest.mark.parametrize(("row", "field", "reason"), BAD_ROWS)
def test_bad_pcs_rows_name_file_line_and_field(write: Writer, row: str, field: str | None, reason: str) -> None:
    path = write("trace_t.csv", f"{PCS_HEADER}\n1,0,10,1,0,m\n{row}\n")
    with pytest.raises(InvalidInputError) as info:
        load_workloads(path)
    message = str(info.value)
    assert message.startswith(f"{path}:3"), message
    if field is not None:
        assert f"field '{field}'" in message
    assert reason in message
    assert "accepted" in message


def test_bad_sia_rows(write: Writer) -> None:
    path = write("w/workload-2.csv", f"{SIA_HEADER}\nresnet-0,1,resnet,4,32\n")
    with pytest.raises(InvalidInputError, match=r"workload-2.csv:2: field 'application': unknown application"):
        load_workloads(path)
    path = write("w/workload-3.csv", f"{SIA_HEADER}\ncifar10-0,1,cifar10,0,32\n")
    with pytest.raises(InvalidInputError, match=r"workload-3.csv:2: field 'num_replicas'"):
        load_workloads(path)


def test_skip_bad_rows_collects_reasons_and_keeps_the_rest(write: Writer) -> None:
    body = "\n".join(row for row, _, _ in BAD_ROWS)
    path = write("trace_t.csv", f"{PCS_HEADER}\n1,0,10,1,0,m\n{body}\n7,9,10,2,0,m\n")
    workload = load_workloads(path, skip_bad_rows=True)
    assert [job.name for job in workload.jobs] == ["t-1", "t-7"]
    assert len(workload.rejected) == len(BAD_ROWS)
    assert [r.location for r in workload.rejected] == [f"{path}:{line}" for line in range(3, 3 + len(BAD_ROWS))]
    assert workload.rejected[0].field == "submit_time"
    assert "is not a number" in workload.rejected[0].reason
    assert str(workload.rejected[4]).startswith(f"{path}:7: field 'num_jobs'")
    assert workload.rejected[7].field == "num_jobs"  # a short row names the first missing column
    assert workload.files[0].rejected == len(BAD_ROWS)


@pytest.mark.parametrize(
    ("text", "where", "mention"),
    [
        ("app_id,submit_time,num_jobs\n0,0,1\n", ":1",
         "missing column 'service' (columns: app_id, submit_time, num_jobs)"),
        ("a,b\n1,2\n", ":1", "philly-pcs: app_id,submit_time,service,num_jobs"),
        ("", "", "the file is empty"),
    ],
)
def test_unknown_header_is_a_file_error(write: Writer, text: str, where: str, mention: str) -> None:
    path = write("trace_h.csv", text)
    with pytest.raises(InvalidInputError) as info:
        load_workloads(path, skip_bad_rows=True)
    assert str(info.value).startswith(f"{path}{where}: ")
    assert mention in str(info.value)


def test_missing_file() -> None:
    with pytest.raises(InvalidInputError, match="file not found"):
        load_workloads("/nonexistent/trace_q.csv")


def test_not_utf8(write: Writer, tmp_path: Path) -> None:
    path = tmp_path / "trace_bin.csv"
    path.write_bytes(PCS_HEADER.encode() + b"\n0,0,\xff\xfe,1,0,m\n")
    with pytest.raises(InvalidInputError, match="UTF-8"):
        load_workloads(path)
