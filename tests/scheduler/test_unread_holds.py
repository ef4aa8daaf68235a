"""A running pod whose ask kubecell cannot read still holds what its containers ask. Before, a pod another
scheduler bound (or one of kubecell's own whose annotation its owner broke, found again by a restarted
scheduler) with a malformed kubecell annotation was held as nothing, and its GPUs were given to another
tenant's pod: two pods on one GPU (found by a hostile review)."""

from __future__ import annotations

from typing import Any

import pytest

from kubecell.core.model import MILLI_PER_GPU
from kubecell.scheduler.foreign_holds import foreign_hold, unread_hold
from tests.core.support import engine, make_nodes
from tests.scheduler.test_shrink_pods import Loop
from tests.scheduler.trust_support import pod_body


def running(name: str, limits: dict[str, str], annotations: dict[str, str]) -> dict[str, Any]:
    body = pod_body("other", name, limits, annotations=annotations, scheduler="default-scheduler")
    body["metadata"].update(uid=f"uid-{name}", creationTimestamp="1970-01-01T00:00:00Z")
    body["spec"]["nodeName"] = "n0"
    body["status"] = {"phase": "Running"}
    return body


@pytest.mark.parametrize(("limits", "gpus"), [
    ({"nvidia.com/gpu": "8"}, 8), ({"kubecell.io/gpu": "3"}, 3), ({"kubecell.io/gpu-milli": "250"}, 1),
    ({"cpu": "2"}, 0)])
def test_an_unreadable_ask_is_held_by_the_containers_resources(limits: dict[str, str], gpus: int) -> None:
    pod = running("p", {**limits, "cpu": "2", "memory": "1Gi"}, {"kubecell.io/isolation": "bogus"})
    held = foreign_hold(pod, "external:p")
    assert held == unread_hold(pod, "external:p")
    assert (held.gpu_count, held.gpu_milli) == (gpus, MILLI_PER_GPU if gpus else 0)
    assert (held.cpu_milli, held.memory_mib) == (2000, 1024)


def test_no_pod_is_placed_on_the_gpus_of_a_running_pod_whose_ask_cannot_be_read() -> None:
    loop = Loop(engine(make_nodes(1), {"b": {"gpus": 8}}))
    loop.add(running("squatter", {"nvidia.com/gpu": "8"}, {"kubecell.io/isolation": "bogus"}))
    (held,) = loop.state.engine.book.allocations.values()
    assert held.gpu_indices == tuple(range(8))
    victim = pod_body("ns", "victim", {"nvidia.com/gpu": "8"})
    victim["metadata"].update(uid="uid-victim", creationTimestamp="1970-01-01T00:00:00Z")
    victim["status"] = {"phase": "Pending"}
    loop.add(victim)
    loop.cycle(1)
    assert not loop.mirror.pods["uid-victim"]["spec"].get("nodeName"), "the node's 8 GPUs are the squatter's"
    loop.pool.shutdown()
