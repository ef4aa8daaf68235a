"""The revisions, oldest first (Alembic orders them by ``down_revision``, not by file name)."""
