"""Decode-side prefix reuse with delta KV transfer (disaggregation/decode_reuse.py) on real
servers: multi-turn conversations through 1 prefill + 1 decode started with
--disaggregation-decode-enable-radix-cache give the colocated server's greedy tokens; from turn 2
on the decode reuses the history from its own cache (``meta_info.cached_tokens`` on decode's
answer, ``num_decode_reused_tokens_total``), and the bytes prefill transfers per turn are exactly
the prompt pages decode did not hold (``kv_transfer_bytes_total``): they drop by the reused share.
Run with ``-s`` to see the per-turn table."""

from __future__ import annotations

import asyncio

import pytest
from pd_utils import async_client, load, nixl_missing, pd_request, start_all, stop_all, wait_until

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(nixl_missing() is not None, reason=f"PD needs NIXL: {nixl_missing()}")]

TURNS, CONVS, NEW, PAGE = 4, 3, 8, 4  # PAGE: pd_utils.PD_FLAGS' --page-size
SAMPLING = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}
DECODE_REUSE = ("--disaggregation-decode-enable-radix-cache",)


def _user(c: int, t: int) -> list[int]:
    """New user tokens of conversation ``c``, turn ``t`` (deterministic, ordinary ids)."""
    return [3 + (c * 7919 + t * 104729 + j * 31) % 6000 for j in range(20 + 13 * t + 5 * c)]


def _pages(tokens: int) -> int:
    return -(-tokens // PAGE)


def test_pd_decode_reuse_sends_only_the_delta_and_matches_colocated(colocated_server, tiny_model_dir,
                                                                    tmp_path_factory) -> None:
    async def colocated(prompts: list[list[int]]) -> list[dict]:
        async with async_client() as client:
            rs = await asyncio.gather(*(client.post(colocated_server.base_url + "/generate",
                                                    json={"input_ids": p, "sampling_params": SAMPLING})
                                        for p in prompts))
        assert all(r.status_code == 200 for r in rs), [r.text for r in rs]
        return [r.json() for r in rs]

    prefills, decodes = start_all(tiny_model_dir, tmp_path_factory.mktemp("pd-decode-reuse-logs"), 1, 1,
                                  decode_flags=DECODE_REUSE)
    try:
        prefill, decode = prefills[0], decodes[0]
        bpp = None

        async def pd(prompts: list[list[int]]) -> list[dict]:
            async with async_client() as client:
                rs = await asyncio.gather(*(pd_request(client, prefill, decode.base_url,
                                                       {"input_ids": p, "sampling_params": SAMPLING})
                                            for p in prompts))
            assert all(r.prefill_status == 200 and r.decode_status == 200 for r in rs), rs
            return [r.decode_body for r in rs]

        history: list[list[int]] = [[] for _ in range(CONVS)]
        rows = []
        for t in range(TURNS):
            prompts = [history[c] + _user(c, t) for c in range(CONVS)]
            ref = asyncio.run(colocated(prompts))
            before = load(prefill.base_url)
            got = asyncio.run(pd(prompts))
            assert [b["output_ids"] for b in got] == [b["output_ids"] for b in ref], f"turn {t}"
            after = load(prefill.base_url)
            reused = [b["meta_info"]["cached_tokens"] for b in got]  # decode's own hit
            if t == 0:
                assert reused == [0] * CONVS
            else:  # the history's whole pages with KV on decode: the last answer token has none
                assert reused == [(len(h) - 1) // PAGE * PAGE for h in history], (reused, history)
            prompt_pages = sum(_pages(len(p)) for p in prompts)
            reused_pages = sum(reused) // PAGE
            sent = after["kv_transfer_pages_total"] - before["kv_transfer_pages_total"]
            sent_bytes = after["kv_transfer_bytes_total"] - before["kv_transfer_bytes_total"]
            skipped = after["kv_transfer_skipped_pages_total"] - before["kv_transfer_skipped_pages_total"]
            bpp = sent_bytes // sent
            # exactly the pages decode did not hold travel: bytes drop by the reused share
            assert sent == prompt_pages - reused_pages and skipped == reused_pages, (t, sent, prompt_pages, reused)
            rows.append((t + 1, sum(len(p) for p in prompts), prompt_pages, reused_pages, sent,
                         sent_bytes, prompt_pages * bpp))
            history = [p + b["output_ids"] for p, b in zip(prompts, got)]

        d = load(decode.base_url)
        assert d["num_decode_reused_tokens_total"] == sum(r[3] for r in rows) * PAGE
        assert d["num_cached_pages"] > 0 and d["cache_hit_rate"] > 0, d
        # idle: every decode page free or evictable (the cache's pages count as free)
        wait_until(lambda: load(decode.base_url)["num_free_pages"] == d["num_total_pages"], 20, "decode pages back")
        print(f"\nPD decode-side reuse, {CONVS} conversations x {TURNS} turns, tiny llama, page {PAGE}, "
              f"{bpp} B/page (all layers, K+V)")
        print(f"{'turn':>4} {'prompt tok':>10} {'pages':>6} {'reused':>7} {'sent':>5} {'bytes sent':>11} "
              f"{'bytes w/o reuse':>15} {'drop':>6}")
        for turn, toks, pages, reused_p, sent, sb, full in rows:
            print(f"{turn:>4} {toks:>10} {pages:>6} {reused_p:>7} {sent:>5} {sb:>11} {full:>15} "
                  f"{1 - sb / full:>6.1%}")
    finally:
        stop_all(prefills, decodes)
