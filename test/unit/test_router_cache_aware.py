"""The cache-aware routing policy (router policies/cache_aware.py): pure, per-worker approximate
prefix index of what it routed; cost = length_aware's predicted queue time net of the expected
hit. Multi-turn replay over two prefill workers with a simple queue model: a higher hit rate
than length_aware alone. On a decode list: a follow-up steered to the decode holding its history
within the load slack."""

from __future__ import annotations

import asyncio
import random

import pytest
from router_helpers import router_cluster

from sglang_pd_router.policies import RouteRequest, RoutingConfig, WorkerView, create_routing_policy
from sglang_pd_router.policies.cache_aware import (
    ID_BLOCK,
    TEXT_BLOCK,
    CacheAwarePolicy,
    PrefixIndex,
    chain,
    prefix_blocks,
    request_prefix_blocks,
)


def _workers(queued: tuple[int, ...] = (0, 0), roles: tuple[str, ...] = ("both", "both")) -> list[WorkerView]:
    return [WorkerView(f"http://p{i}", "prefill", prefill_role=r, queued_prefill_tokens=q,
                       prefill_tokens_per_s=10_000.0) for i, (q, r) in enumerate(zip(queued, roles))]


def _req(ids: list[int]) -> RouteRequest:
    return RouteRequest(len(ids), prefix_blocks=prefix_blocks(ids))


def test_follow_up_goes_where_its_history_is_unless_that_queue_costs_more() -> None:
    pol = create_routing_policy("cache_aware")
    assert isinstance(pol, CacheAwarePolicy)
    turn1 = list(range(1500))
    turn2 = turn1 + list(range(5000, 5500))
    assert pol.select(_req(turn1), _workers(), 0.0) == 0  # both idle: the first
    # worker 0 now has a short queue: length_aware would go to 1, the hit (1500 of 2000) wins
    assert create_routing_policy("length_aware").select(_req(turn2), _workers((300, 0)), 0.0) == 1
    assert pol.select(_req(turn2), _workers((300, 0)), 0.0) == 0
    assert pol.expected_hit(_req(turn2), _workers()[0]) >= 1400
    # a queue longer than the recomputation saved: the other worker
    assert pol.select(_req(turn2 + [7]), _workers((5000, 0)), 0.0) == 1
    # an unrelated prompt expects no hit anywhere: least queue
    assert pol.select(_req(list(range(9000, 9800))), _workers((300, 0)), 0.0) == 1


def test_length_pools_respected_and_no_prefix_falls_back() -> None:
    pol = CacheAwarePolicy()
    long_prompt = list(range(3000))
    ws = _workers((0, 0), ("short", "long"))
    assert pol.select(_req(long_prompt), ws, 0.0) == 1
    short = long_prompt[:100]  # cached on worker 1, but a short request belongs to the short pool
    assert pol.select(_req(short), ws, 0.0) == 0
    assert pol.select(RouteRequest(100), ws, 0.0) == 0  # no blocks: length_aware
    assert pol.select(RouteRequest(100), [], 0.0) is None


def test_prefix_blocks_and_index_bounds() -> None:
    assert prefix_blocks(list(range(ID_BLOCK * 2 + 3))) == [tuple(range(ID_BLOCK)),
                                                             tuple(range(ID_BLOCK, 2 * ID_BLOCK))]
    assert len(prefix_blocks("x" * (TEXT_BLOCK * 3 - 1))) == 2
    assert request_prefix_blocks({"input_ids": list(range(40))}) == prefix_blocks(list(range(40)))
    assert request_prefix_blocks({"text": "a" * 200}) == prefix_blocks("a" * 200)
    assert request_prefix_blocks({"input_ids": [[1, 2]]}) == [] == request_prefix_blocks({"text": ["a"]})
    idx = PrefixIndex(capacity=4)
    a, b = chain(["a", "b", "c"]), chain(["x", "y"])
    idx.insert(a)
    assert idx.match(a) == 3 and idx.match(chain(["a", "b", "z"])) == 2 and idx.match(chain(["b"])) == 0
    idx.insert(b)  # over capacity: the oldest entries go first
    assert len(idx) == 4 and idx.match(b) == 2 and idx.match(a) == 0


