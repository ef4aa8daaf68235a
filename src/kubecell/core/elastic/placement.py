"""Where the replicas of sized elastic jobs go: a GPU count of one type -> node name per replica.

Why a step of its own: the sizing policy decides counts per GPU type (what it can price), and any count within
a type's free GPUs can be placed because a replica takes one GPU on any node. Placement then only has to be
compact (few nodes: inter-node synchronisation is the dearest part of a step) and stable (a job whose size and
type did not change keeps exactly its nodes, so it does not restart). Rules, per GPU type:

1. jobs that keep their allocation are pinned first, on their own nodes;
2. the others are placed largest first (big jobs need whole nodes, small ones fill gaps): while the job needs
   at least as many GPUs as the emptiest node has free, it takes that whole node (fewest nodes); the rest goes
   to the node with the fewest free GPUs that still holds it (best fit, which leaves whole nodes whole), and
   only when no node holds it is it spread over the nodes with the most free GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kubecell.core.elastic.types import ClusterNode


class NodePool:
    """Free GPUs per node of one GPU type, in the caller's node order (ties go to the earlier node)."""

    def __init__(self, nodes: Sequence[ClusterNode]) -> None:
        self.names = [n.name for n in nodes]
        self.free = {n.name: n.gpus for n in nodes}
        self.order = {n.name: i for i, n in enumerate(nodes)}

    @property
    def total_free(self) -> int:
        return sum(self.free.values())

    def pin(self, replicas: Sequence[str]) -> bool:
        """Take the GPUs a job holds now, unchanged; False (nothing taken) when they are no longer free."""
        need: dict[str, int] = {}
        for name in replicas:
            need[name] = need.get(name, 0) + 1
        if any(self.free.get(name, 0) < k for name, k in need.items()):
            return False
        for name, k in need.items():
            self.free[name] -= k
        return True

    def take(self, count: int, prefer: Sequence[str] = ()) -> tuple[str, ...]:
        """Place ``count`` replicas compactly (module rules); ``prefer`` breaks ties towards a job's old nodes.
        The caller guarantees ``count <= total_free``."""
        if count > self.total_free:
            raise ValueError(f"{count} replicas do not fit in {self.total_free} free GPUs")
        preferred = set(prefer)
        out: list[str] = []
        remaining = count

        def rank_most(name: str) -> tuple[int, int, int]:
            return (-self.free[name], 0 if name in preferred else 1, self.order[name])

        while remaining > 0:
            candidates = [n for n in self.names if self.free[n] > 0]
            fullest_free = max(self.free[n] for n in candidates)
            if remaining >= fullest_free:
                name = min(candidates, key=rank_most)
            else:
                fitting = [n for n in candidates if self.free[n] >= remaining]
                name = min(fitting, key=lambda n: (self.free[n], 0 if n in preferred else 1, self.order[n]))
            k = min(remaining, self.free[name])
            self.free[name] -= k
            out.extend([name] * k)
            remaining -= k
        return tuple(out)


def place(plans: Mapping[str, tuple[str, int]], keep: Mapping[str, tuple[str, ...]],
          nodes: Sequence[ClusterNode], previous: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """Node name per replica for every job in ``plans`` (job -> (gpu type, count); count 0: not running).

    ``keep`` holds the jobs whose current nodes must be reused as they are (their plan equals what they hold).
    A kept job whose nodes are no longer free (an inconsistent caller state) is placed like the others. The
    counts per type must fit the type's GPUs, which the sizing policy guarantees.
    """
    pools: dict[str, NodePool] = {}
    by_type: dict[str, list[ClusterNode]] = {}
    for node in nodes:
        by_type.setdefault(node.gpu_type, []).append(node)
    for gpu_type, members in by_type.items():
        pools[gpu_type] = NodePool(members)
    result: dict[str, tuple[str, ...]] = {}
    pending: list[tuple[str, str, int]] = []
    for job, (gpu_type, count) in plans.items():
        if count <= 0:
            result[job] = ()
        elif job in keep and pools[gpu_type].pin(keep[job]):
            result[job] = keep[job]
        else:
            pending.append((job, gpu_type, count))
    pending.sort(key=lambda item: (-item[2], item[0]))
    for job, gpu_type, count in pending:
        result[job] = pools[gpu_type].take(count, prefer=previous.get(job, ()))
    return result
