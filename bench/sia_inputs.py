"""The Sia workloads for the elastic benches: where they live, and one clear message when they do not."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from kubecell.core.errors import InvalidInputError
from kubecell.sim.elastic.policies import PolicySpec, policy_spec, with_options
from kubecell.sim.elastic.runner import ElasticInputs, load_inputs

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "sia-sosp23-workloads"
"""``../shared/data/sia-sosp23-workloads`` next to the repository (see its SOURCE.md)."""


def load_or_explain(workload: Path) -> ElasticInputs | None:
    """The workloads under ``workload`` (a file or a directory), or None after saying on stderr why not."""
    if not workload.exists():
        print(f"{workload}: not found. The Sia workloads live in ../shared/data/sia-sosp23-workloads next to "
              "the repository (see its SOURCE.md); pass --workload to use others.", file=sys.stderr)
        return None
    try:
        return load_inputs(workload)
    except InvalidInputError as error:
        print(str(error), file=sys.stderr)
        return None


def policy_or_explain(name: str, options: Sequence[str] = ()) -> PolicySpec | None:
    """The elastic policy registered as ``name``, with ``options`` (``KEY=VALUE`` of ``ElasticOptions``) replaced,
    or None after saying on stderr why not."""
    try:
        return with_options(policy_spec(name), options)
    except InvalidInputError as error:
        print(str(error), file=sys.stderr)
        return None