def _replay(policy_name: str, convs: int = 12, turns: int = 5, seed: int = 0) -> float:
    """Conversations interleaved over two prefill workers; each worker's queue grows by the
    uncached tokens routed to it and drains at 10k tokens/s between arrivals (50 ms apart).
    Hit rate: prompt tokens found in the chosen worker's (unbounded) cache of what it served."""
    rng = random.Random(seed)
    pol = create_routing_policy(policy_name)
    served: list[set[tuple[int, ...]]] = [set(), set()]
    queued = [0.0, 0.0]
    history = [[c * 1_000_000 + j for j in range(rng.randrange(200, 800))] for c in range(convs)]
    hit = total = 0
    order = [(t, c) for t in range(turns) for c in rng.sample(range(convs), convs)]
    for t, c in order:
        prompt = history[c] + [c * 1_000_000 + 500_000 + t * 1000 + j for j in range(rng.randrange(30, 200))]
        ws = _workers((int(queued[0]), int(queued[1])))
        i = pol.select(_req(prompt), ws, 0.0)
        assert i is not None
        blocks = prefix_blocks(prompt)
        k = 0
        while k < len(blocks) and tuple(x for b in blocks[: k + 1] for x in b) in served[i]:
            k += 1
        got = k * ID_BLOCK
        hit, total = hit + got, total + len(prompt)
        for m in range(1, len(blocks) + 1):
            served[i].add(tuple(x for b in blocks[:m] for x in b))
        queued[i] += len(prompt) - got
        queued = [max(q - 500.0, 0.0) for q in queued]  # 50 ms at 10k tokens/s
        history[c] = prompt + [c * 1_000_000 + 900_000 + t * 100 + j for j in range(20)]
    return hit / total


def test_multi_turn_replay_hit_rate_higher_than_length_aware() -> None:
    la, ca = _replay("length_aware"), _replay("cache_aware")
    assert ca > la + 0.08, (la, ca)  # 0.74 vs 0.62 with this seed


# ---------------------------------------------------------------- decode steering (item 2)

def _decodes(held: tuple[int, ...] = (0, 0), usage: tuple[float, ...] = (0.0, 0.0)) -> list[WorkerView]:
    return [WorkerView(f"http://d{i}", "decode", num_running_reqs=h, token_usage=u)
            for i, (h, u) in enumerate(zip(held, usage))]


def test_follow_up_goes_to_the_decode_holding_its_history_within_the_load_slack() -> None:
    pol = CacheAwarePolicy(RoutingConfig(decode_reuse_slack=2))
    la = create_routing_policy("length_aware")
    turn1 = list(range(800))
    turn2 = turn1 + list(range(5000, 5300))
    assert pol.select(_req(turn1), _decodes((3, 0)), 0.0) == 1  # no history anywhere: least loaded
    assert pol.expected_hit(_req(turn2), _decodes()[1]) >= 700
    assert pol.expected_hit(_req(turn2), _decodes()[0]) == 0
    # decode 1 now holds 2 more requests than decode 0: length_aware balances, reuse wins
    assert la.select(_req(turn2), _decodes((0, 2)), 0.0) == 0
    assert pol.select(_req(turn2), _decodes((0, 2)), 0.0) == 1
    # 3 more is past the slack: balance wins (and decode 0 now holds turn 3's prefix too)
    turn3 = turn2 + list(range(7000, 7100))
    assert pol.select(_req(turn3), _decodes((0, 3)), 0.0) == 0
    # the longest history wins among those within the slack (turn 3 extends turn 2 on both)
    assert pol.select(_req(turn3 + [1, 2, 3]), _decodes((1, 0)), 0.0) == 0
    # slack 0: only the least loaded are candidates
    strict = CacheAwarePolicy(RoutingConfig(decode_reuse_slack=0))
    strict.select(_req(turn1), _decodes(), 0.0)
    assert strict.select(_req(turn2), _decodes((1, 0)), 0.0) == 1
    assert strict.select(_req(turn2), _decodes((0, 1)), 0.0) == 0


def test_decode_steering_falls_back_to_length_aware_and_skips_unhealthy() -> None:
    pol = CacheAwarePolicy()
    la = create_routing_policy("length_aware")
    for held, usage in (((2, 1), (0.0, 0.0)), ((1, 1), (0.5, 0.2))):
        ws = _decodes(held, usage)
        assert pol.select(RouteRequest(100), ws, 0.0) == la.select(RouteRequest(100), ws, 0.0) == 1
    ids = list(range(400))
    assert pol.select(_req(ids), _decodes(), 0.0) == 0
    ws = _decodes()
    ws[0].healthy = False  # the history's holder is down: the other one
    assert pol.select(_req(ids + [9] * 40), ws, 0.0) == 1
    ws[1].healthy = False
    assert pol.select(_req(ids), ws, 0.0) is None


def test_routing_config_refuses_a_bad_decode_reuse_slack() -> None:
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="decode_reuse_slack"):
            RoutingConfig(decode_reuse_slack=bad)  # type: ignore[arg-type]


