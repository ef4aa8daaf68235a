"""What every simulator report's figures share: names drawn as they were written.

Matplotlib reads text between two ``$`` as mathematics, and a name it cannot typeset (a VC named ``x$\\foo$``, a
workload folder, a pods file) raised ``ValueError: Unknown symbol`` after the whole simulation had run, leaving
the output directory without its report. The names come from the user's files, so no figure parses them."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

P = ParamSpec("P")
R = TypeVar("R")


def plain_text(draw: Callable[P, R]) -> Callable[P, R]:
    """``draw`` with matplotlib's mathtext off: every ``$`` is a dollar sign."""

    @functools.wraps(draw)
    def drawn(*args: P.args, **kwargs: P.kwargs) -> R:
        with plt.rc_context({"text.parse_math": False}):
            return draw(*args, **kwargs)

    return drawn
