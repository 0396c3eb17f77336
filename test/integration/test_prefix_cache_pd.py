"""Prefix cache on a PD prefill server (the KV it sent to decode stays cached there): multi-turn
conversations through 1 prefill + 1 decode give the colocated server's greedy tokens, and from
turn 2 on the prefill serves the history from its cache (``meta_info.cached_tokens`` > 0,
``sglang:cache_hit_rate`` and cached pages in /get_load); /flush_cache empties it."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from pd_utils import async_client, load, nixl_missing, pd_request, start_all, stop_all, wait_until

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(nixl_missing() is not None, reason=f"PD needs NIXL: {nixl_missing()}")]

TURNS, CONVS, NEW = 3, 3, 8
SAMPLING = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}


def _user(c: int, t: int) -> list[int]:
    """New user tokens of conversation ``c``, turn ``t`` (deterministic, ordinary ids)."""
    return [3 + (c * 7919 + t * 104729 + j * 31) % 6000 for j in range(20 + 17 * t + 5 * c)]


async def _turns(send) -> list[list[dict]]:
    history: list[list[int]] = [[] for _ in range(CONVS)]
    out = []
    for t in range(TURNS):
        prompts = [history[c] + _user(c, t) for c in range(CONVS)]
        bodies = await asyncio.gather(*(send({"input_ids": p, "sampling_params": SAMPLING}) for p in prompts))
        out.append(bodies)
        history = [p + b["output_ids"] for p, b in zip(prompts, bodies)]
    return out


def test_pd_multi_turn_hits_on_prefill_and_matches_colocated(colocated_server, tiny_model_dir,
                                                            tmp_path_factory) -> None:
    async def colocated():
        async with async_client() as client:
            async def send(body):
                r = await client.post(colocated_server.base_url + "/generate", json=body)
                assert r.status_code == 200, r.text
                return r.json()
            return await _turns(send)

    ref = asyncio.run(colocated())
    prefills, decodes = start_all(tiny_model_dir, tmp_path_factory.mktemp("pd-cache-logs"), 1, 1)
    try:
        prefill, decode = prefills[0], decodes[0]
        prefill_cached: list[list[int]] = []

        async def pd():
            async with async_client() as client:
                async def send(body):
                    res = await pd_request(client, prefill, decode.base_url, body)
                    assert res.prefill_status == 200 and res.decode_status == 200, res
                    prefill_cached.append(res.prefill_body["meta_info"]["cached_tokens"])
                    return res.decode_body
                return await _turns(send)

        got = asyncio.run(pd())
        for t in range(TURNS):
            assert [b["output_ids"] for b in got[t]] == [b["output_ids"] for b in ref[t]], f"turn {t}"
        turn1, later = prefill_cached[:CONVS], prefill_cached[CONVS:]
        assert turn1 == [0] * CONVS and all(c > 0 for c in later), prefill_cached
        info = load(prefill.base_url)
        assert info["num_cached_pages"] > 0 and info["cache_hit_rate"] > 0, info
        # decode keeps no cache unless --disaggregation-decode-enable-radix-cache
        # (test_pd_decode_reuse_turns.py)
        assert load(decode.base_url)["num_cached_pages"] == 0
        # idle: every page free or evictable; /flush_cache frees the cached ones
        wait_until(lambda: load(prefill.base_url)["num_free_pages"] == info["num_total_pages"], 20,
                   "prefill pages back")
        assert httpx.post(prefill.base_url + "/flush_cache", timeout=30).status_code == 200
        assert load(prefill.base_url)["num_cached_pages"] == 0
    finally:
        stop_all(prefills, decodes)
