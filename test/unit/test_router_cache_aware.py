"""The cache-aware routing policy (router policies/cache_aware.py): pure, per-worker approximate
prefix index of what it routed; cost = length_aware's predicted queue time net of the expected
hit. Multi-turn replay over two prefill workers with a simple queue model: a higher hit rate
than length_aware alone."""

from __future__ import annotations

import random

from sglang_pd_router.policies import RouteRequest, WorkerView, create_routing_policy
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
