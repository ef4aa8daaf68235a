"""The job history on SQLite and on a real PostgreSQL server: records come back exactly as saved, saving again
replaces, queries filter, migrations build the models' schema, and bad databases are refused with one line."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, text

from kubecell.core.errors import KubecellError
from kubecell.profiler.distribution import Distribution, distribution
from kubecell.profiler.history import JobHistory, JobRecord, Outcome, PodRecord, ProfilerStoreError
from kubecell.profiler.store.migrate import head_revision
from kubecell.profiler.store.schema import VERSION_TABLE, Base
from kubecell.testbed.processes import free_port

T0 = datetime(2026, 11, 24, 15, 30, 0, 123456, tzinfo=UTC)


@pytest.fixture
def history(store_url: str) -> Iterator[JobHistory]:
    with JobHistory.open(store_url) as opened:
        yield opened


def dist(*values: float) -> Distribution:
    return distribution(values, [0.1 + i / 3 for i in range(len(values))])


def record(uid: str = "uid-1", owner_name: str = "bert-finetune-7", *, user: str = "alice", vc: str = "nlp",
           created: datetime = T0, run_s: float | None = 3600.0, pods: int = 2,
           outcome: Outcome = Outcome.SUCCEEDED) -> JobRecord:
    started = created + timedelta(seconds=30)
    finished = None if run_s is None else started + timedelta(seconds=run_s)
    return JobRecord(
        uid=uid, namespace="team-a", owner_kind="PyTorchJob", owner_name=owner_name, created=created, user=user,
        vc=vc, image="registry.local/bert:1.2", pod_count=pods, gpus_per_pod=4, milli_gpu_per_pod=1000,
        gpu_memory_mib_per_pod=81920, gpu_model_requested="H100", nodes=tuple(f"node-{i}" for i in range(pods)),
        gpu_model="H100-SXM", started=started, finished=finished, outcome=outcome,
        pods=tuple(PodRecord(name=f"{owner_name}-worker-{i}", node=f"node-{i}", phase=Outcome.SUCCEEDED,
                             started=started, finished=finished,
                             metrics={"gpu_utilization": dist(0.1 * i, 0.5, 0.97, 1 / 3),
                                      "gpu_memory_bytes": dist(7.5e10, 7.9e10 + i)})
                   for i in range(pods)),
        metrics={"gpu_utilization": dist(0.0, 0.5, 0.97, 1 / 3, 2 / 7), "cpu_cores": dist(3.25),
                 "memory_bytes": dist(1.5e10, 1.6e10)},
        problems=(f"pod {owner_name}-worker-0: no cpu_cores series",))


def test_round_trip_is_exact(history: JobHistory) -> None:
    saved = record()
    history.save(saved)
    loaded = history.get(saved.uid)
    assert loaded == saved
    assert loaded is not None
    assert loaded.family == "bert-finetune"
    assert loaded.metrics["gpu_utilization"].deciles == saved.metrics["gpu_utilization"].deciles
    assert loaded.metrics["gpu_utilization"].mean == saved.metrics["gpu_utilization"].mean  # bit for bit
    assert loaded.created.utcoffset() == timedelta(0)
    assert history.get("no-such-uid") is None


def test_times_are_kept_in_utc(history: JobHistory) -> None:
    local = T0.astimezone(timezone(timedelta(hours=-8)))
    history.save(record(created=local))
    loaded = history.get("uid-1")
    assert loaded is not None
    assert loaded.created == T0
    assert loaded.created.tzinfo == UTC
    with pytest.raises(ProfilerStoreError, match="no time zone"):
        record(created=datetime(2026, 1, 1))


def test_save_again_replaces_pods_and_distributions(history: JobHistory) -> None:
    history.save(record(pods=3))
    running = record(pods=1, run_s=None, outcome=Outcome.RUNNING)
    history.save(running)
    loaded = history.get("uid-1")
    assert loaded == running
    assert loaded is not None
    assert len(loaded.pods) == 1
    assert loaded.finished is None
    bare = JobRecord(uid="uid-1", namespace="team-a", owner_kind="Job", owner_name="x", created=T0)
    history.save(bare)
    assert history.get("uid-1") == bare
    assert len(history.jobs()) == 1


def test_a_gang_run_is_found_by_a_pod_it_holds(history: JobHistory) -> None:
    gang = "gang-0123abcd"
    started = T0 + timedelta(seconds=30)  # record()'s pods' start
    history.save(record(uid=f"{gang}.20261124T153000Z", owner_name="nightly"))
    history.save(record(uid=f"{gang}.20261125T153000Z", owner_name="nightly", created=T0 + timedelta(days=1)))
    history.save(record(uid=f"{gang}x.20261124T153000Z", owner_name="nightly"))  # another gang's key, longer
    history.save(record(uid="gang-0123abc_.1", owner_name="nightly"))  # "_" is a LIKE wildcard: never matched
    one_pod = [("nightly-worker-1", started.astimezone(timezone(timedelta(hours=2))))]  # any time zone
    assert history.run_holding(gang, one_pod, namespace="team-a") == f"{gang}.20261124T153000Z"
    later = [("nightly-worker-0", started + timedelta(days=1))]
    assert history.run_holding(gang, later, namespace="team-a") == f"{gang}.20261125T153000Z"
    assert history.run_holding(gang, [("nightly-worker-0", started + timedelta(days=2))],
                               namespace="team-a") is None
    assert history.run_holding(gang, [], namespace="team-a") is None
    assert history.run_holding("gang-0123abc_", one_pod, namespace="team-a") == "gang-0123abc_.1"
    assert history.run_holding("gang-0123abc_", later, namespace="team-a") is None, \
        "'_' matched the 'd' of another gang's key"
    history.save(record(uid=gang, owner_name="legacy"))  # saved under the gang's key, before runs
    assert history.run_holding(gang, [("legacy-worker-0", started)], namespace="team-a") == gang
    many = [(f"a-{i:05}", started) for i in range(70_000)]  # more than one statement may bind (PostgreSQL: 65,535)
    assert history.run_holding(gang, [*many, ("legacy-worker-1", started)], namespace="team-a") == gang


def test_a_gang_run_is_found_only_in_its_own_namespace(history: JobHistory) -> None:
    """A job another namespace keeps under a key like a gang's (a squat saved before owner uids shaped as gangs'
    keys were refused) holding pods named and started as the gang's is not the gang's run."""
    gang = "gang-0123abcd"
    started = T0 + timedelta(seconds=30)
    history.save(replace(record(uid=f"{gang}.20261124T153000Z", owner_name="nightly"), namespace="mallory"))
    pods = [("nightly-worker-0", started)]
    assert history.run_holding(gang, pods, namespace="team-a") is None
    assert history.run_holding(gang, pods, namespace="mallory") == f"{gang}.20261124T153000Z"


def test_a_gang_key_another_namespace_squatted_is_given_to_the_gang(history: JobHistory) -> None:
    """A gang's key is a digest of its own namespace: a job of another namespace under it can only be a squat
    saved by an earlier kubecell, and the gang's run replaces it. Any other key stays its first namespace's."""
    key = "gang-0123abcd.20261124T153000Z"
    history.save(replace(record(uid=key, owner_name="squatter"), namespace="mallory"))
    gang = replace(record(uid=key, owner_name="nightly", pods=1), owner_kind="Gang")
    history.save(gang)
    assert history.get(key) == gang
    assert history.jobs(namespace="mallory") == []
    with pytest.raises(ProfilerStoreError, match="keeps a job of namespace team-a"):
        history.save(replace(gang, namespace="mallory", owner_kind="Job"))
    history.save(record(uid="uid-9"))
    with pytest.raises(ProfilerStoreError, match="keeps a job of namespace team-a"):
        history.save(replace(record(uid="uid-9"), namespace="mallory", owner_kind="Gang"))


class Twice(dict[str, Distribution]):
    """Metrics that list each entry twice: the second insert of the job's metrics breaks their primary key."""

    def items(self) -> list[tuple[str, Distribution]]:  # type: ignore[override]
        return [*super().items(), *super().items()]


