"""The job history's storage: SQLAlchemy tables, engines and Alembic migrations behind
:class:`kubecell.profiler.history.JobHistory`. Nothing here is public API; the records are."""
