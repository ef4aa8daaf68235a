"""Fixtures of the job history tests: every store test runs on SQLite and on a real PostgreSQL server.

The server is started once per session, only when a PostgreSQL test runs, and each test gets a database of
its own in it (as each SQLite test gets a file of its own in ``tmp_path``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.profiler.postgres import PostgresServer, throwaway_postgres


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    with throwaway_postgres() as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of an empty database, on each backend in turn."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'history.db'}"
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    url = server.fresh_database()
    yield url
    server.drop_database(url)
