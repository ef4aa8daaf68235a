"""Opening a job history: the engine for a URL, and its schema brought to this code's head revision.

Alembic runs from code (no ``alembic.ini``): the script location is the ``kubecell.profiler.migrations``
package directory, so an installed wheel migrates its database as a checkout does. Before migrating, the
database is checked: a revision this code does not know (written by a newer kubecell) is refused rather than
guessed at, and a database that holds tables but no job history is not written into.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, event, inspect, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

from kubecell.profiler import migrations
from kubecell.profiler.store.errors import ProfilerStoreError, describe
from kubecell.profiler.store.schema import VERSION_TABLE, Base

CONNECT_TIMEOUT_S = 10
"""How long to wait for a PostgreSQL server that does not answer, so that a wrong host fails, not hangs."""
SQLITE_BUSY_TIMEOUT_S = 30
"""How long a SQLite transaction waits for another process's write lock before failing."""
MIGRATION_LOCK = 0x6B63_6A68  # "kcjh": the PostgreSQL advisory lock that serialises concurrent migrations
_ALEMBIC = threading.Lock()
"""Alembic's ``context`` and ``op`` are module-level proxies: one migration at a time in a process."""
SUPPORTED = "sqlite:///path/to/history.db or postgresql+psycopg://user:password@host:5432/database"


def alembic_config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).resolve().parent))
    config.attributes["connection"] = connection
    config.attributes["version_table"] = VERSION_TABLE
    config.attributes["target_metadata"] = Base.metadata
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "the migrations package has no revision"
    return head


def parse_url(url: str) -> URL:
    """The URL with its driver made explicit: plain ``postgresql://`` means psycopg 3, the one installed."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as error:
        raise ProfilerStoreError(f"not a database URL: {url!r} (accepted: {SUPPORTED})") from error
    backend = parsed.get_backend_name()
    if backend == "postgresql" and parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    if backend not in ("sqlite", "postgresql"):
        raise ProfilerStoreError(f"unsupported database {backend!r} in {parsed.render_as_string()!r} "
                                 f"(accepted: {SUPPORTED})")
    if backend == "sqlite" and parsed.database not in (None, "", ":memory:"):
        directory = Path(parsed.database).expanduser().resolve().parent
        if not directory.is_dir():
            raise ProfilerStoreError(f"cannot create the job history {parsed.database}: no directory {directory}")
    return parsed


def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    """Take transactions away from the pysqlite driver (which begins them late, and never for DDL) so that
    :func:`_sqlite_begin` can; and let SQLite enforce the foreign keys the schema declares."""
    if isinstance(dbapi_connection, sqlite3.Connection):
        dbapi_connection.isolation_level = None
        dbapi_connection.execute("PRAGMA foreign_keys = ON")


def _sqlite_begin(connection: Connection) -> None:
    """Every transaction takes SQLite's write lock up front: two processes opening a new file then migrate one
    after the other (the second sees the first's tables) instead of both creating them, and a save never fails
    half-way on a lock it could not upgrade. Writes to a job history are rare; waiting is bounded by the
    driver's busy timeout."""
    connection.exec_driver_sql("BEGIN IMMEDIATE")


def create(url: str) -> Engine:
    parsed = parse_url(url)
    connect_args: dict[str, Any] = {}
    if parsed.get_backend_name() == "postgresql" and "connect_timeout" not in parsed.query:
        connect_args["connect_timeout"] = CONNECT_TIMEOUT_S
    if parsed.get_backend_name() == "sqlite" and "timeout" not in parsed.query:
        connect_args["timeout"] = SQLITE_BUSY_TIMEOUT_S
    try:
        engine = create_engine(parsed, connect_args=connect_args, pool_pre_ping=True)
    except (ArgumentError, NoSuchModuleError, ImportError) as error:
        raise ProfilerStoreError(f"cannot use {parsed.render_as_string()!r}: {describe(error)} "
                                 f"(accepted: {SUPPORTED})") from error
    if parsed.get_backend_name() == "sqlite":
        event.listen(engine, "connect", _sqlite_connect)
        event.listen(engine, "begin", _sqlite_begin)
    return engine


def where(engine: Engine) -> str:
    """The database, for messages: its URL without the password."""
    return engine.url.render_as_string(hide_password=True)


def upgrade(engine: Engine, *, create: bool = True) -> None:
    """Check the database and migrate it to head, in one transaction where the backend allows (PostgreSQL);
    raises :class:`ProfilerStoreError` for anything that stops it. ``create`` False: a database holding no job
    history yet is refused, not made one (a command that only reads, given a mistyped URL)."""
    try:
        with engine.begin() as connection:
            if connection.dialect.name == "postgresql":
                connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
            _check(connection, where(engine), create=create)
            with _ALEMBIC:
                command.upgrade(alembic_config(connection), "head")
    except ProfilerStoreError:
        raise
    except sqlite3.DatabaseError as error:  # raised by the pysqlite driver outside SQLAlchemy's wrapping
        raise ProfilerStoreError(f"{where(engine)} is not a job history: {error}") from error
    except SQLAlchemyError as error:
        message = describe(error)
        if "file is not a database" in message or "malformed" in message:
            raise ProfilerStoreError(f"{where(engine)} is not a SQLite database, or is corrupt: {message}") from error
        raise ProfilerStoreError(f"cannot open the job history {where(engine)}: {message}") from error


def _check(connection: Connection, place: str, *, create: bool = True) -> None:
    tables = set(inspect(connection).get_table_names())
    ours = set(Base.metadata.tables)
    if VERSION_TABLE not in tables and not create:
        raise ProfilerStoreError(f"{place} holds no job history: 'kubecell profile collect --db ...' makes one")
    if VERSION_TABLE not in tables:
        if tables & ours:
            raise ProfilerStoreError(f"{place} has tables {sorted(tables & ours)} but no {VERSION_TABLE}: "
                                     "not a job history this code wrote; it is left alone")
        if tables and connection.dialect.name == "sqlite":
            raise ProfilerStoreError(f"{place} is a SQLite database of something else (tables {sorted(tables)[:5]}); "
                                     "a job history needs a file of its own")
        return
    heads = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE}).get_current_heads()
    script = ScriptDirectory.from_config(alembic_config())
    known = {revision.revision for revision in script.walk_revisions()}
    unknown = [head for head in heads if head not in known]
    if unknown:
        raise ProfilerStoreError(
            f"{place} has the job history schema at revision {', '.join(unknown)}, which this kubecell does not know "
            f"(it knows up to {script.get_current_head()}): a newer kubecell wrote it; upgrade kubecell to use it")
