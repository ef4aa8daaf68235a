"""Timestamps in the format the Kubernetes API uses (RFC 3339, UTC, ``Z``)."""

from __future__ import annotations

import datetime
import re
from typing import Any

_RFC3339 = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?"
                      r"([Zz]|[+-][0-9]{2}:[0-9]{2})")


def rfc3339(moment: datetime.datetime | None = None) -> str:
    """Seconds precision, as ``metav1.Time`` serialises."""
    when = moment or datetime.datetime.now(datetime.UTC)
    return when.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_micro(moment: datetime.datetime | None = None) -> str:
    """Microsecond precision, as ``metav1.MicroTime`` (Lease renew times, Event times) requires."""
    when = moment or datetime.datetime.now(datetime.UTC)
    return when.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def is_api_time(text: Any) -> bool:
    """Whether ``text`` is a time a CRD's ``format: date-time`` accepts (RFC 3339 with a zone, ASCII digits)."""
    if not isinstance(text, str) or not _RFC3339.fullmatch(text):
        return False
    try:
        datetime.datetime.fromisoformat(text.upper().replace("Z", "+00:00"))
    except ValueError:  # a 13th month, a 31st of June
        return False
    return True
