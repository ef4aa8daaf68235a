"""Where the testbed keeps its binaries and its running state.

Binaries are expensive to build (minutes of compile on a laptop) and identical across checkouts of
the same Go module files, so they live in a per-user cache keyed by the Kubernetes version, never in
the repository. A running testbed's state (certificates, kubeconfigs, logs, etcd data, process ids)
lives in one directory so that ``kubecell testbed down`` from another shell can find and stop it.
"""

from __future__ import annotations

from pathlib import Path

from kubecell.cache import cache_root

K8S_VERSION = "v1.37.2"
"""The Kubernetes release the testbed builds (its staging modules are replaced by ``v0.37.2``)."""

ETCD_VERSION = "v3.7.3"
"""etcd release built for the testbed; Kubernetes 1.37 already links etcd 3.7 client libraries."""


def binary_dir(version: str = K8S_VERSION) -> Path:
    """The directory holding ``etcd``, ``kube-apiserver`` and ``kube-scheduler`` for ``version``."""
    return cache_root() / "testbed" / version / "bin"


def default_state_dir() -> Path:
    """Where ``kubecell testbed up`` keeps a running testbed unless told otherwise."""
    return cache_root() / "testbed" / "run"


def go_modules_dir() -> Path:
    """The repository's ``testbed/`` directory with the Go wrapper modules (a source checkout only)."""
    return Path(__file__).resolve().parents[3] / "testbed"