def test_a_failed_save_changes_nothing(history: JobHistory) -> None:
    history.save(record())
    bad = replace(record(pods=1, run_s=None), metrics=Twice({"gpu_utilization": dist(1.0)}))
    with pytest.raises(ProfilerStoreError, match="saving job uid-1 in ") as caught:
        history.save(bad)
    assert "\n" not in str(caught.value)
    assert history.get("uid-1") == record()


def test_queries(history: JobHistory) -> None:
    history.save(record("a", "bert-finetune-1", created=T0, run_s=100))
    history.save(record("b", "bert-finetune-2", created=T0 + timedelta(hours=1), run_s=200, user="bob"))
    history.save(record("c", "resnet-x7k2p", created=T0 + timedelta(hours=2), run_s=300, vc="vision"))
    history.save(record("d", "bert-finetune-3", created=T0 + timedelta(hours=3), run_s=None,
                        outcome=Outcome.RUNNING))
    history.save(record("e", "bert-finetune-4", created=T0 + timedelta(hours=4), run_s=50, outcome=Outcome.FAILED))

    def uids(jobs: list[JobRecord]) -> list[str]:
        return [job.uid for job in jobs]

    assert uids(history.jobs()) == ["e", "d", "c", "b", "a"]
    assert uids(history.jobs(family="bert-finetune")) == ["e", "d", "b", "a"]
    assert uids(history.jobs(user="bob")) == ["b"]
    assert uids(history.jobs(vc="vision")) == ["c"]
    assert uids(history.jobs(namespace="team-a", limit=2)) == ["e", "d"]
    assert uids(history.jobs(namespace="elsewhere")) == []
    since = T0 + timedelta(hours=1, seconds=30 + 150)
    assert uids(history.jobs(finished_since=since)) == ["e", "c", "b"]
    assert uids(history.jobs(family="bert-finetune", user="alice", finished_since=since)) == ["e"]
    assert history.durations(family="bert-finetune") == [100.0, 200.0, 50.0]
    assert history.durations(family="bert-finetune", outcomes=(Outcome.SUCCEEDED,)) == [100.0, 200.0]
    assert history.durations(user="bob") == [200.0]
    assert history.durations(vc="vision") == [300.0]
    assert history.durations(family="bert-finetune", limit=2) == [200.0, 50.0]
    assert history.durations(family="nothing") == []


