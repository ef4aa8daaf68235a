"""kube-scheduler's configuration for extender mode, from the sample shipped in ``deploy/extender``.

The end-to-end tests and the bench run the sample itself, with only what differs per installation
replaced (the extender's URL, the kubeconfig, leader election, client rate limits), so the file operators
copy is the file that is tested.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

SAMPLE = Path(__file__).resolve().parents[4] / "deploy" / "extender" / "kube-scheduler-config.yaml"
"""The sample in a source checkout (absent from an installed wheel: pass ``template`` there)."""


def render(*, url: str, kubeconfig: str, node_cache: bool = True, leader_elect: bool = False,
           qps: int | None = None, template: Path = SAMPLE) -> str:
    """The sample with ``url`` as the extender's ``urlPrefix`` and the given client settings."""
    config: dict[str, Any] = yaml.safe_load(template.read_text())
    config["clientConnection"]["kubeconfig"] = kubeconfig
    if qps is not None:  # scheduler_perf's client limits; the default 50 QPS caps binds at 50 pods/s
        config["clientConnection"].update(qps=qps, burst=qps)
    config["leaderElection"]["leaderElect"] = leader_elect
    extender = config["extenders"][0]
    extender["urlPrefix"] = url
    extender["nodeCacheCapable"] = node_cache
    return yaml.safe_dump(config, sort_keys=False)
