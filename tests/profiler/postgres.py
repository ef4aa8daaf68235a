"""A throwaway PostgreSQL server for tests: ``initdb`` into a temporary directory, started on 127.0.0.1 with a
free port (its unix socket in that directory), stopped with ``pg_ctl stop -m fast`` and removed afterwards.

The server binaries come from Debian's ``postgresql-NN`` package (``/usr/lib/postgresql/NN/bin``, the newest
version found) or from ``PATH``; where there are none the test is skipped with a message saying so. PostgreSQL
refuses to run as root, and CI runs tests as root: then ``initdb`` and ``pg_ctl`` run as the ``postgres`` user
(``subprocess``'s ``user=``/``group=``, what ``runuser -u postgres`` does) in a directory chowned to it. Trust
authentication is enough: the server listens on loopback only and lives as long as the test session.
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any

import psycopg
import pytest

from kubecell.testbed.processes import free_port

START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30
SUPERUSER = "kubecell"


def server_binaries() -> Path:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``; skips the test where there is none."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                        key=lambda path: [int(part) for part in re.findall(r"\d+", path)], reverse=True)
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(str(Path(on_path).parent))
    for directory in candidates:
        if all(os.access(Path(directory) / name, os.X_OK) for name in ("initdb", "pg_ctl", "postgres")):
            return Path(directory)
    pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl, postgres) under /usr/lib/postgresql/*/bin or on "
                "PATH: install Debian's postgresql package to run the PostgreSQL half of these tests")


@dataclass
class PostgresServer:
    """A running server; ``url`` is its first database, :meth:`fresh_database` makes another."""

    port: int
    url: str = ""
    _names: Iterator[int] = field(default_factory=lambda: count(1))

    def database_url(self, database: str) -> str:
        return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def _admin(self) -> psycopg.Connection[Any]:
        return psycopg.connect(host="127.0.0.1", port=self.port, user=SUPERUSER, dbname="postgres",
                               autocommit=True, connect_timeout=10)

    def fresh_database(self) -> str:
        """A new empty database; its URL."""
        name = f"history_{next(self._names)}"
        with self._admin() as admin:
            admin.execute(f'CREATE DATABASE "{name}"')  # a name of our own making, never user input
        return self.database_url(name)

    def drop_database(self, url: str) -> None:
        name = url.rsplit("/", 1)[1]
        with self._admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _as_server_user() -> dict[str, Any]:
    """``subprocess`` arguments that run a command as the ``postgres`` user when we are root; none otherwise."""
    if os.geteuid() != 0:
        return {}
    try:
        account = pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("running as root, and PostgreSQL refuses root, but there is no 'postgres' user to run it as")
    return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}


def _run(command: list[str], log: Path, timeout: float, as_user: dict[str, Any], *, check: bool = True) -> int:
    """Run ``command`` (output to ``log``, never to a pipe a server child could keep open); fail with the log."""
    with log.open("ab") as out:
        try:
            result = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    timeout=timeout, check=False, env={**os.environ, "LC_ALL": "C"}, **as_user)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{Path(command[0]).name} did not finish in {timeout} s; its log:\n{_tail(log)}")
    if check and result.returncode != 0:
        pytest.fail(f"{' '.join(command)} exited {result.returncode}; its log:\n{_tail(log)}")
    return result.returncode


def _start(binaries: Path, root: Path, as_user: dict[str, Any], attempts: int = 3) -> int:
    """Start the server on a free port; its port. The port is free when probed but may be taken before the
    server binds it, so a start that fails on the port is tried again on another."""
    data, log = root / "data", root / "server.log"
    for attempt in range(1, attempts + 1):
        port = free_port()
        options = (f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=off -c synchronous_commit=off "
                   "-c full_page_writes=off -c max_connections=50")
        command = [str(binaries / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", str(START_TIMEOUT_S),
                   "-o", options, "start"]
        if _run(command, root / "pg_ctl.log", START_TIMEOUT_S + 10, as_user, check=False) == 0:
            return port
        if attempt == attempts or "could not bind" not in _tail(log):
            break
    pytest.fail(f"PostgreSQL did not start ({attempt} attempts); its log:\n{_tail(log)}\n{_tail(root / 'pg_ctl.log')}")


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-4000:] if path.exists() else "(no log)"


@contextmanager
def throwaway_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server for the length of the ``with``, with one database created (``server.url``)."""
    binaries = server_binaries()
    as_user = _as_server_user()
    # /tmp rather than pytest's tmp_path: the postgres user must be able to reach it, and the socket path is
    # limited to about 100 characters
    root = Path(tempfile.mkdtemp(prefix="kubecell-pg-", dir="/tmp" if Path("/tmp").is_dir() else None))
    if as_user:
        os.chown(root, as_user["user"], as_user["group"])
    data = root / "data"
    try:
        _run([str(binaries / "initdb"), "-D", str(data), "-U", SUPERUSER, "--auth=trust", "--no-locale",
              "-E", "UTF8", "--no-sync"], root / "initdb.log", START_TIMEOUT_S, as_user)
        server = PostgresServer(_start(binaries, root, as_user))
        server.url = server.fresh_database()
        yield server
    finally:
        if (data / "postmaster.pid").exists():
            _stop(binaries, data, root, as_user)
        shutil.rmtree(root, ignore_errors=True)


def _stop(binaries: Path, data: Path, root: Path, as_user: dict[str, Any]) -> None:
    """``pg_ctl stop -m fast``; if that fails, ``-m immediate`` (the same server, by its data directory)."""
    for mode in ("fast", "immediate"):
        try:
            subprocess.run([str(binaries / "pg_ctl"), "-D", str(data), "-m", mode, "-w", "-t", str(STOP_TIMEOUT_S),
                            "stop"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=STOP_TIMEOUT_S + 10, check=True, **as_user)
            return
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            continue
