"""Property: whatever the cluster, jobs and their current holdings, the policy's answer keeps the contract."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubecell.core.elastic.allocator import ElasticOptions, KubecellElasticPolicy
from kubecell.core.elastic.types import ClusterNode, ElasticJobView
from tests.core.elastic.support import TableGoodput, view
from tests.core.elastic.test_allocator import check

TYPES = ("t4", "rtx", "a100")


@st.composite
def clusters(draw: st.DrawFn) -> list[ClusterNode]:
    nodes: list[ClusterNode] = []
    for gpu_type in draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=3, unique=True)):
        for i in range(draw(st.integers(1, 4))):
            nodes.append(ClusterNode(f"{gpu_type}-{i}", gpu_type, draw(st.sampled_from([1, 2, 4, 8]))))
    return nodes


@st.composite
def jobs(draw: st.DrawFn, nodes: list[ClusterNode]) -> list[ElasticJobView]:
    names = [n.name for n in nodes] + ["lost-node"]
    out = []
    for i in range(draw(st.integers(0, 24))):
        low = draw(st.integers(0, 6))
        high = draw(st.integers(max(low, 1), 40))
        speed = {t: draw(st.floats(0.1, 10.0)) for t in draw(st.sets(st.sampled_from(TYPES)))}
        current = draw(st.lists(st.sampled_from(names), max_size=10))
        allowed = draw(st.none() | st.frozensets(st.sampled_from(TYPES), min_size=1))
        out.append(view(f"j{i}", TableGoodput(speed, draw(st.floats(0.3, 1.0))), current=current,
                        submitted=draw(st.floats(0, 1e4)), min_replicas=low, max_replicas=high,
                        last_resize=draw(st.none() | st.floats(0, 1e4)), attained=draw(st.floats(0, 1e6)),
                        restart=draw(st.floats(0, 300)), gpu_types=allowed))
    return out


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_capacity_bounds_and_one_type_always_hold(data: st.DataObject) -> None:
    nodes = data.draw(clusters())
    views = data.draw(jobs(nodes))
    options = ElasticOptions(min_resize_seconds=data.draw(st.sampled_from([0.0, 300.0])),
                             fairness=data.draw(st.sampled_from([0.0, 1.0, 1.5])))
    policy = KubecellElasticPolicy(options)
    decision = policy.allocate(1e4 + 60, views, nodes)
    check(decision, views, nodes)
    assert set(policy.last_reasons) == {j.name for j in views}
    # Feed the answer back as what the jobs hold: still within the contract, still every job answered.
    again = [view(j.name, j.estimate, current=decision[j.name], submitted=j.submitted, min_replicas=j.min_replicas,
                  max_replicas=j.max_replicas, last_resize=1e4 + 60, attained=j.attained_gpu_seconds + 60,
                  restart=j.restart_seconds, gpu_types=j.gpu_types) for j in views]
    check(policy.allocate(1e4 + 120, again, nodes), again, nodes)
