"""The job history's tables, as SQLAlchemy models; the migrations in ``kubecell.profiler.migrations`` build the
same schema, and a test compares the two.

Every table name starts with ``profiler_`` and the Alembic version table is ``profiler_schema_version``, so a
PostgreSQL database shared with other applications (and their own Alembic) holds the history side by side.
Strings a query filters on are bounded (``String(n)``, indexed); free text (names, images, messages) is
``Text``, since PostgreSQL's B-tree indexes refuse entries over about 2.7 kB. A distribution is a row of eleven
``DOUBLE PRECISION`` deciles, which both backends keep bit for bit.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Dialect,
    Double,
    ForeignKey,
    ForeignKeyConstraint,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

VERSION_TABLE = "profiler_schema_version"
UID_LENGTH = 128
"""Kubernetes uids are 36 characters; gangs of other schedulers may use longer keys."""
KEY_LENGTH = 253
"""namespace, user, virtual cluster, family: the longest Kubernetes name."""
SHORT_LENGTH = 63
"""owner kind, outcome: a Kubernetes label value."""
METRIC_LENGTH = 128
PARTNER_LENGTH = 2 * KEY_LENGTH + 1
"""A partner family's key, ``namespace/family``."""
DECILE_COLUMNS = tuple(f"p{10 * i}" for i in range(11))

NAMING = {"ix": "ix_%(column_0_label)s", "uq": "uq_%(table_name)s_%(column_0_name)s",
          "fk": "fk_%(table_name)s_%(column_0_name)s", "pk": "pk_%(table_name)s"}
"""Constraint names fixed here so that the hand-written migration and the models agree on every backend."""


class UTCDateTime(TypeDecorator[datetime]):
    """An instant in UTC: ``timestamp with time zone`` on PostgreSQL; on SQLite, where a timestamp is text, a
    naive UTC time, so that text order is time order. Reads back timezone-aware UTC either way."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value.isoformat()}: the history keeps timezone-aware instants")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class JobRow(Base):
    __tablename__ = "profiler_jobs"

    uid: Mapped[str] = mapped_column(String(UID_LENGTH), primary_key=True)
    namespace: Mapped[str] = mapped_column(String(KEY_LENGTH), index=True)
    owner_kind: Mapped[str] = mapped_column(String(SHORT_LENGTH))
    owner_name: Mapped[str] = mapped_column(Text)
    user_name: Mapped[str | None] = mapped_column(String(KEY_LENGTH), index=True)
    vc: Mapped[str | None] = mapped_column(String(KEY_LENGTH), index=True)
    image: Mapped[str | None] = mapped_column(Text)
    family: Mapped[str] = mapped_column(String(KEY_LENGTH), index=True)
    pod_count: Mapped[int] = mapped_column(Integer)
    gpus_per_pod: Mapped[int] = mapped_column(Integer)
    milli_gpu_per_pod: Mapped[int] = mapped_column(Integer)
    gpu_memory_mib_per_pod: Mapped[int | None] = mapped_column(Integer)
    gpu_model_requested: Mapped[str | None] = mapped_column(Text)
    nodes: Mapped[list[str]] = mapped_column(JSON)
    gpu_model: Mapped[str | None] = mapped_column(Text)
    created: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    started: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished: Mapped[datetime | None] = mapped_column(UTCDateTime, index=True)
    outcome: Mapped[str] = mapped_column(String(SHORT_LENGTH))
    problems: Mapped[list[str]] = mapped_column(JSON)

    pods: Mapped[list[PodRow]] = relationship(order_by="PodRow.position", passive_deletes=True, lazy="raise")
    metrics: Mapped[list[JobMetricRow]] = relationship(passive_deletes=True, lazy="raise")
    sharing: Mapped[list[SharingRow]] = relationship(order_by="SharingRow.partner", passive_deletes=True,
                                                     lazy="raise")


class SharingRow(Base):
    """How a job's share pods used their GPUs beside one partner family (``partner`` ``namespace/family``), or
    alone (``partner`` ``""``): the seconds observed and the integral of the pods' own utilization over them."""

    __tablename__ = "profiler_job_sharing"

    job_uid: Mapped[str] = mapped_column(ForeignKey("profiler_jobs.uid", ondelete="CASCADE"), primary_key=True)
    partner: Mapped[str] = mapped_column(String(PARTNER_LENGTH), primary_key=True)
    seconds: Mapped[float] = mapped_column(Double)
    busy_seconds: Mapped[float] = mapped_column(Double)


class PodRow(Base):
    __tablename__ = "profiler_pods"

    job_uid: Mapped[str] = mapped_column(ForeignKey("profiler_jobs.uid", ondelete="CASCADE"), primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(Text)
    node: Mapped[str | None] = mapped_column(Text)
    phase: Mapped[str] = mapped_column(String(SHORT_LENGTH))
    started: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished: Mapped[datetime | None] = mapped_column(UTCDateTime)

    metrics: Mapped[list[PodMetricRow]] = relationship(passive_deletes=True, lazy="raise")


class _Deciles:
    """The columns of one distribution, shared by the job's and the pods' metric tables."""

    metric: Mapped[str] = mapped_column(String(METRIC_LENGTH), primary_key=True)
    p0: Mapped[float] = mapped_column(Double)
    p10: Mapped[float] = mapped_column(Double)
    p20: Mapped[float] = mapped_column(Double)
    p30: Mapped[float] = mapped_column(Double)
    p40: Mapped[float] = mapped_column(Double)
    p50: Mapped[float] = mapped_column(Double)
    p60: Mapped[float] = mapped_column(Double)
    p70: Mapped[float] = mapped_column(Double)
    p80: Mapped[float] = mapped_column(Double)
    p90: Mapped[float] = mapped_column(Double)
    p100: Mapped[float] = mapped_column(Double)
    mean: Mapped[float] = mapped_column(Double)
    samples: Mapped[int] = mapped_column(BigInteger)
    seconds: Mapped[float] = mapped_column(Double)


class JobMetricRow(_Deciles, Base):
    __tablename__ = "profiler_job_metrics"

    job_uid: Mapped[str] = mapped_column(ForeignKey("profiler_jobs.uid", ondelete="CASCADE"), primary_key=True)


class PodMetricRow(_Deciles, Base):
    __tablename__ = "profiler_pod_metrics"
    __table_args__ = (ForeignKeyConstraint(["job_uid", "pod_position"],
                                           ["profiler_pods.job_uid", "profiler_pods.position"], ondelete="CASCADE"),)

    job_uid: Mapped[str] = mapped_column(String(UID_LENGTH), primary_key=True)
    pod_position: Mapped[int] = mapped_column(Integer, primary_key=True)


def deciles_of(row: _Deciles) -> tuple[float, ...]:
    return tuple(float(getattr(row, column)) for column in DECILE_COLUMNS)


def decile_values(deciles: tuple[float, ...]) -> dict[str, Any]:
    return dict(zip(DECILE_COLUMNS, deciles, strict=True))
