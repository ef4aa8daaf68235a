"""How far a running elastic job grows into capacity the engine offers: to the last member still worth half
an average member's goodput, only when the gain pays for the restart, all of it while there is no model, never
past its maximum or the room offered."""

from __future__ import annotations

from kubecell.core.elastic.resize import GrowthRule, choose_growth


class Curve:
    """Goodput that scales perfectly up to ``knee`` replicas and not at all beyond (nodes ignored)."""

    def __init__(self, knee: int, per_replica: float = 10.0) -> None:
        self.knee = knee
        self.per_replica = per_replica

    def goodput(self, gpu_type: str, num_nodes: int, num_replicas: int) -> float:
        return self.per_replica * min(num_replicas, self.knee) if gpu_type == "A100" else 0.0


def test_without_a_model_it_takes_the_room_up_to_its_maximum() -> None:
    choice = choose_growth(2, 10, 6, None, None, 1)
    assert choice.target == 6
    assert "no trusted step reports" in choice.reason


def test_no_room_or_at_the_maximum_is_no_growth() -> None:
    assert choose_growth(2, 0, 6, Curve(8), "A100", 1).target == 2
    assert choose_growth(6, 4, 6, Curve(8), "A100", 1).target == 6


def test_it_grows_to_where_the_speedup_flattens() -> None:
    choice = choose_growth(2, 6, 8, Curve(knee=5), "A100", 2)
    assert choice.target == 5
    assert "x2.50" in choice.reason


def test_a_job_that_does_not_scale_stays() -> None:
    choice = choose_growth(4, 4, 8, Curve(knee=4), "A100", 4)
    assert choice.target == 4
    assert "stops scaling" in choice.reason


def test_a_gain_that_does_not_pay_for_the_restart_is_not_taken() -> None:
    rule = GrowthRule(min_marginal=0.05, restart_seconds=250.0, horizon_seconds=300.0)
    # 10 -> 11 replicas: x1.1 goodput over 300 s does not pay a 250 s restart
    choice = choose_growth(10, 1, 16, Curve(knee=16), "A100", 10, rule)
    assert choice.target == 10
    assert "would not pay" in choice.reason


def test_a_type_the_model_has_never_seen_takes_the_room() -> None:
    choice = choose_growth(2, 2, 8, Curve(knee=8), "T4", 1)
    assert choice.target == 4
