"""What a job's share pods did beside each partner family on a shared GPU, and alone.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "profiler_job_sharing",
        sa.Column("job_uid", sa.String(128), nullable=False),
        sa.Column("partner", sa.String(507), nullable=False),
        sa.Column("seconds", sa.Double(), nullable=False),
        sa.Column("busy_seconds", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("job_uid", "partner", name="pk_profiler_job_sharing"),
        sa.ForeignKeyConstraint(["job_uid"], ["profiler_jobs.uid"], name="fk_profiler_job_sharing_job_uid",
                                ondelete="CASCADE"),
    )


def downgrade() -> None:
    op.drop_table("profiler_job_sharing")
