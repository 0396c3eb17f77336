"""scripts/bench_prefix_replay.py's warmed window (the server runs are a benchmark, not a test):
the warm-up is the trace's first N requests and the window the M after them; equal hash_ids
give equal tokens wherever they occur, so the engine hits exactly where the trace shares
blocks; the window's arrivals start at 0 at the asked mean rate; and the ceiling / simulator
prediction count only the window's lookups, on a cache the warm-up filled."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

import bench_prefix_replay as bpr  # noqa: E402

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from sglang_pd.sim.prefix_cache import replay_hit_rate, shared_prefixes  # noqa: E402

# (ms, input_len, hash_ids): request 3 resends request 0's history, request 4 request 1's
TRACE = [(0, 1024, [1, 2]), (0, 1000, [3, 4]), (500, 600, [5, 6]), (1500, 2048, [1, 2, 7, 8]),
         (3500, 1536, [3, 4, 9]), (4000, 512, [10])]


def _args(tmp_path: Path, warm: int, num: int, **kw: object) -> argparse.Namespace:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": n, "output_length": 9, "hash_ids": h}) + "\n"
                            for t, n, h in TRACE))
    base = dict(trace=path, warm_requests=warm, num_requests=num, qps=2.0, block_tokens=4, max_output=4,
                max_total_tokens=65536, warm_shared_only=False, warm_bounded=False, prompt_tokens_per_s=None)
    base.update(kw)
    return argparse.Namespace(**base)


def test_warm_up_is_the_first_n_and_the_window_follows(tmp_path: Path) -> None:
    warm, reqs = bpr.build_requests(_args(tmp_path, 3, 3))
    assert [len(p) for p in warm] == [8, 8, 5]  # 4 tokens per 512-token block, rounded up
    assert [len(ids) for _, ids, _ in reqs] == [16, 12, 4]
    assert all(new == 4 for _, _, new in reqs)  # output capped
    # request 3 starts with request 0's prompt (blocks 1, 2), request 4 with request 1's
    assert reqs[0][1][:8] == warm[0] and reqs[1][1][:8] == warm[1]
    assert reqs[1][1][:8] != reqs[0][1][:8]
    # arrivals from 0, the trace's gaps (2 s, 0.5 s) scaled to a mean of 2 req/s
    assert [at for at, _, _ in reqs] == pytest.approx([0.0, 0.8, 1.0])
    # no warm-up: the window is the trace's start, same ids as before
    warm0, reqs0 = bpr.build_requests(_args(tmp_path, 0, 4))
    assert warm0 == [] and reqs0[0][1] == warm[0] and reqs0[3][1] == reqs[0][1]


def test_a_partial_last_block_is_cut_and_a_short_trace_refused(tmp_path: Path) -> None:
    warm, _ = bpr.build_requests(_args(tmp_path, 3, 1))
    # 600 tokens -> 5 ids (4.7 rounded up): block 5's 4 tokens, then 1 of block 6's
    def block(h: int) -> list[int]:
        return np.random.default_rng(h).integers(10, bpr.VOCAB, size=4).tolist()

    assert warm[2] == block(5) + block(6)[:1]
    assert warm[0] == block(1) + block(2)
    with pytest.raises(SystemExit):
        bpr.build_requests(_args(tmp_path, 4, 3))  # only 6 requests in the trace


def test_ceiling_and_prediction_count_the_window_on_a_warmed_cache(tmp_path: Path) -> None:
    ceiling, model, full = bpr.sim_hit_rates(_args(tmp_path, 3, 3))
    # window: 2048 tokens with 1024 cached, 1536 with 1024, 512 with 0
    assert ceiling == pytest.approx(2048 / 4096) and model == pytest.approx(ceiling)
    assert full == pytest.approx(ceiling, abs=0.01)  # the whole simulator, warmed by --window
    cold, _, _ = bpr.sim_hit_rates(_args(tmp_path, 0, 3))
    assert cold == 0.0  # the first three share nothing


def test_replay_hit_rate_bounded_cache_evicts_the_warm_up() -> None:
    warm = [(1, 2), (3, 4)]
    window = [((1, 2, 7), 1536), ((3, 4, 8), 1536)]
    assert replay_hit_rate(warm, window) == pytest.approx(2048 / 3072)
    # room for 3 blocks: the warm-up keeps 1, 3, 4 (block 2 evicted, least recent); the first
    # request hits block 1 and its insert evicts 4 then 3; the second misses
    assert replay_hit_rate(warm, window, 3 * 512) == pytest.approx(512 / 3072)
    assert replay_hit_rate(warm, window, 6 * 512) == pytest.approx(2048 / 3072)
    assert replay_hit_rate([], window) == 0.0


def test_order_is_a_list_of_on_off_and_defaults_to_each_side_early_and_late() -> None:
    assert bpr.parse_order(None, False) == [True, False, False, True]
    assert bpr.parse_order(None, True) == [False, True, True, False]
    assert bpr.parse_order("on,off,off,on", True) == [True, False, False, True]  # --order wins
    for bad in ("on,of", "", "on,,off"):
        with pytest.raises(SystemExit):
            bpr.parse_order(bad, False)


def test_pooled_percentiles_cover_every_run_of_a_side() -> None:
    runs = [{"ttft_s": [1.0, 2.0, 3.0]}, {"ttft_s": [4.0, 5.0]}]
    res = bpr.pooled(runs)
    assert res is not None
    p50, p90 = res
    assert p50 == pytest.approx(3.0) and p90 == pytest.approx(np.percentile([1, 2, 3, 4, 5], 90))
    assert bpr.pooled([]) is None


def test_shared_only_warm_up_keeps_what_the_window_hits(tmp_path: Path) -> None:
    # the window (requests 3-5) shares blocks 1, 2 with request 0 and 3, 4 with request 1;
    # request 2 (blocks 5, 6) is never touched, so it is not warmed
    assert shared_prefixes([[1, 2], [3, 4], [5, 6]], [[1, 2, 7, 8], [3, 4, 9], [10]]) == [(0, 2), (1, 2)]
    full, _ = bpr.build_requests(_args(tmp_path, 3, 3))
    warm, reqs = bpr.build_requests(_args(tmp_path, 3, 3, warm_shared_only=True))
    assert warm == full[:2] and reqs == bpr.build_requests(_args(tmp_path, 3, 3))[1]
    assert bpr.sim_hit_rates(_args(tmp_path, 3, 3, warm_shared_only=True))[:2] == \
        bpr.sim_hit_rates(_args(tmp_path, 3, 3))[:2]


def test_shared_prefix_is_cut_to_whole_blocks_and_prefers_a_whole_sender() -> None:
    # the window shares only block 1 of request 0's (1, 2); a prompt that goes on past a block
    # sent that block whole, so (1, 9)'s sender is preferred for the prefix (1,)
    assert shared_prefixes([[1], [1, 9], [1, 2]], [[1, 5]]) == [(1, 1)]
    # one prefix covering another: only the longer is warmed
    assert shared_prefixes([[1, 2, 3]], [[1, 7], [1, 2, 3, 4]]) == [(0, 3)]
    assert shared_prefixes([[1, 2]], [[3, 4]]) == []


def test_a_bounded_warm_up_keeps_what_the_pool_would_still_hold(tmp_path: Path) -> None:
    # room for 3 blocks: after the warm-up the cache holds 1, 3, 4 (block 2 evicted, least recent)
    warm, window = [[1, 2], [3, 4]], [[1, 2, 7], [3, 4, 8]]
    assert shared_prefixes(warm, window, 3 * 512) == [(0, 1), (1, 2)]
    assert shared_prefixes(warm, window, 4 * 512) == shared_prefixes(warm, window) == [(0, 2), (1, 2)]
    # the script, a pool of 4 pages (4 tokens, one block each): the warm-up's third prompt
    # (blocks 5, 6) evicts request 0's path (block 2, then block 1, the least recent leaves):
    # the window finds request 1's prompt only
    small = _args(tmp_path, 3, 3, warm_shared_only=True, warm_bounded=True, max_total_tokens=16)
    warm_ids, _ = bpr.build_requests(small)
    full, _ = bpr.build_requests(_args(tmp_path, 3, 3))
    assert warm_ids == [full[1]]


def test_prompt_token_rate_sets_the_mean_arrival_rate(tmp_path: Path) -> None:
    _, reqs = bpr.build_requests(_args(tmp_path, 3, 3, prompt_tokens_per_s=8.0))
    # 32 prompt tokens over 2 gaps at 8 tokens/s: the window's arrivals span 4 s
    assert sum(len(ids) for _, ids, _ in reqs) == 32
    assert reqs[-1][0] == pytest.approx(4.0)


chains = st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=6), min_size=0, max_size=12)


@settings(max_examples=300, deadline=None)
@given(chains, chains)
def test_shared_prefixes_leave_the_ceiling_unchanged(warm: list[list[int]], window: list[list[int]]) -> None:
    # block ids as Mooncake's (a hash of the block and all before it): make each id name its prefix
    def chained(ids: list[int]) -> list[int]:
        return [hash(tuple(ids[: k + 1])) for k in range(len(ids))]

    warm_ids, window_ids = [chained(w) for w in warm], [chained(w) for w in window]
    kept = shared_prefixes(warm_ids, window_ids)
    trimmed = [warm_ids[i][:k] for i, k in kept]
    requests = [(w, 512 * len(w)) for w in window_ids]
    assert replay_hit_rate(trimmed, requests) == pytest.approx(replay_hit_rate(warm_ids, requests))
    assert [i for i, _ in kept] == sorted(i for i, _ in kept)
    assert all(not (a != b and b[: len(a)] == a) for a in trimmed for b in trimmed)
    assert sum(map(len, trimmed)) <= sum(map(len, warm_ids))
    # bounded: a cache that holds every block keeps all of it; a smaller one never more
    total = 512 * (sum(map(len, warm_ids)) + 1)
    assert shared_prefixes(warm_ids, window_ids, total) == kept
    small = shared_prefixes(warm_ids, window_ids, 512 * 4)
    assert replay_hit_rate([warm_ids[i][:k] for i, k in small], requests) <= replay_hit_rate(trimmed, requests) + 1e-9
