"""Alembic's environment for the job history: online only, on the connection the caller opened.

:func:`kubecell.profiler.store.migrate.upgrade` passes its connection (inside its transaction, after taking the
migration lock) in ``config.attributes``; there is no offline (SQL script) mode and no logging setup, since
the profiler, not Alembic's command line, owns the process."""

from __future__ import annotations

from alembic import context

from kubecell.profiler.store.schema import VERSION_TABLE, Base


def run() -> None:
    config = context.config
    connection = config.attributes.get("connection")
    if connection is None or context.is_offline_mode():
        raise RuntimeError("the job history migrates from kubecell.profiler.store.migrate.upgrade, online only")
    context.configure(connection=connection, target_metadata=Base.metadata, version_table=VERSION_TABLE,
                      render_as_batch=connection.dialect.name == "sqlite", compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


run()
