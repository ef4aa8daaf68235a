"""The pair history the cluster feeds: which pods shared a GPU and how busy each was alone and beside the other
(pure, then through a real Prometheus and the store on SQLite and PostgreSQL), the speeds read back, and the
scheduler's knowledge that serves them to the co-location rule."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import pytest
from alembic import command
from sqlalchemy import create_engine, text

from kubecell.core.interference.admission import BlindSharing, PressureAdaptive, SummedUtilThreshold
from kubecell.core.interference.history import HistoryInformed, informed_by_pairs
from kubecell.core.interference.profile import JobKey, SoloProfile
from kubecell.kube.names import ANNOTATION_ALLOCATION
from kubecell.kube.records import AllocationRecord, GpuGrant
from kubecell.profiler import pairs
from kubecell.profiler.history import FamilySharing, JobHistory, JobRecord, ProfilerStoreError, SharedUse
from kubecell.profiler.jobs import group_pods
from kubecell.profiler.knowledge import PAIR_MEMORY, HistoryKnowledge
from kubecell.profiler.pairs import ALONE, MIN_SECONDS, pair_history, use_beside
from kubecell.profiler.prometheus import Prometheus
from kubecell.profiler.run import SharePod, profile_jobs, record_of, share_pods
from kubecell.profiler.store.migrate import alembic_config, create
from kubecell.testbed.prometheus import CountingPrometheus
from tests.profiler.prometheus_server import BASE_TIME, Family, backfilled
from tests.profiler.test_knowledge import finished

T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(days=1)
"""Jobs of yesterday: the scheduler reads pairs from the jobs of the last 30 days."""
A, B, C = ("ns", "a-1"), ("ns", "b-1"), ("ns", "c-1")


def minutes(first: int, last: int, value: float = 0.5) -> list[tuple[float, float]]:
    return [(60.0 * m, value) for m in range(first, last + 1)]


# ------------------------------------------------------------------------------------------- pure pieces
def test_time_alone_beside_one_partner_and_among_three_is_told_apart() -> None:
    own = minutes(0, 9, 0.6) + minutes(10, 19, 0.3) + minutes(20, 24, 0.2) + minutes(25, 29, 0.4)
    others = {B: minutes(10, 24), C: minutes(20, 24)}
    found = use_beside(own, others)
    assert found == {None: (600.0 + 300.0, 0.6 * 600 + 0.4 * 300), B: (600.0, 0.3 * 600)}
    assert math.isclose(found[None][1], 480.0)


def test_a_partner_that_left_stops_counting_at_once_and_a_missed_scrape_is_capped() -> None:
    # B's last sample is at minute 4: from minute 5 A is alone; A's own outage (minutes 6-9) counts at most
    # twice its usual interval, as the profile weighs it
    own = minutes(0, 5) + minutes(10, 12)
    assert use_beside(own, {B: minutes(0, 4)}) == {B: (300.0, 150.0), None: (60.0 + 120.0 + 120.0, 150.0)}


def test_samples_that_are_not_a_ratio_of_one_gpu_are_dropped() -> None:
    own = [(0.0, 0.5), (60.0, math.nan), (120.0, 1.5), (180.0, -0.1), (240.0, 0.5)]
    assert use_beside(own, {}) == {None: (120.0, 60.0)}
    assert use_beside([], {B: minutes(0, 3)}) == {}


def rows(*entries: tuple[str, str, float, float]) -> list[FamilySharing]:
    return [FamilySharing(*entry) for entry in entries]


def test_speeds_are_busy_beside_over_busy_alone_capped_at_one() -> None:
    history = pair_history(rows(("ns/a", ALONE, 600, 360), ("ns/a", "ns/b", 900, 270),
                                ("ns/b", ALONE, 600, 300), ("ns/b", "ns/a", 900, 500)))
    assert history.speed(JobKey("ns/a"), JobKey("ns/b")) == pytest.approx(0.5)
    assert history.speed(JobKey("ns/b"), JobKey("ns/a")) == 1.0, "busier beside a partner is a phase, not a gain"
    assert history.seconds(JobKey("ns/a"), JobKey("ns/b")) == 900


def test_short_observations_and_families_idle_alone_say_nothing() -> None:
    short = MIN_SECONDS - 1
    history = pair_history(rows(("ns/a", ALONE, short, short / 2), ("ns/a", "ns/b", 900, 270),
                                ("ns/b", ALONE, 600, 300), ("ns/b", "ns/a", short, 100),
                                ("ns/c", ALONE, 600, 6), ("ns/c", "ns/b", 900, 0),
                                ("ns/d", ALONE, 600, 300), ("ns/d", "ns/b", 900, 0)))
    assert history.speed(JobKey("ns/a"), JobKey("ns/b")) is None, "no solo baseline long enough"
    assert history.speed(JobKey("ns/b"), JobKey("ns/a")) is None, "the pair itself was too short"
    assert history.speed(JobKey("ns/c"), JobKey("ns/b")) is None, "1 % busy alone: nothing to lose"
    assert history.speed(JobKey("ns/d"), JobKey("ns/b")) == pytest.approx(1e-6), "stopped beside b: the slowest"


# ------------------------------------------------------------------------------------------------ the store
def job(uid: str, owner: str, sharing: tuple[SharedUse, ...] = (), created: datetime = T0) -> JobRecord:
    return JobRecord(uid=uid, namespace="ns", owner_kind="Job", owner_name=owner, created=created, sharing=sharing)


def test_sharing_is_saved_replaced_with_its_job_and_summed_per_family(store_url: str) -> None:
    with JobHistory.open(store_url) as history:
        first = job("u1", "a-1", (SharedUse("ns/b", 600, 300), SharedUse(ALONE, 300, 240)))
        history.save(first)
        assert history.get("u1") == first
        history.save(job("u2", "a-2", (SharedUse("ns/b", 300, 30),)))
        history.save(job("u3", "b-1", (SharedUse("ns/a", 900, 900),)))
        summed = {(r.family, r.partner): (r.seconds, r.busy_seconds) for r in history.sharing()}
        assert summed == {("ns/a", "ns/b"): (900, 330), ("ns/a", ALONE): (300, 240), ("ns/b", "ns/a"): (900, 900)}
        history.save(job("u1", "a-1", (SharedUse("ns/b", 60, 6),)))  # the profiler revisits a running job
        summed = {(r.family, r.partner): (r.seconds, r.busy_seconds) for r in history.sharing()}
        assert summed[("ns/a", "ns/b")] == (360, 36)
        assert ("ns/a", ALONE) not in summed
        assert {r.family for r in history.sharing(created_since=T0 + timedelta(seconds=1))} == set()


@pytest.mark.parametrize(("use", "message"), [
    (lambda: SharedUse("ns/b", 60, 61), "busy seconds"),
    (lambda: SharedUse("ns/b", 0, 0), "busy seconds"),
    (lambda: SharedUse("ns/b", math.nan, 0), "busy seconds"),
    (lambda: SharedUse("ns/b", 60, math.inf), "busy seconds"),
    (lambda: SharedUse("x" * 508, 60, 6), "508 characters"),
    (lambda: SharedUse("ns/\x00", 60, 6), "NUL"),
    (lambda: job("u", "a", (SharedUse("ns/b", 60, 6), SharedUse("ns/b", 30, 6))), "partner twice"),
])
def test_sharing_the_history_cannot_keep_is_refused(use: Any, message: str) -> None:
    with pytest.raises(ProfilerStoreError, match=message):
        use()


def test_a_history_of_the_first_schema_is_migrated_with_its_jobs(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = create(url)
    try:
        with engine.begin() as connection:
            command.upgrade(alembic_config(connection), "0001")
            connection.execute(text(
                "INSERT INTO profiler_jobs (uid, namespace, owner_kind, owner_name, family, pod_count, gpus_per_pod, "
                "milli_gpu_per_pod, nodes, created, outcome, problems) VALUES ('old', 'ns', 'Job', 'a-1', 'a', 1, 1, "
                "500, '[]', '2026-11-01 10:00:00', 'Succeeded', '[]')"))
    finally:
        engine.dispose()
    with JobHistory.open(url) as history:
        old = history.get("old")
        assert old is not None
        assert old.sharing == ()
        assert old.milli_gpu_per_pod == 500
        history.save(job("new", "a-2", (SharedUse(ALONE, 600, 300),)))
        assert [r.partner for r in history.sharing()] == [ALONE]
    check = create_engine(url)
    try:
        with check.connect() as connection:
            assert connection.execute(text("SELECT version_num FROM profiler_schema_version")).scalar() == "0002"
    finally:
        check.dispose()


# ------------------------------------------------------------------------------------ the scheduler's side
class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def solo(key: str, util: float) -> SoloProfile:
    return SoloProfile(JobKey(key), util, util, 1000.0)


def test_the_knowledge_serves_pairs_refreshes_them_and_keeps_them_through_a_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    with JobHistory.open(f"sqlite:///{tmp_path / 'h.db'}") as history:
        knowledge = HistoryKnowledge(history, ttl_seconds=300, clock=clock)
        assert knowledge.speed(JobKey("ns/a"), JobKey("ns/b")) is None
        history.save(job("u1", "a-1", (SharedUse(ALONE, 600, 480), SharedUse("ns/b", 600, 240))))
        assert knowledge.speed(JobKey("ns/a"), JobKey("ns/b")) is None, "read again only after the ttl"
        clock.now = 300
        assert knowledge.speed(JobKey("ns/a"), JobKey("ns/b")) == pytest.approx(0.5)

        def locked(created_since: datetime | None = None) -> list[FamilySharing]:
            raise ProfilerStoreError("reading sharing in sqlite: database is locked")

        history.save(job("u0", "a-0", (SharedUse(ALONE, 600, 60), SharedUse("ns/b", 600, 60)),
                         created=T0 - PAIR_MEMORY))  # a month and a day ago: forgotten
        clock.now = 450
        assert knowledge.speed(JobKey("ns/a"), JobKey("ns/b")) == pytest.approx(0.5), "old pairs are not read"
        monkeypatch.setattr(history, "sharing", locked)
        clock.now = 750
        assert knowledge.speed(JobKey("ns/a"), JobKey("ns/b")) == pytest.approx(0.5), "kept through a failed read"
        assert "database is locked" in caplog.text


def test_the_pairs_decide_known_pairs_both_ways_and_leave_the_rest_to_the_rule(tmp_path: Path) -> None:
    with JobHistory.open(f"sqlite:///{tmp_path / 'h.db'}") as history:
        for uid, owner, partner, busy in (("u1", "a-1", "ns/b", 480), ("u2", "b-1", "ns/a", 470),
                                          ("u3", "c-1", "ns/a", 120), ("u4", "a-2", "ns/c", 470)):
            history.save(job(uid, owner, (SharedUse(ALONE, 600, 480), SharedUse(partner, 600, busy))))
        knowledge = HistoryKnowledge(history)
        blind = informed_by_pairs(BlindSharing(), knowledge, 0.95)
        strict = informed_by_pairs(SummedUtilThreshold(70), knowledge, 0.95)
        a, b, c, d = solo("ns/a", 80), solo("ns/b", 80), solo("ns/c", 80), solo("ns/d", 20)
        assert strict.admits([a, b], 80_000), "a and b lost nothing together: admitted past the 70 % rule"
        assert not blind.admits([a, c], 80_000), "c ran at a quarter beside a: refused though blind would admit"
        assert blind.admits([a, d], 80_000), "unknown pairs: the rule's"
        assert not strict.admits([c, b], 80_000), "unknown pairs: the rule's"
        adaptive = informed_by_pairs(PressureAdaptive(SummedUtilThreshold(70), BlindSharing()), knowledge, 0.95)
        assert isinstance(adaptive, PressureAdaptive)
        assert isinstance(adaptive.idle, HistoryInformed)
        assert adaptive.under(False).admits([a, b], 80_000)
        assert adaptive.under(True).admits([a, c], 80_000)


# ------------------------------------------------------------------------------------ a real Prometheus
NODE, GPU = "node-1", "GPU-aaaa"
T = float(BASE_TIME)


def share_pod(name: str, owner: str, isolation: Literal["accounting", "mps", "mig"] = "accounting",
              namespace: str = "ns", start_minute: int = 0) -> dict[str, Any]:
    uid = f"uid-{namespace}-{name}"
    record = AllocationRecord(allocation_id=f"{uid}-0", pod_uid=uid, attempt=0, node=NODE,
                              gpus=[GpuGrant(index=0, uuid=GPU, milli=500, memory_mib=1000)], cpu_milli=0,
                              memory_mib=0, isolation=isolation, job=f"{namespace}/{owner}", vc="v",
                              job_class="guaranteed", member=0, batch=1, scheduler="kubecell",
                              created_at=datetime.fromtimestamp(T, UTC))
    started = datetime.fromtimestamp(T + 60 * start_minute, UTC).isoformat().replace("+00:00", "Z")
    return {"metadata": {"name": name, "namespace": namespace, "uid": uid, "creationTimestamp": started,
                         "ownerReferences": [{"kind": "Job", "name": owner, "uid": f"owner-{owner}",
                                              "controller": True}],
                         "annotations": {ANNOTATION_ALLOCATION: record.to_annotation()}},
            "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "img:1", "resources": {
                "limits": {"kubecell.io/gpu-milli": "500", "kubecell.io/gpu-memory": "1000"}}}]},
            "status": {"phase": "Running", "startTime": started}}


SERIES: dict[tuple[str, str], list[tuple[float, float]]] = {
    ("ns", "bert-1-x"): minutes(0, 9, 0.6) + minutes(10, 19, 0.3) + minutes(20, 24, 0.25) + minutes(25, 29, 0.35),
    ("ns", "resnet-3-y"): minutes(10, 29, 0.5) + minutes(30, 39, 0.8),
    ("ns", "mps-1-z"): minutes(20, 24, 0.4),      # three on the GPU: neither pair is observed then
    ("other", "ghost-q"): minutes(35, 39, 0.9),   # not listed: time beside it is not counted
}


def families() -> list[Family]:
    series = [({"pod": pod, "namespace": namespace, "node": NODE, "gpu": GPU}, [(T + t, v) for t, v in samples])
              for (namespace, pod), samples in SERIES.items()]
    for labels, samples in list(series):  # every pod scraped twice (two agents' endpoints): counted once
        series.append(({**labels, "instance": "second-scrape"}, samples))
    return [Family("kubecell_node_gpu_pod_utilization_ratio", "gauge", series)]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    with backfilled(tmp_path_factory.mktemp("pairs"), families()) as url:
        yield Prometheus(url)


def test_a_pass_keeps_what_a_real_prometheus_shows_of_each_pair(prometheus: Prometheus, store_url: str) -> None:
    pods = [share_pod("bert-1-x", "bert-1"), share_pod("resnet-3-y", "resnet-3"),
            share_pod("mps-1-z", "mps-1", isolation="mps")]
    jobs = group_pods(pods)
    assert share_pods(jobs) == {("ns", "bert-1-x"): SharePod("ns/bert", (NODE, GPU)),
                                ("ns", "resnet-3-y"): SharePod("ns/resnet", (NODE, GPU))}, "the MPS pod is no share"
    with JobHistory.open(store_url) as history:
        profile_jobs(jobs, prometheus, history, now=datetime.fromtimestamp(T + 45 * 60, UTC))
        records = {record.owner_name: record for record in history.jobs()}
        shifted = {pod: [(T + t, v) for t, v in samples] for pod, samples in SERIES.items()}
        for owner, pod, partner, family in (("bert-1", "bert-1-x", "resnet-3-y", "ns/resnet"),
                                            ("resnet-3", "resnet-3-y", "bert-1-x", "ns/bert")):
            direct = use_beside(shifted[("ns", pod)], {p: s for p, s in shifted.items() if p != ("ns", pod)})
            kept = {use.partner: (use.seconds, use.busy_seconds) for use in records[owner].sharing}
            assert kept == {ALONE: direct[None], family: direct[("ns", partner)]}, owner
        assert records["mps-1"].sharing == (), "a pod under MPS is not observed"
        bert = {use.partner: (use.seconds, round(use.busy_seconds, 9)) for use in records["bert-1"].sharing}
        assert bert == {ALONE: (600, 360), "ns/resnet": (900, 285)}, "minutes 20-24 were three; 25-29 a pair"
        resnet = {use.partner: (use.seconds, round(use.busy_seconds, 9)) for use in records["resnet-3"].sharing}
        assert resnet == {ALONE: (300, 240), "ns/bert": (900, 450)}, "minutes 35-39 beside a pod not listed"
        speeds = pair_history(history.sharing())
        assert speeds.speed(JobKey("ns/bert"), JobKey("ns/resnet")) == pytest.approx(285 / 900 / 0.6)
        assert speeds.speed(JobKey("ns/resnet"), JobKey("ns/bert")) == pytest.approx(0.5 / 0.8)


def gpu_reads(client: CountingPrometheus, gpu: str = GPU) -> int:
    return sum(f"gpu={json.dumps(gpu)}" in query for query in client.queries)


def test_a_pass_reads_each_gpu_once_and_keeps_what_each_job_alone_would(prometheus: Prometheus,
                                                                          tmp_path: Path) -> None:
    pods = [share_pod("bert-1-x", "bert-1"), share_pod("resnet-3-y", "resnet-3", start_minute=10)]
    jobs, now = group_pods(pods), datetime.fromtimestamp(T + 45 * 60, UTC)
    one_reader, each_alone = CountingPrometheus(prometheus.url), CountingPrometheus(prometheus.url)
    with JobHistory.open(f"sqlite:///{tmp_path / 'one-reader.db'}") as history:
        profile_jobs(jobs, one_reader, history, now=now)
        shared = {record.owner_name: record.sharing for record in history.jobs()}
    alone = {job.owner_name: record_of(job, each_alone, now, share_pods(jobs)).sharing for job in jobs}
    assert shared == alone
    assert shared["resnet-3"]
    assert shared["bert-1"]
    assert gpu_reads(each_alone) == 2
    assert [job.owner_name for job in jobs] == ["bert-1", "resnet-3"]
    assert gpu_reads(one_reader) == 1, "resnet-3 lived within what bert-1 read"
    assert len(one_reader.queries) < len(each_alone.queries)


@pytest.mark.parametrize(("placed", "own_reads"), [
    ({"bert-1-x": (NODE, GPU)}, 0),
    ({}, 1),
    ({"bert-1-x": (NODE, "GPU-elsewhere")}, 1),
    ({"bert-1-x": ("node-9", GPU)}, 1),
], ids=["its-record", "no-record", "another-gpu", "another-node"])
def test_a_pod_is_found_on_the_gpu_its_record_names_or_else_by_its_own_series(
        prometheus: Prometheus, placed: dict[str, tuple[str, str]], own_reads: int) -> None:
    client = CountingPrometheus(prometheus.url)
    keys = {("ns", "bert-1-x"): "ns/bert", ("ns", "resnet-3-y"): "ns/resnet"}
    observed = pairs.observe_sharing(client, "ns", ["bert-1-x"], T, T + 2700, keys.get, placed=placed)
    assert {use.partner: (use.seconds, round(use.busy_seconds, 9)) for use in observed.sharing} == {
        ALONE: (600, 360), "ns/resnet": (900, 285)}
    assert observed.problems == ()
    assert sum('pod=~"' in query for query in client.queries) == own_reads


def test_the_gpu_reader_widens_what_it_holds_and_lets_go_of_the_oldest(prometheus: Prometheus) -> None:
    client = CountingPrometheus(prometheus.url)
    reader = pairs.GpuSeries(client)

    def fresh(start: float, end: float) -> dict[tuple[str, str], list[tuple[float, float]]]:
        return pairs.GpuSeries(prometheus).on(NODE, GPU, start, end)

    assert reader.on(NODE, GPU, T + 600, T + 1200) == fresh(T + 600, T + 1200)
    assert gpu_reads(client) == 1
    assert reader.on(NODE, GPU, T, T + 2400) == fresh(T, T + 2400)
    assert gpu_reads(client) == 3, "the time before and the time after what it held"
    assert reader.on(NODE, GPU, T + 300, T + 900) == fresh(T + 300, T + 900)
    assert gpu_reads(client) == 3, "served from what it holds"
    held = sum(len(samples) for samples in fresh(T, T + 2400).values())
    assert held > 1
    small = pairs.GpuSeries(client, max_samples=held)
    assert small.on(NODE, GPU, T, T + 2400) == fresh(T, T + 2400)
    assert small.on(NODE, "GPU-none", T, T + 2400) == {}
    assert small.on(NODE, GPU, T + 300, T + 900) == fresh(T + 300, T + 900)
    assert gpu_reads(client) == 4, "within max_samples, held beside a GPU without samples"
    tiny = pairs.GpuSeries(client, max_samples=held - 1)
    for _ in range(2):
        assert tiny.on(NODE, GPU, T, T + 2400) == fresh(T, T + 2400)
    assert gpu_reads(client) == 6, "a window over max_samples is answered, not kept"
    assert tiny._total == 0


def test_the_gpu_reader_never_reads_the_time_between_two_jobs(prometheus: Prometheus) -> None:
    """A job of another day on the same GPU: the reader reads its window alone (not the day between), and
    answers exactly what a fresh read of that window gives."""
    client = CountingPrometheus(prometheus.url)
    reader = pairs.GpuSeries(client, chunk=300)
    assert reader.on(NODE, GPU, T, T + 300) == pairs.GpuSeries(prometheus).on(NODE, GPU, T, T + 300)
    assert gpu_reads(client) == 1
    later = (T + 2100, T + 2400)
    assert reader.on(NODE, GPU, *later) == pairs.GpuSeries(prometheus).on(NODE, GPU, *later)
    assert gpu_reads(client) == 2, "one chunk of 300 s, not the 2,100 s since the first window"
    assert reader.on(NODE, GPU, T + 2200, T + 2300) == pairs.GpuSeries(prometheus).on(NODE, GPU, T + 2200, T + 2300)
    assert gpu_reads(client) == 2, "the later window is what it holds now"


def test_the_scheduler_asks_the_pairs_under_the_keys_the_profiler_keeps(tmp_path: Path) -> None:
    with JobHistory.open(f"sqlite:///{tmp_path / 'h.db'}") as history:
        for i in range(3):  # three finished jobs each: the scheduler knows both families' solo use
            history.save(dataclasses.replace(finished("ns", f"bert-{i}", 600, 0.8), created=T0, sharing=(
                SharedUse(ALONE, 600, 480), SharedUse("ns/resnet", 600, 120))))
            history.save(dataclasses.replace(finished("ns", f"resnet-{i}", 600, 0.2), created=T0, sharing=(
                SharedUse(ALONE, 600, 120), SharedUse("ns/bert", 600, 120))))
        knowledge = HistoryKnowledge(history)
        bert, resnet = share_pod("bert-7-x", "bert-7"), share_pod("resnet-9-y", "resnet-9")
        keys = {pod: share.family for pod, share in share_pods(group_pods([bert, resnet])).items()}
        profiles = [knowledge.profile(bert), knowledge.profile(resnet)]
        assert [p.key if p else None for p in profiles] == [JobKey(keys[("ns", "bert-7-x")]),
                                                            JobKey(keys[("ns", "resnet-9-y")])]
        assert [knowledge.family(bert), knowledge.family(resnet)] == [p.key for p in profiles if p], (
            "a family without a solo profile yet is keyed as one with")
        assert knowledge.profile(share_pod("gpt-1-z", "gpt-1")) is None
        assert knowledge.family(share_pod("gpt-1-z", "gpt-1")) == JobKey("ns/gpt")
        sharers = [p for p in profiles if p is not None]
        assert SummedUtilThreshold(100).admits(sharers, 80_000), "80 % and 20 % alone: the sum admits them"
        assert not informed_by_pairs(SummedUtilThreshold(100), knowledge, 0.95).admits(sharers, 80_000), (
            "bert ran at a quarter of its speed beside resnet")
