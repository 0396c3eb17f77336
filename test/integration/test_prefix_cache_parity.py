"""Prefix cache (core/radix_cache.py) in the real EngineCore on the tiny model: multi-turn
conversations (each turn resends the history) give the same greedy tokens with the cache on, off
and in HF transformers, and turn 2 onwards is served from the cache (``cached_tokens`` is the
previous turn's KV in whole pages). A tight pool forces eviction mid-run; pages are conserved
after every step; /flush_cache's mechanism empties the cache."""

from __future__ import annotations

import random

import pytest
import torch
from sglang_pd.core.step import ForwardMode
from sglang_pd.engine.control import handle_control
from sglang_pd.engine.engine_core import EngineCore
from sglang_pd.protocol import FlushCache, GenerateReq, SamplingParams
from sglang_pd.server_args import ServerArgs

transformers = pytest.importorskip("transformers")

PS, CHUNK, NEW, TURNS, CONVS = 4, 32, 10, 3, 4


def _turn_inputs(vocab: int, seed: int = 1) -> list[list[list[int]]]:
    """New user tokens per conversation per turn (some longer than a chunk)."""
    rng = random.Random(seed)
    return [[[rng.randrange(10, vocab - 10) for _ in range(rng.choice([3, 9, 21, 45]))]
             for _ in range(TURNS)] for _ in range(CONVS)]


def _run(core: EngineCore, prompts: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """One turn: every conversation's prompt at once; (outputs, cached_tokens) per conversation."""
    params = SamplingParams(max_new_tokens=NEW, temperature=0.0, ignore_eos=True)
    for i, ids in enumerate(prompts):
        core.add_request(GenerateReq(rid=f"c{i}", input_ids=ids, sampling_params=params, stream=True))
    got: dict[str, list[int]] = {f"c{i}": [] for i in range(len(prompts))}
    cached: dict[str, int] = {}
    for _ in range(10_000):
        if len(cached) == len(prompts):
            break
        for out in core.step():
            assert out.error_status == 0, out.finish_reason
            got[out.rid].extend(out.new_token_ids)
            if out.finish_reason is not None:
                cached[out.rid] = out.cached_tokens
        core.scheduler.check_integrity()  # free + held alone + quarantined + cached == pool
    return [got[f"c{i}"] for i in range(len(prompts))], [cached[f"c{i}"] for i in range(len(prompts))]


def _conversations(core: EngineCore | None, model_dir: str, news: list[list[list[int]]]):
    """Play every conversation turn by turn; returns per turn (prompts, outputs, cached)."""
    hf = None
    if core is None:
        hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        hf.generation_config.eos_token_id = None
    history: list[list[int]] = [[] for _ in news]
    turns = []
    for t in range(TURNS):
        prompts = [history[c] + news[c][t] for c in range(len(news))]
        if hf is not None:
            with torch.inference_mode():
                outs = [hf.generate(torch.tensor([p]), max_new_tokens=NEW, do_sample=False,
                                    pad_token_id=0)[0, len(p):].tolist() for p in prompts]
            cached = [0] * len(prompts)
        else:
            outs, cached = _run(core, prompts)
        turns.append((prompts, outs, cached))
        history = [p + o for p, o in zip(prompts, outs)]
    return turns


def _core(model_dir: str, cache: bool, max_total_tokens: int = 16384, mixed: bool = False) -> EngineCore:
    return EngineCore(ServerArgs(model_path=model_dir, page_size=PS, chunked_prefill_size=CHUNK,
                                 max_total_tokens=max_total_tokens, dtype="float32",
                                 disable_radix_cache=not cache, enable_mixed_chunk=mixed))


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_multi_turn_cache_on_off_and_hf_agree(arch: str, tiny_model_factory) -> None:
    model_dir = tiny_model_factory(arch)
    vocab = transformers.AutoConfig.from_pretrained(model_dir).vocab_size
    news = _turn_inputs(vocab)
    ref = _conversations(None, model_dir, news)
    on_core, off_core = _core(model_dir, True), _core(model_dir, False)
    on, off = _conversations(on_core, model_dir, news), _conversations(off_core, model_dir, news)
    for t in range(TURNS):
        assert on[t][0] == ref[t][0] and off[t][0] == ref[t][0]  # same prompts: outputs agreed so far
        for c in range(CONVS):
            assert on[t][1][c] == ref[t][1][c], f"cache on, turn {t} conv {c}"
            assert off[t][1][c] == ref[t][1][c], f"cache off, turn {t} conv {c}"
        assert off[t][2] == [0] * CONVS
    assert on[0][2] == [0] * CONVS  # distinct first prompts: nothing to reuse
    for t in range(1, TURNS):
        for c in range(CONVS):
            prev_kv = len(on[t - 1][0][c]) + NEW - 1  # the last sampled token never had KV
            want = min(prev_kv // PS, (len(on[t][0][c]) - 1) // PS) * PS
            assert on[t][2][c] == want > 0, f"turn {t} conv {c}: cached {on[t][2][c]}, want {want}"
    stats = on_core.stats()
    assert stats.num_cached_pages > 0 and 0.3 < stats.cache_hit_rate < 1.0
    assert off_core.stats().num_cached_pages == 0
    # idle: every page is free or evictable; /flush_cache empties the tree
    assert on_core.allocator.num_free == on_core.allocator.num_usable
    resp = handle_control(on_core, FlushCache(call_id=1))
    assert resp.ok and resp.result["num_freed_pages"] == stats.num_cached_pages
    assert on_core.stats().num_cached_pages == 0
    assert on_core.scheduler.base_allocator.num_free == on_core.allocator.num_usable
    on_core.scheduler.check_integrity()


def test_tight_pool_evicts_and_still_agrees(tiny_model_dir: str) -> None:
    """A pool about one turn's worth: admission evicts older conversations' KV, never a page in
    use (check_integrity after every step), and outputs still equal the cache-off run; with
    mixed steps (decodes riding prefill chunks take their pages through eviction too)."""
    vocab = transformers.AutoConfig.from_pretrained(tiny_model_dir).vocab_size
    news = _turn_inputs(vocab, seed=2)
    off = _conversations(_core(tiny_model_dir, False, 2048), tiny_model_dir, news)
    longest = max(len(p) for p in off[-1][0]) + NEW
    core = _core(tiny_model_dir, True, max_total_tokens=2 * longest, mixed=True)
    on = _conversations(core, tiny_model_dir, news)
    for t in range(TURNS):
        assert on[t][1] == off[t][1], f"turn {t}"
    assert core.scheduler.hits is not None and core.scheduler.hits.cache.num_evicted > 0
    assert any(p.mode is ForwardMode.MIXED for p in core.step_profiles)
    assert sum(on[1][2]) + sum(on[2][2]) > 0  # some hits survive eviction
    assert core.stats().num_cached_pages <= core.allocator.num_usable
