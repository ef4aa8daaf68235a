"""The kubecell placement policy: expected never-allocated GPU share, learned gap fates, host stranding.

Behaviour first: small hand-made clusters on which FGD leaves capacity idle and the kubecell policy
does not (look-ahead over the likely next requests, CPU and memory that strand GPUs), and one on which
what the cluster has shown overrides what the demand estimate alone would suggest. Then the measure's
parts by hand, the learned waste table, and properties every decision must keep.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubecell.core.book import AllocationBook
from kubecell.core.errors import InvalidInputError
from kubecell.core.model import Node, Request, make_node
from kubecell.core.placement.demand import DemandType
from kubecell.core.placement.frag import PodShape, TypicalPod
from kubecell.core.placement.gap_fate import GapFateModel, static_waste_table
from kubecell.core.placement.placer import Placer
from kubecell.core.placement.policies.expected_waste import ExpectedWastePolicy, prior_chain
from kubecell.core.placement.policies.fgd import FragmentationGradientDescent, sigmoid_score
from kubecell.core.placement.policy import Policy
from kubecell.core.placement.registry import DEFAULT_POLICY, make_policy
from kubecell.core.placement.waste import ExpectedWaste
from tests.core.placement.test_fgd import cluster_strategy, request_strategy, typical_strategy

GIB = 1024


def gpu_pod(name: str, *, cpu: int = 8000, memory: int = 0, milli: int = 1000) -> Request:
    return Request(name, cpu_milli=cpu, memory_mib=memory, gpu_count=1, gpu_milli=milli)


def t4_node(name: str, *, cpu: int = 64_000, memory: int = 64 * GIB, gpus: int = 1) -> Node:
    return make_node(name, cpu_milli=cpu, memory_mib=memory, gpu_count=gpus, gpu_model="T4")


def demand_of(typical: list[TypicalPod], memory_mib: int = 0) -> list[DemandType]:
    return [DemandType(t.shape, t.share, memory_mib) for t in typical]


def replay(nodes: list[Node], policy: Policy, requests: list[Request]) -> tuple[AllocationBook, list[str]]:
    """Place requests in order with ties going to the first node; return the book and the failures."""
    book = AllocationBook(nodes)
    placer = Placer(book, policy, tie_rank=np.arange(book.size, dtype=np.int64))
    failed = [r.name for r in requests if placer.place_and_commit(r) is None]
    return book, failed


# ------------------------------------------------------------------- where FGD strands and kubecell does not


def test_looking_ahead_keeps_a_gpu_whole_for_the_requests_that_follow() -> None:
    """Two one-GPU nodes; requests of 450 and 300 milli, in that mix. After a 450 on n0, FGD puts the
    second 450 on n1: pairing it with the first leaves 100 milli that no request can use, which its
    one-step measure counts as fragment, while two 550s look usable by everything. Then three 300s
    arrive: each 550 takes one and keeps 250 that nothing fits, and the third fails. The expected-waste
    measure sees that a 550 gap ends at 250 whatever comes, pairs the 450s (100 idle) and fits all
    three 300s on the free GPU: everything runs, 200 milli idle instead of 500."""
    nodes = [t4_node("n0"), t4_node("n1")]
    typical = [TypicalPod(PodShape(1000, 300, 1), 0.43), TypicalPod(PodShape(1000, 450, 1), 0.57)]
    requests = [gpu_pod(f"r{i}", cpu=1000, milli=m) for i, m in enumerate([450, 450, 300, 300, 300])]

    fgd_book, fgd_failed = replay(nodes, FragmentationGradientDescent(typical), requests)
    assert fgd_book.allocations["r1"].node == "n1"
    assert fgd_failed == ["r4"]
    assert int(fgd_book.gpu_avail.sum()) == 500

    ours_book, ours_failed = replay(nodes, ExpectedWastePolicy(demand_of(typical)), requests)
    assert ours_book.allocations["r1"].node == "n0"
    assert ours_failed == []
    assert int(ours_book.gpu_avail.sum()) == 200


def cpu_case() -> tuple[list[Node], list[Request], list[TypicalPod]]:
    """Two 2-GPU nodes, one with 20 vCPU and one with 40. A 10-vCPU CPU-only pod leaves node a with
    10 vCPU: FGD still sees one 8-vCPU GPU pod fit there (no change in its measure, a tie, node a),
    so of the four GPU pods that follow one fails and a GPU stays idle. The expected-waste measure
    sees that 10 vCPU feed 1.25 GPUs of 8-vCPU pods and 2 GPUs are left to fill, sends the CPU pod to
    node b, where its CPU was spare, and all four GPU pods run."""
    nodes = [t4_node("a", cpu=20_000, gpus=2), t4_node("b", cpu=40_000, gpus=2)]
    requests = [Request("cpu-job", cpu_milli=10_000)] + [gpu_pod(f"g{i}") for i in range(4)]
    typical = [TypicalPod(PodShape(8000, 1000, 1), 0.8), TypicalPod(PodShape(10_000, 0, 0), 0.2)]
    return nodes, requests, typical


def test_fgd_strands_a_gpu_behind_exhausted_cpu_and_kubecell_does_not() -> None:
    nodes, requests, typical = cpu_case()
    fgd_book, fgd_failed = replay(nodes, FragmentationGradientDescent(typical), requests)
    assert fgd_book.allocations["cpu-job"].node == "a"
    assert len(fgd_failed) == 1
    assert int(fgd_book.gpu_avail.sum()) == 1000

    ours_book, ours_failed = replay(nodes, ExpectedWastePolicy(demand_of(typical)), requests)
    assert ours_book.allocations["cpu-job"].node == "b"
    assert ours_failed == []
    assert int(ours_book.gpu_avail.sum()) == 0


def test_fgd_strands_a_gpu_behind_exhausted_memory_and_kubecell_does_not() -> None:
    """Same story with host memory, which FGD's measure ignores altogether: a 40 GiB CPU-only pod on
    the 160 GiB node leaves room for one 64 GiB GPU pod instead of two."""
    nodes = [t4_node("a", memory=160 * GIB, gpus=2), t4_node("b", memory=400 * GIB, gpus=2)]
    requests = [Request("cache", cpu_milli=1000, memory_mib=40 * GIB)]
    requests += [gpu_pod(f"g{i}", cpu=4000, memory=64 * GIB) for i in range(4)]
    typical = [TypicalPod(PodShape(4000, 1000, 1), 0.8), TypicalPod(PodShape(1000, 0, 0), 0.2)]
    demand = [DemandType(PodShape(4000, 1000, 1), 0.8, 64 * GIB), DemandType(PodShape(1000, 0, 0), 0.2, 40 * GIB)]

    _, fgd_failed = replay(nodes, FragmentationGradientDescent(typical), requests)
    assert len(fgd_failed) == 1
    ours_book, ours_failed = replay(nodes, ExpectedWastePolicy(demand), requests)
    assert ours_book.allocations["cache"].node == "b"
    assert ours_failed == []


def test_the_online_policy_learns_the_same_from_earlier_arrivals() -> None:
    """With no distribution given, all the policy knows is what it has seen arrive; after a history of
    8-vCPU GPU pods (observed, as a driver feeds it the pods it watches) it makes the same call."""
    nodes, requests, _ = cpu_case()
    policy = ExpectedWastePolicy()
    for i in range(8):
        policy.observe(gpu_pod(f"history{i}"))
    book, failed = replay(nodes, policy, requests)
    assert book.allocations["cpu-job"].node == "b"
    assert failed == []


def test_the_online_policy_without_history_behaves_like_fgd_here() -> None:
    """Control for the test above: the first arrival is the CPU pod, so the estimate holds no GPU
    type yet, nothing looks stranded and the tie goes to node a, as with FGD."""
    nodes, requests, _ = cpu_case()
    book, failed = replay(nodes, ExpectedWastePolicy(), requests)
    assert book.allocations["cpu-job"].node == "a"
    assert len(failed) == 1


# ------------------------------------------------------------------- what the cluster shows beats the prior


def sliver_cluster(learn_fates: bool) -> tuple[AllocationBook, ExpectedWastePolicy, Placer]:
    """Twenty GPUs each hold an 800-milli pod and keep a 200-milli sliver; two GPUs x (800 free) and
    y (700 free) are the candidates. The demand says 29 % of requests ask for 200 milli, so the prior
    expects slivers to fill; then 1,024 arrivals pass and not one sliver does (the small requests go
    elsewhere, as on the openb traces, where thousands of slivers compete for a few small pods)."""
    nodes = [t4_node(f"s{i:02d}") for i in range(20)] + [t4_node("x"), t4_node("y")]
    demand = [DemandType(PodShape(1000, 600, 1), 0.21, 0), DemandType(PodShape(1000, 500, 1), 0.50, 0),
              DemandType(PodShape(1000, 200, 1), 0.29, 0)]
    book = AllocationBook(nodes)
    policy = ExpectedWastePolicy(demand, learn_fates=learn_fates, relearn_every=256)
    placer = Placer(book, policy, tie_rank=np.arange(book.size, dtype=np.int64))
    for i in range(20):
        big = gpu_pod(f"big{i}", cpu=1000, milli=800)
        policy.observe(big)
        book.allocate(big, i, (0,))
    for i in range(1024):
        policy.observe(Request(f"elsewhere{i}", cpu_milli=1))
    book.allocate(gpu_pod("on-y", cpu=1000, milli=300), book.node("y"), (0,))
    book.allocate(gpu_pod("on-x", cpu=1000, milli=200), book.node("x"), (0,))
    return book, policy, placer


def test_slivers_the_cluster_never_fills_are_counted_as_lost() -> None:
    _prior_book, prior, _ = sliver_cluster(learn_fates=False)
    _learned_book, learned, _ = sliver_cluster(learn_fates=True)
    assert prior.table[200] < 20  # the prior expects a 200-milli request to fill the sliver
    assert learned.table[200] > 180  # the cluster showed that it does not
    assert learned.relearns >= 4


def test_a_600_goes_where_it_leaves_no_new_sliver_once_slivers_are_known_to_stay_idle() -> None:
    """A 600 can leave a 200-milli sliver on x (the prior's choice: slivers fill) or 100 milli on y.
    Having seen slivers stay idle, the learned policy takes y and keeps x's 800 for a 500 or a 600."""
    request = gpu_pod("q", cpu=1000, milli=600)
    prior_book, _, prior_placer = sliver_cluster(learn_fates=False)
    learned_book, _, learned_placer = sliver_cluster(learn_fates=True)
    prior_choice = prior_placer.place(request)
    learned_choice = learned_placer.place(request)
    assert prior_choice is not None
    assert learned_choice is not None
    assert prior_book.nodes[prior_choice.node].name == "x"
    assert learned_book.nodes[learned_choice.node].name == "y"


# ------------------------------------------------------------------- the waste table


def test_static_table_by_hand() -> None:
    """One request size s at rate 1 against hazard h: below s nothing fits (W = g); at s a fill comes
    first with probability 1/(1+h) and leaves 0; at 2s a fill leaves s."""
    h = 0.25
    table = static_waste_table([400], [1.0], h)
    assert table[399] == 399
    assert table[400] == pytest.approx(h * 400 / (1 + h))
    assert table[800] == pytest.approx((h * 800 + table[400]) / (1 + h))
    assert table[1000] == pytest.approx((h * 1000 + table[600]) / (1 + h))


def test_static_table_ignores_sizes_it_cannot_use_and_checks_its_hazard() -> None:
    assert static_waste_table([0, 1500], [1.0, 1.0], 0.01).tolist() == list(range(1001))
    with pytest.raises(InvalidInputError, match="hazard"):
        static_waste_table([100], [1.0], 0.0)


def test_prior_chain_counts_whole_gpus_by_their_number() -> None:
    demand = [DemandType(PodShape(1000, 500, 1), 0.5, 0), DemandType(PodShape(1000, 1000, 4), 0.25, 0),
              DemandType(PodShape(1000, 0, 0), 0.25, 0)]
    sizes, rates = prior_chain(demand)
    assert sizes == [500, 1000]
    assert rates == pytest.approx([0.5 / 1.5, 1.0 / 1.5])


def fate_book() -> AllocationBook:
    return AllocationBook([t4_node(f"n{i}", gpus=2) for i in range(4)])


def test_without_observations_the_learned_table_is_the_prior() -> None:
    model = GapFateModel()
    model.sync(fate_book())
    prior = static_waste_table([300, 700], [0.6, 0.4], 0.01)
    learned = model.table([300, 700], [0.6, 0.4], 0.01, horizon=500.0, free_value=float(prior[1000]))
    np.testing.assert_allclose(learned, prior, rtol=1e-9)


def test_gaps_that_wait_unfilled_are_lost_and_gaps_that_fill_are_not() -> None:
    """GPUs left with 300 free wait 20,000 arrivals and nothing fills them: W(300) goes to 300 (the
    prior, worth 50 GPU-arrivals at a 1 % hazard, still pulls a little). A GPU left with 600 free is
    filled to 100 within a few arrivals, over and over: W(600) goes to W(100) = 100 (nothing smaller
    than 300 exists, so a 100-milli remainder is lost either way)."""
    book = fate_book()
    model = GapFateModel(half_life=None)
    model.sync(book)
    for i in range(3):
        book.allocate(gpu_pod(f"w{i}", cpu=1000, milli=700), i, (0,))
    model.sync(book)
    for cycle in range(200):
        book.allocate(gpu_pod(f"a{cycle}", cpu=1000, milli=400), 3, (0,))
        model.sync(book)
        for _ in range(5):
            model.tick()
        book.allocate(gpu_pod(f"b{cycle}", cpu=1000, milli=500), 3, (0,))
        model.sync(book)
        model.tick()
        book.release(f"a{cycle}")
        book.release(f"b{cycle}")
        model.sync(book)
        for _ in range(94):
            model.tick()
    prior = static_waste_table([300, 700], [0.6, 0.4], 0.01)
    table = model.table([300, 700], [0.6, 0.4], 0.01, horizon=500.0, free_value=float(prior[1000]))
    assert prior[300] < 10
    assert table[300] > 280
    assert prior[600] < 20
    assert 100 <= table[600] < 115
    assert table[1000] == prior[1000]


def test_releases_and_health_changes_are_not_fills() -> None:
    book = fate_book()
    model = GapFateModel()
    model.sync(book)
    book.allocate(gpu_pod("a", cpu=1000, milli=400), 0, (1,))
    book.set_gpu_health(1, 0, False)
    model.sync(book)
    book.release("a")
    book.set_gpu_health(1, 0, True)
    model.sync(book)
    assert model.fills.sum() == 1  # the allocation only
    assert model.fills[1000, 600] == 1
    assert model.count[1000] == 8
    assert model.count.sum() == 8


def test_exposure_and_fills_decay_with_the_half_life() -> None:
    book = fate_book()
    model = GapFateModel(half_life=10.0)
    model.sync(book)
    book.allocate(gpu_pod("a", cpu=1000, milli=400), 0, (0,))
    model.sync(book)
    for _ in range(10):
        model.tick()
    exposure = model.exposure.copy()
    model.table([], [], 0.01, horizon=100.0, free_value=0.0)
    assert model.fills[1000, 600] == pytest.approx(0.5)
    np.testing.assert_allclose(model.exposure, exposure / 2)


@pytest.mark.parametrize(("kwargs", "match"), [({"half_life": 0}, "half-life"), ({"prior_strength": 0}, "prior")])
def test_fate_model_parameters_are_checked(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        GapFateModel(**kwargs)


# ------------------------------------------------------------------- the measure by hand


def test_stranded_share_by_hand() -> None:
    """One type (1 GPU, 8 vCPU); a node with 4 free GPUs and 12 vCPU feeds 1.5 GPUs. With a table
    that expects every gap to fill (W = 0), 2,500 of the 4,000 free milli are stranded: the mix and
    the single type agree when there is one type."""
    book = AllocationBook([t4_node("n", cpu=12_000, memory=GIB, gpus=4)])
    demand = [DemandType(PodShape(8000, 1000, 1), 1.0, 0)]
    measure = ExpectedWaste(demand, book.model_names, [0, 4], np.zeros(1001))
    value = measure.node_waste(book.cpu_free, book.mem_free, book.gpu_avail, book.model_id)
    assert value[0] == pytest.approx(2500)


def test_host_blend_weighs_the_mix_against_each_type() -> None:
    """Two types, 4 and 16 vCPU per GPU, equally common (mix: 10 vCPU per GPU). 20 vCPU and 4 free
    GPUs: the mix feeds 2 GPUs (2,000 stranded); alone, the light type feeds all 4 and the heavy one
    1.25 (2,750 stranded), 1,375 on average; the blend takes the mean of the two views."""
    book = AllocationBook([t4_node("n", cpu=20_000, memory=GIB, gpus=4)])
    demand = [DemandType(PodShape(4000, 1000, 1), 0.5, 0), DemandType(PodShape(16_000, 1000, 1), 0.5, 0)]
    stranded = {}
    for blend in (0.0, 0.5, 1.0):
        measure = ExpectedWaste(demand, book.model_names, [0, 4], np.zeros(1001), host_blend=blend)
        stranded[blend] = float(measure.stranded(book.cpu_free, book.mem_free, np.array([4000.0]))[0])
    assert stranded == pytest.approx({0.0: 2000, 0.5: (2000 + 1375) / 2, 1.0: 1375})


def test_served_fraction_and_scarcity_weights() -> None:
    """A T4-only type on a cluster where T4s are a quarter of the GPUs counts four times its share;
    a node that only the unconstrained type can use is served for 0.2 of the weight."""
    demand = [DemandType(PodShape(1000, 1000, 1), 0.5, 0), DemandType(PodShape(1000, 1000, 1, "T4"), 0.5, 0)]
    measure = ExpectedWaste(demand, ("T4", "V100M32"), [2, 6], np.zeros(1001))
    assert measure.weight.tolist() == pytest.approx([0.2, 0.8])
    served = measure.served(np.array([8000]), np.array([GIB]), np.array([1]), np.array([[1, 1]]))
    assert served.tolist() == pytest.approx([0.2])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(book=cluster_strategy(), typical=typical_strategy(), memory=st.sampled_from([0, 500, 4000]))
def test_waste_is_never_negative_and_never_below_the_gap_table(book: AllocationBook, typical: list[TypicalPod],
                                                                memory: int) -> None:
    """Waste counts idle share: it is at least the expected gap waste of the node's free GPUs (served or
    not, the share is lost at least as W says), and zero on a node with nothing free and no host left."""
    model_gpus = [int(book.gpu_present[book.model_id == i].sum()) for i in range(len(book.model_names))]
    demand = demand_of(typical, memory)
    sizes, rates = prior_chain(demand)
    table = static_waste_table(sizes, rates, 0.01)
    measure = ExpectedWaste(demand, book.model_names, model_gpus, table)
    waste = measure.node_waste(book.cpu_free, book.mem_free, book.gpu_avail, book.model_id)
    assert np.all(waste >= measure.gap_waste(book.gpu_avail).sum(axis=1) - 1e-6)
    assert np.all(waste[book.gpu_avail.sum(axis=1) == 0] == 0)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(book=cluster_strategy(), typical=typical_strategy(), request=request_strategy())
def test_scores_are_the_drop_in_node_waste_of_the_state_after(book: AllocationBook, typical: list[TypicalPod],
                                                               request: Request) -> None:
    """The policy derives after-states incrementally; a reference rebuilds each candidate's state
    (the share on that GPU, or whole GPUs off the free ones, CPU and memory taken) and asks the
    measure for the node's waste before and after. Both must give the same score everywhere."""
    policy = ExpectedWastePolicy(demand_of(typical, 1000), learn_fates=False)
    policy.attach(book)
    measure = policy.measure
    assert measure is not None
    if not measure.size:
        return  # no GPU type known: every node ties (test_without_learned_demand_every_node_ties)
    nodes = np.arange(book.size, dtype=np.int64)
    cpu_after = book.cpu_free - (request.cpu_milli or 100)
    memory_after = book.mem_free - request.memory_mib

    def waste(cpu: np.ndarray, memory: np.ndarray, avail: np.ndarray) -> np.ndarray:
        return measure.node_waste(cpu, memory, avail, book.model_id)

    before = waste(book.cpu_free, book.mem_free, book.gpu_avail)
    if request.is_share:
        got = policy.gpu_scores(book, request, nodes)
        for node in range(book.size):
            for gpu in range(book.max_gpus):
                if got[node, gpu] < 0:
                    continue
                avail = book.gpu_avail.copy()
                avail[node, gpu] -= request.gpu_milli
                after = waste(cpu_after, memory_after, avail)[node]
                assert got[node, gpu] == sigmoid_score(np.array([before[node] - after]))[0]
    else:
        got = policy.score(book, request, nodes)
        for node in range(book.size):
            avail = book.gpu_avail.copy()
            free_gpus = np.flatnonzero(avail[node] == 1000)[: request.gpu_count if request.is_whole else 0]
            avail[node, free_gpus] = 0
            after = waste(cpu_after, memory_after, avail)[node]
            expected = sigmoid_score(np.array([before[node] - after]))[0]
            # The policy assumes whole GPUs come from fully free ones; where a node has too few, the
            # request cannot go there and the filter never asks for its score.
            if len(free_gpus) == (request.gpu_count if request.is_whole else 0):
                assert got[node] == expected


# ------------------------------------------------------------------- the policy as a whole


def test_without_learned_demand_every_node_ties() -> None:
    book = AllocationBook(cpu_case()[0])
    policy = ExpectedWastePolicy(demand=[])
    policy.attach(book)
    nodes = np.arange(book.size, dtype=np.int64)
    assert policy.score(book, gpu_pod("x"), nodes).tolist() == [50, 50]
    assert policy.score(book, gpu_pod("y", milli=300), nodes).tolist() == [50, 50]


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"refresh_distance": 1.5}, "refresh distance"),
    ({"check_every": 0}, "check every"),
    ({"relearn_every": 0}, "relearn every"),
    ({"half_life": 0}, "half-life"),
    ({"fate_half_life": -1}, "fate half-life"),
    ({"prior_strength": 0}, "prior strength"),
    ({"prior_hazard": 0}, "prior hazard"),
    ({"host_blend": 2}, "host blend"),
])
def test_policy_parameters_are_checked(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        ExpectedWastePolicy(**kwargs)  # type: ignore[arg-type]


def test_registered_as_kubecell_online_and_the_default() -> None:
    policy = make_policy("KubeCell")
    assert isinstance(policy, ExpectedWastePolicy)
    assert policy.demand_model is not None  # learns online; the context's typical pods are not used
    assert DEFAULT_POLICY == "kubecell"


def test_refreshes_settle_and_relearning_follows_its_interval() -> None:
    """A distribution change invalidates every cached score, so a steady workload must settle: after
    the early doubling checks, a stream of one fixed mix triggers no more demand refreshes, while the
    gap fates are re-solved every ``relearn_every`` arrivals."""
    book = AllocationBook([t4_node("n", gpus=2)])
    policy = ExpectedWastePolicy(relearn_every=1000)
    policy.attach(book)
    rng = np.random.default_rng(0)
    shapes = [gpu_pod("a"), gpu_pod("b", milli=500), Request("c", cpu_milli=4000)]
    for i in range(20_000):
        policy.observe(shapes[int(rng.integers(3))])
        if i == 4999:
            settled, relearned = policy.refreshes, policy.relearns
    assert policy.refreshes == settled
    assert settled <= 14
    assert policy.relearns - relearned == 15


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(book=cluster_strategy(), requests=st.lists(request_strategy(), min_size=1, max_size=6))
def test_every_decision_is_feasible_and_commits(book: AllocationBook, requests: list[Request]) -> None:
    """Whatever the cluster and the mix (shares by compute or by memory, whole GPUs, CPU-only, model
    constraints, unhealthy GPUs), the online policy places a request iff some node fits it, and the
    GPUs it picks take the request without breaking the book's invariants."""
    placer = Placer(book, ExpectedWastePolicy(relearn_every=2))
    for i, request in enumerate(requests):
        request = Request(f"r{i}", cpu_milli=request.cpu_milli, memory_mib=request.memory_mib,
                          gpu_count=request.gpu_count, gpu_milli=request.gpu_milli,
                          gpu_memory_mib=request.gpu_memory_mib, gpu_models=request.gpu_models)
        fits_somewhere = placer.feasible(request).size > 0
        placement = placer.place_and_commit(request)
        assert (placement is not None) == fits_somewhere
        book.check_invariants()


def test_checks_fall_due_on_the_one_by_one_schedule() -> None:
    policy = ExpectedWastePolicy(check_every=64, relearn_every=100)
    policy.attach(AllocationBook([t4_node("n", gpus=2)]))
    due = []
    for n in range(1, 400):
        demand, relearn = policy._checks_due(1, attached=True)
        due.append((n, demand, relearn))
        policy.observe(gpu_pod(f"p{n}", milli=500))
    for n, demand, relearn in due:
        assert demand == (n & (n - 1) == 0 or n % 64 == 0), n
        assert relearn == (n % 100 == 0), n


def test_a_gang_is_learned_as_its_members_with_one_check() -> None:
    book_a, book_b = AllocationBook([t4_node("n", gpus=4)]), AllocationBook([t4_node("n", gpus=4)])
    # Without decay, exposure is a plain count of arrivals times GPUs (decay is applied lazily whenever the
    # table is rebuilt, so with it, checks at 1, 2, 4, ... would decay a different history).
    one_by_one, together = ExpectedWastePolicy(fate_half_life=None), ExpectedWastePolicy(fate_half_life=None)
    one_by_one.attach(book_a)
    together.attach(book_b)
    member = gpu_pod("m", milli=250)
    for _ in range(300):
        one_by_one.observe(member)
    together.observe(member, 300)
    assert together.demand_model is not None
    assert one_by_one.demand_model is not None
    assert together.demand_model.arrivals == one_by_one.demand_model.arrivals == 300
    assert together.fates is not None
    assert one_by_one.fates is not None
    assert together.fates.arrivals == 300
    np.testing.assert_allclose(together.fates.exposure, one_by_one.fates.exposure)
    assert together.demand == one_by_one.demand  # one shape: the same estimate
    assert together.refreshes == 1  # checked once after the gang, not at 1, 2, 4, ... 256
    assert one_by_one.refreshes >= 1
