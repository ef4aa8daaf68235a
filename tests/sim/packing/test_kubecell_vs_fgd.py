"""kubecell's placement policy against FGD on the real openb trace, same protocol and code path.

Default trace, tune 1.3, seed 42: FGD is handed the trace's typical pods in advance, kubecell learns
everything online; kubecell must leave at least 10 % fewer GPUs unallocated at 130 % arrived load and
no more than FGD at 100 %. The full 10-seed comparison on every trace is bench/placement.py.
"""

from __future__ import annotations

import pytest

from kubecell.sim.packing.runner import run_grid
from tests.sim.support import openb_file

pytestmark = pytest.mark.shared_data


def test_kubecell_leaves_fewer_gpus_idle_than_fgd_on_the_default_trace() -> None:
    nodes = openb_file("csv", "openb_node_list_gpu_node.csv")
    pods = openb_file("csv", "openb_pod_list_default.csv")
    summaries = {s.policy: s for s in run_grid(nodes, pods, ["fgd", "kubecell"], [42], jobs=2)}
    idle = {(p, x): summaries[p].at("unallocated_pct", x).mean for p in summaries for x in (100, 130)}
    report = ", ".join(f"{p} @{x}: {v:.2f} %" for (p, x), v in idle.items())
    assert idle["kubecell", 130] <= 0.90 * idle["fgd", 130], report
    assert idle["kubecell", 100] <= idle["fgd", 100], report
