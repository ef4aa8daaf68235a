"""The per-machine cache of kubecell: what is expensive to make and the same for every checkout (the testbed's
binaries, the node agent's generated gRPC stubs). One small module that no driver owns, so that the node agent
and the testbed find the same place without importing each other."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$KUBECELL_CACHE``, else ``$XDG_CACHE_HOME/kubecell``, else ``~/.cache/kubecell``."""
    explicit = os.environ.get("KUBECELL_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "kubecell"
