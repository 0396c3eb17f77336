"""The pure routing policies (router/sglang_pd_router/policies), shared with the simulator."""

from __future__ import annotations

from collections import Counter

import pytest

from sglang_pd_router.policies import (
    ROUTING_POLICIES,
    RouteRequest,
    RoutingConfig,
    WorkerView,
    classify,
    create_routing_policy,
)


def _prefills(*roles: str, **kw) -> list[WorkerView]:
    return [WorkerView(f"http://p{i}", "prefill", role, **kw) for i, role in enumerate(roles)]


def test_registry_knows_the_policies_and_refuses_others() -> None:
    assert set(ROUTING_POLICIES) == {"random", "round_robin", "power_of_two", "length_aware",
                                     "length_aware_spill", "cache_aware"}
    for name in ROUTING_POLICIES:
        assert create_routing_policy(name).name == name
    with pytest.raises(ValueError, match=r"unknown routing policy 'nope'.*length_aware"):
        create_routing_policy("nope")
    with pytest.raises(ValueError, match="short_prefill_threshold"):
        RoutingConfig(short_prefill_threshold=0)


@pytest.mark.parametrize("name", sorted(ROUTING_POLICIES))
def test_every_policy_skips_unhealthy_and_answers_none_when_nothing_is_left(name: str) -> None:
    policy = create_routing_policy(name, seed=3)
    workers = _prefills("both", "both", "both")
    workers[0].healthy = workers[2].healthy = False
    assert {policy.select(RouteRequest(10), workers, 0.0) for _ in range(20)} == {1}
    workers[1].healthy = False
    assert policy.select(RouteRequest(10), workers, 0.0) is None
    assert policy.select(RouteRequest(10), [], 0.0) is None


def test_round_robin_cycles_and_random_is_seeded() -> None:
    rr = create_routing_policy("round_robin")
    workers = _prefills("both", "both", "both")
    assert [rr.select(RouteRequest(1), workers, 0.0) for _ in range(6)] == [0, 1, 2, 0, 1, 2]
    r1, r2 = create_routing_policy("random", seed=7), create_routing_policy("random", seed=7)
    seq1 = [r1.select(RouteRequest(1), workers, 0.0) for _ in range(30)]
    assert seq1 == [r2.select(RouteRequest(1), workers, 0.0) for _ in range(30)]
    assert set(seq1) == {0, 1, 2}


def test_power_of_two_never_picks_the_most_loaded_of_three() -> None:
    policy = create_routing_policy("power_of_two", seed=1)
    workers = _prefills("both", "both", "both")
    workers[0].queued_prefill_tokens = 50_000
    workers[1].queued_prefill_tokens = 10
    picks = Counter(policy.select(RouteRequest(1), workers, 0.0) for _ in range(300))
    assert picks[0] == 0 and picks[2] > picks[1] > 0  # the pair (1, 2) goes to 2
    decodes = [WorkerView(f"http://d{i}", "decode", in_flight=n) for i, n in enumerate((9, 0))]
    assert {policy.select(RouteRequest(1), decodes, 0.0) for _ in range(20)} == {1}


def test_length_aware_keeps_classes_in_their_pools_and_balances_inside() -> None:
    cfg = RoutingConfig(short_prefill_threshold=100)
    policy = create_routing_policy("length_aware", cfg)
    workers = _prefills("short", "long", "short", "long")
    workers[0].queued_prefill_tokens = 500  # the busier short instance
    workers[3].queued_prefill_tokens = 20_000  # the busier long instance
    assert policy.select(RouteRequest(100), workers, 0.0) == 2  # at the threshold: short
    assert policy.select(RouteRequest(101), workers, 0.0) == 1
    # predicted queue time weighs throughput: p3 is so fast its bigger queue clears first
    workers[3].prefill_tokens_per_s = 1e6
    assert policy.select(RouteRequest(5000), workers, 0.0) == 3
    # an explicit class wins over the length
    assert policy.select(RouteRequest(5, request_class="long"), workers, 0.0) in (1, 3)


def test_length_aware_prefers_dedicated_members_and_falls_back_when_a_pool_is_empty() -> None:
    policy = create_routing_policy("length_aware", RoutingConfig(short_prefill_threshold=10))
    workers = _prefills("both", "short", "long")
    assert policy.select(RouteRequest(5), workers, 0.0) == 1  # equal load: the dedicated one
    workers[1].healthy = False
    assert policy.select(RouteRequest(5), workers, 0.0) == 0  # "both" serves short too
    workers[0].healthy = False
    assert policy.select(RouteRequest(5), workers, 0.0) == 2  # named fallback: any pool


def test_length_aware_decode_pick_is_the_least_held() -> None:
    policy = create_routing_policy("length_aware")
    decodes = [WorkerView("a", "decode", in_flight=2, num_running_reqs=5),
               WorkerView("b", "decode", in_flight=1, num_running_reqs=1, token_usage=0.9),
               WorkerView("c", "decode", in_flight=0, num_running_reqs=2, token_usage=0.1)]
    assert policy.select(RouteRequest(1), decodes, 0.0) == 2


def test_classify_length_boundary() -> None:
    assert classify(512, 512) == "short" and classify(513, 512) == "long"
    assert classify(256) == "short" and classify(257) == "long"  # the one default threshold
