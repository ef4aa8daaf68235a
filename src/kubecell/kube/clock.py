"""Timestamps in the format the Kubernetes API uses (RFC 3339, UTC, ``Z``)."""

from __future__ import annotations

import datetime


def rfc3339(moment: datetime.datetime | None = None) -> str:
    """Seconds precision, as ``metav1.Time`` serialises."""
    when = moment or datetime.datetime.now(datetime.UTC)
    return when.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_micro(moment: datetime.datetime | None = None) -> str:
    """Microsecond precision, as ``metav1.MicroTime`` (Lease renew times, Event times) requires."""
    when = moment or datetime.datetime.now(datetime.UTC)
    return when.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
