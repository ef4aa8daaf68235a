"""The test suite's view of :mod:`kubecell.testbed.prometheus`: the same real Prometheus, skipped (not failed)
where the binaries are absent."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from kubecell.testbed import prometheus as real
from kubecell.testbed.prometheus import BASE_TIME, Family

__all__ = ["BASE_TIME", "Family", "backfilled", "binaries", "serve"]


def binaries() -> tuple[str, str]:
    """The prometheus and promtool binaries, or skip the test saying which is absent."""
    try:
        return real.binaries()
    except real.PrometheusMissingError as error:
        pytest.skip(f"{error}, to run the Prometheus tests")


@contextmanager
def serve(data: Path, scrape: Sequence[str] = ()) -> Iterator[str]:
    binaries()
    with real.serve(data, scrape) as url:
        yield url


@contextmanager
def backfilled(directory: Path, families: Iterable[Family]) -> Iterator[str]:
    binaries()
    with real.backfilled(directory, families) as url:
        yield url
