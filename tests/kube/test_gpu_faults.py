"""The node agent's fault record on its Node and the operator's clear request: read back exactly, and every
hostile variant either left out with a reason or refused as a whole, never a crash."""

from __future__ import annotations

import json

import pytest

from kubecell.kube.gpu_faults import (
    MAX_FAULTS,
    GpuFaultsError,
    RecordedFault,
    faults_annotation,
    parse_clear,
    parse_faults,
)

AT = 1_764_768_000.0  # 2025-12-03T13:20:00Z


def test_the_record_reads_back_what_was_written() -> None:
    faults = {"GPU-b": RecordedFault(79, AT), "GPU-a": RecordedFault(48, AT + 60)}
    text = faults_annotation(faults)
    assert text is not None
    assert json.loads(text) == {"GPU-a": {"xid": 48, "at": "2025-12-03T13:21:00Z"},
                                "GPU-b": {"xid": 79, "at": "2025-12-03T13:20:00Z"}}
    assert parse_faults(text) == (faults, [])
    assert faults_annotation({}) is None, "no fault: the annotation is removed"


def test_only_the_newest_faults_are_kept_past_the_bound() -> None:
    faults = {f"GPU-{i:04d}": RecordedFault(79, AT + i) for i in range(MAX_FAULTS + 10)}
    kept, skipped = parse_faults(faults_annotation(faults))
    assert len(kept) == MAX_FAULTS
    assert not skipped
    assert min(kept) == "GPU-0010", "the ten oldest went"


@pytest.mark.parametrize("text", ["", "not json", "[1, 2]", '"GPU-a"', "x" * 70_000, "[" * 100_000,
                                  '{"GPU-a": {"xid": 79, "at": "2025-12-03T13:20:00Z"}, "GPU-a": {}}', None, 7])
def test_a_record_that_cannot_be_read_is_refused_as_a_whole(text: object) -> None:
    with pytest.raises(GpuFaultsError):
        parse_faults(text)


@pytest.mark.parametrize(("entry", "problem"), [
    ({"xid": 79}, "an entry is"),
    ({"xid": 79, "at": "2025-12-03T13:20:00Z", "more": 1}, "an entry is"),
    ({"xid": True, "at": "2025-12-03T13:20:00Z"}, "xid must be"),
    ({"xid": -1, "at": "2025-12-03T13:20:00Z"}, "xid must be"),
    ({"xid": 2**31, "at": "2025-12-03T13:20:00Z"}, "xid must be"),
    ({"xid": 79.5, "at": "2025-12-03T13:20:00Z"}, "xid must be"),
    ({"xid": 79, "at": "yesterday"}, "at must be"),
    ({"xid": 79, "at": "2025-02-31T00:00:00Z"}, "at must be"),
    ({"xid": 79, "at": 1764768000}, "at must be"),
    ("79", "an entry is"),
])
def test_a_bad_entry_is_left_out_with_its_reason_and_the_rest_is_kept(entry: object, problem: str) -> None:
    text = json.dumps({"GPU-bad": entry, "GPU-good": {"xid": 64, "at": "2025-12-03T13:20:00Z"}})
    kept, skipped = parse_faults(text)
    assert kept == {"GPU-good": RecordedFault(64, AT)}
    assert len(skipped) == 1, skipped
    assert "GPU-bad" in skipped[0]
    assert problem in skipped[0]


@pytest.mark.parametrize("uuid", ["", "x" * 129, "GPU-\x1b[2J"])
def test_a_uuid_no_gpu_has_is_left_out(uuid: str) -> None:
    kept, skipped = parse_faults(json.dumps({uuid: {"xid": 79, "at": "2025-12-03T13:20:00Z"}}))
    assert kept == {}
    assert len(skipped) == 1
    assert "\x1b" not in skipped[0]


def test_entries_past_the_bound_are_counted_not_read() -> None:
    text = json.dumps({f"GPU-{i}": {"xid": 79, "at": "2025-12-03T13:20:00Z"} for i in range(MAX_FAULTS + 3)})
    kept, skipped = parse_faults(text)
    assert len(kept) == MAX_FAULTS
    assert skipped == [f"3 entries past the first {MAX_FAULTS}"]


def test_a_clear_request_names_gpus_or_all() -> None:
    assert parse_clear("all") is None
    assert parse_clear(" ALL ") is None
    assert parse_clear("GPU-a, GPU-b,,GPU-a") == {"GPU-a", "GPU-b"}


@pytest.mark.parametrize("text", ["", " , ", "GPU-a,GPU-\x00", "GPU-a," + "x" * 200, "x" * 70_000, None, 3])
def test_a_clear_request_that_names_nothing_readable_is_refused(text: object) -> None:
    with pytest.raises(GpuFaultsError, match="'all' or GPU UUIDs"):
        parse_clear(text)


@pytest.mark.parametrize("at", [float("nan"), 1e300, -1e300])
def test_a_time_no_date_holds_is_written_as_the_epoch(at: float) -> None:
    text = faults_annotation({"GPU-a": RecordedFault(79, at)})
    assert text is not None
    assert parse_faults(text) == ({"GPU-a": RecordedFault(79, 0.0)}, [])