def _decode_replay(policy_name: str, convs: int = 10, turns: int = 5, seed: int = 1) -> tuple[float, int]:
    """Conversations interleaved over two decodes; a request stays on its decode for 3 more
    arrivals. Returns (share of prompt tokens the chosen decode already held, the largest
    difference in held requests seen at a pick)."""
    rng = random.Random(seed)
    pol = create_routing_policy(policy_name)
    held_by: list[set[tuple[int, ...]]] = [set(), set()]
    running: list[list[int]] = [[], []]  # arrivals at which each running request leaves
    history = [[c * 1_000_000 + j for j in range(rng.randrange(100, 400))] for c in range(convs)]
    reused = total = gap = 0
    for n, (t, c) in enumerate((t, c) for t in range(turns) for c in rng.sample(range(convs), convs)):
        running = [[e for e in r if e > n] for r in running]
        prompt = history[c] + [c * 1_000_000 + 500_000 + t * 1000 + j for j in range(rng.randrange(20, 120))]
        ws = _decodes((len(running[0]), len(running[1])))
        gap = max(gap, abs(len(running[0]) - len(running[1])))
        i = pol.select(_req(prompt), ws, 0.0)
        assert i is not None
        blocks = prefix_blocks(prompt)
        k = 0
        while k < len(blocks) and tuple(blocks[: k + 1]) in held_by[i]:
            k += 1
        reused, total = reused + k * ID_BLOCK, total + len(prompt)
        held_by[i].update(tuple(blocks[:m]) for m in range(1, len(blocks) + 1))
        running[i].append(n + 3)
        history[c] = prompt + [c * 1_000_000 + 900_000 + t * 100 + j for j in range(16)]
    return reused / total, gap


def test_decode_replay_reuses_more_than_length_aware_with_bounded_imbalance() -> None:
    (la, _), (ca, ca_gap) = _decode_replay("length_aware"), _decode_replay("cache_aware")
    assert ca > la + 0.12, (la, ca)  # 0.71 vs 0.52 with this seed
    assert ca_gap <= RoutingConfig().decode_reuse_slack + 1, ca_gap


async def test_router_fills_prefix_blocks_for_a_decode_only_cache_aware_policy() -> None:
    async with router_cluster(1, 2, prefill_policy="length_aware", decode_policy="cache_aware") as c:
        body = {"input_ids": list(range(100)), "sampling_params": {"max_new_tokens": 2}}
        async with c.client.post(c.url + "/generate", json=body) as r:
            assert r.status == 200, await r.text()
        pol = c.service.decode_policy
        assert isinstance(pol, CacheAwarePolicy)
        assert sum(len(ix) for ix in pol.indexes.values()) == 100 // ID_BLOCK


def test_decode_reuse_slack_flag_reaches_the_decode_policy() -> None:
    from sglang_pd_router.app import RouterService
    from sglang_pd_router.cli import build_parser, config_from_args

    def cfg(*extra: str):
        return config_from_args(build_parser().parse_args(
            ["--prefill", "http://p:1", "--decode", "http://d:2", "--decode-policy", "cache_aware", *extra]))

    assert cfg().decode_reuse_slack == 2
    service = RouterService(cfg("--decode-reuse-slack", "5"))
    assert service.decode_policy.cfg.decode_reuse_slack == 5
    with pytest.raises(ValueError, match="decode_reuse_slack"):
        cfg("--decode-reuse-slack", "-1")


def test_the_pick_leaves_its_expected_hit_for_the_queue_charge() -> None:
    pol = CacheAwarePolicy()
    history = list(range(160))
    assert pol.select(_req(history), _workers(), 0.0) == 0 and pol.last_pick_hit == 0
    follow_up = history + list(range(1000, 1080))  # 15 blocks, the first 10 routed to p0
    assert pol.select(_req(follow_up), _workers(), 0.0) == 0
    assert pol.last_pick_hit == 240 * 10 // 15
    assert pol.select(_req(list(range(5000, 5100))), _workers(), 0.0) is not None
    assert pol.last_pick_hit == 0  # nothing of it routed before


async def test_router_charges_the_prefill_queue_only_the_uncached_part() -> None:
    async with router_cluster(1, 1, prefill_policy="cache_aware") as c:
        history = list(range(96))  # 6 blocks
        body = {"input_ids": history, "sampling_params": {"max_new_tokens": 2}}
        async with c.client.post(c.url + "/generate", json=body) as r:
            assert r.status == 200, await r.text()
        c.prefills[0].behaviour.delay_s = 0.5  # hold the follow-up's prefill leg
        body = {"input_ids": history + list(range(1000, 1032)), "sampling_params": {"max_new_tokens": 2}}
        task = asyncio.create_task(c.client.post(c.url + "/generate", json=body))
        worker = c.service.registry.by_kind["prefill"][0]
        for _ in range(200):
            await asyncio.sleep(0.005)
            if worker.in_flight:
                break
        # 128 tokens, 6 of its 8 blocks routed there before: 96 expected cached, 32 charged
        assert worker.in_flight == 1 and worker.outstanding_prefill_tokens == 32
        async with await task as r:
            assert r.status == 200, await r.text()
        for _ in range(200):  # the held prefill leg may end after the answer
            if not worker.in_flight:
                break
            await asyncio.sleep(0.01)
        assert worker.outstanding_prefill_tokens == 0  # the charge given back, not more
