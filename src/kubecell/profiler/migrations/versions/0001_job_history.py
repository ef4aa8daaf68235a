"""The job history: jobs, their pods, and the distributions of each metric per job and per pod.

Written by hand, as every revision here: it spells out the schema of ``kubecell.profiler.store.schema`` at the
time, not by importing it (a model changed later must not rewrite history). Constraint names follow the models'
naming convention.

Revision ID: 0001
Revises: (none)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None

DECILES = [f"p{10 * i}" for i in range(11)]


def _distribution() -> list[sa.Column[object]]:
    columns: list[sa.Column[object]] = [sa.Column(name, sa.Double(), nullable=False) for name in DECILES]
    columns += [sa.Column("mean", sa.Double(), nullable=False), sa.Column("samples", sa.BigInteger(), nullable=False),
                sa.Column("seconds", sa.Double(), nullable=False)]
    return columns


def upgrade() -> None:
    op.create_table(
        "profiler_jobs",
        sa.Column("uid", sa.String(128), nullable=False),
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("owner_kind", sa.String(63), nullable=False),
        sa.Column("owner_name", sa.Text(), nullable=False),
        sa.Column("user_name", sa.String(253), nullable=True),
        sa.Column("vc", sa.String(253), nullable=True),
        sa.Column("image", sa.Text(), nullable=True),
        sa.Column("family", sa.String(253), nullable=False),
        sa.Column("pod_count", sa.Integer(), nullable=False),
        sa.Column("gpus_per_pod", sa.Integer(), nullable=False),
        sa.Column("milli_gpu_per_pod", sa.Integer(), nullable=False),
        sa.Column("gpu_memory_mib_per_pod", sa.Integer(), nullable=True),
        sa.Column("gpu_model_requested", sa.Text(), nullable=True),
        sa.Column("nodes", sa.JSON(), nullable=False),
        sa.Column("gpu_model", sa.Text(), nullable=True),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished", sa.DateTime(timezone=True), nullable=True),
        sa.Column("outcome", sa.String(63), nullable=False),
        sa.Column("problems", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("uid", name="pk_profiler_jobs"),
    )
    for column in ("namespace", "user_name", "vc", "family", "created", "finished"):
        op.create_index(f"ix_profiler_jobs_{column}", "profiler_jobs", [column])
    op.create_table(
        "profiler_job_metrics",
        sa.Column("job_uid", sa.String(128), nullable=False),
        sa.Column("metric", sa.String(128), nullable=False),
        *_distribution(),
        sa.PrimaryKeyConstraint("job_uid", "metric", name="pk_profiler_job_metrics"),
        sa.ForeignKeyConstraint(["job_uid"], ["profiler_jobs.uid"], name="fk_profiler_job_metrics_job_uid",
                                ondelete="CASCADE"),
    )
    op.create_table(
        "profiler_pods",
        sa.Column("job_uid", sa.String(128), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("node", sa.Text(), nullable=True),
        sa.Column("phase", sa.String(63), nullable=False),
        sa.Column("started", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("job_uid", "position", name="pk_profiler_pods"),
        sa.ForeignKeyConstraint(["job_uid"], ["profiler_jobs.uid"], name="fk_profiler_pods_job_uid",
                                ondelete="CASCADE"),
    )
    op.create_table(
        "profiler_pod_metrics",
        sa.Column("job_uid", sa.String(128), nullable=False),
        sa.Column("pod_position", sa.Integer(), nullable=False),
        sa.Column("metric", sa.String(128), nullable=False),
        *_distribution(),
        sa.PrimaryKeyConstraint("job_uid", "pod_position", "metric", name="pk_profiler_pod_metrics"),
        sa.ForeignKeyConstraint(["job_uid", "pod_position"], ["profiler_pods.job_uid", "profiler_pods.position"],
                                name="fk_profiler_pod_metrics_job_uid", ondelete="CASCADE"),
    )


def downgrade() -> None:
    for table in ("profiler_pod_metrics", "profiler_pods", "profiler_job_metrics"):
        op.drop_table(table)
    for column in ("namespace", "user_name", "vc", "family", "created", "finished"):
        op.drop_index(f"ix_profiler_jobs_{column}", table_name="profiler_jobs")
    op.drop_table("profiler_jobs")
