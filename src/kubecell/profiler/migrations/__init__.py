"""Alembic migrations of the job history, run from code by :mod:`kubecell.profiler.store.migrate`.

The directory is Alembic's script location: ``env.py`` and the revisions in ``versions/``. Revisions are written
by hand and named ``NNNN_what.py``; ``tests/profiler`` checks that head builds exactly the schema of
:mod:`kubecell.profiler.store.schema` on SQLite and PostgreSQL."""