def test_reopening_keeps_the_data(store_url: str) -> None:
    with JobHistory.open(store_url) as history:
        history.save(record())
    # plain postgresql:// means psycopg 3, the driver installed
    with JobHistory.open(store_url.replace("postgresql+psycopg://", "postgresql://")) as history:
        assert history.get("uid-1") == record()


def test_concurrent_opens_of_a_new_database_migrate_once(store_url: str) -> None:
    errors: list[BaseException] = []

    def open_and_save(index: int) -> None:
        try:
            with JobHistory.open(store_url) as history:
                for round_ in range(5):
                    history.save(record(f"uid-{round_ % 2}", f"job-{index}"))
        except BaseException as error:  # collected for the assertion below
            errors.append(error)

    threads = [threading.Thread(target=open_and_save, args=(index,)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    with JobHistory.open(store_url) as history:
        assert sorted(job.uid for job in history.jobs()) == ["uid-0", "uid-1"]
    assert schema_differences(store_url) == []


HOSTILE = ["'; DROP TABLE profiler_jobs; --", 'quote " and \\ backslash', "x" * 10_000, "日本語 ジョブ 🚀",
           "line\nbreak\ttab", "%s %(name)s {0} $1 ?"]


@pytest.mark.parametrize("value", HOSTILE, ids=["sql", "quotes", "10k", "unicode", "control", "placeholders"])
def test_hostile_strings_are_stored_safely(history: JobHistory, value: str) -> None:
    saved = JobRecord(uid="uid-h", namespace="ns", owner_kind="Job", owner_name=value, created=T0, image=value,
                      user=value[:253], vc=value[:253], nodes=(value,), gpu_model=value, problems=(value, value),
                      pods=(PodRecord(name=value, node=value, metrics={value[:128]: dist(1.0)}),))
    history.save(saved)
    assert history.get("uid-h") == saved
    assert [job.uid for job in history.jobs(user=value[:253])] == ["uid-h"]
    assert len(saved.family) <= 253


@pytest.mark.parametrize(("changes", "message"), [
    ({"user": "u" * 254}, "user is 254 characters"),
    ({"uid": "u" * 129}, "uid is 129 characters"),
    ({"uid": ""}, "needs its owner's uid"),
    ({"owner_name": "nul\x00byte"}, "NUL"),
    ({"image": "\ud800"}, "not valid Unicode"),
    ({"gpus_per_pod": -1}, "gpus_per_pod = -1"),
    ({"metrics": {"m": Distribution((float("nan"),) * 11, 0.0, 1, 1.0)}}, "NaN or infinite"),
])
def test_records_the_history_cannot_keep_are_refused(changes: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {"uid": "u", "namespace": "ns", "owner_kind": "Job", "owner_name": "n",
                                 "created": T0, **changes}
    with pytest.raises(ProfilerStoreError, match=message):
        JobRecord(**fields)  # type: ignore[arg-type]


def schema_differences(url: str) -> list[object]:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE,
                                                                    "compare_type": True})
            differences: list[object] = compare_metadata(context, Base.metadata)
            heads = context.get_current_heads()
    finally:
        engine.dispose()
    return [*differences, *([] if heads in ((), (head_revision(),)) else [("heads", heads)])]


def test_migrated_schema_equals_the_models(store_url: str) -> None:
    missing = {diff[1].name for diff in schema_differences(store_url)
               if isinstance(diff, tuple) and diff[0] == "add_table"}
    assert missing == set(Base.metadata.tables)  # the comparison does see a schema that is not there
    JobHistory.open(store_url).close()
    assert schema_differences(store_url) == []


def test_a_newer_schema_is_refused(store_url: str) -> None:
    JobHistory.open(store_url).close()
    engine = create_engine(store_url)
    try:
        with engine.begin() as connection:
            connection.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = '9999_from_the_future'"))
    finally:
        engine.dispose()
    with pytest.raises(ProfilerStoreError, match=r"revision 9999_from_the_future.*newer kubecell"):
        JobHistory.open(store_url)


def test_tables_without_a_version_are_left_alone(store_url: str) -> None:
    engine = create_engine(store_url)
    try:
        with engine.begin() as connection:
            connection.execute(text("CREATE TABLE profiler_jobs (id INTEGER)"))
    finally:
        engine.dispose()
    with pytest.raises(ProfilerStoreError, match="no profiler_schema_version"):
        JobHistory.open(store_url)


def test_a_corrupt_sqlite_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    path.write_bytes(b"this is not a database, just some bytes " * 200)
    with pytest.raises(ProfilerStoreError, match="not a SQLite database, or is corrupt"):
        JobHistory.open(f"sqlite:///{path}")


def test_a_foreign_sqlite_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    engine = create_engine(f"sqlite:///{path}")
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE invoices (id INTEGER PRIMARY KEY)"))
    engine.dispose()
    with pytest.raises(ProfilerStoreError, match="database of something else"):
        JobHistory.open(f"sqlite:///{path}")


@pytest.mark.parametrize(("url", "message"), [
    ("not a url", "not a database URL"),
    ("mysql://db/history", "unsupported database 'mysql'"),
    ("postgresql+nosuchdriver://h/db", "cannot use"),
    ("sqlite:////no/such/directory/history.db", "no directory"),
])
def test_bad_urls(url: str, message: str) -> None:
    with pytest.raises(ProfilerStoreError, match=message) as caught:
        JobHistory.open(url)
    assert isinstance(caught.value, KubecellError)


def test_an_unreachable_server_is_refused() -> None:
    url = f"postgresql+psycopg://kubecell@127.0.0.1:{free_port()}/history?connect_timeout=5"
    with pytest.raises(ProfilerStoreError, match="cannot open the job history") as caught:
        JobHistory.open(url)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("edit", [
    "UPDATE profiler_jobs SET gpus_per_pod = 'many'",  # SQLite keeps text in an INTEGER column
    "UPDATE profiler_jobs SET nodes = '" + "[" * 100_000 + "]" * 100_000 + "'",
], ids=["text in a number column", "JSON nested 100,000 deep"])
def test_a_hand_edited_store_is_a_store_error_not_a_traceback(tmp_path: Path, edit: str) -> None:
    """The store is a file anyone may edit; before, these escaped ``profile recommend`` and ``report`` as a
    TypeError and a RecursionError."""
    url = f"sqlite:///{tmp_path / 'h.db'}"
    with JobHistory.open(url) as history:
        history.save(JobRecord(uid="uid-e", namespace="ns", owner_kind="Job", owner_name="train-1", created=T0,
                               gpus_per_pod=1, nodes=("n1",)))
    with sqlite3.connect(tmp_path / "h.db") as connection:
        connection.execute(edit)
    with JobHistory.open(url) as history, pytest.raises(ProfilerStoreError, match="listing jobs in sqlite"):
        history.jobs()
