"""Short-prefill graphs (engine/prefill_graph.py) checked on CPU through the graph statics: a
replay off CUDA runs the model eagerly on exactly the buffers and metadata a captured graph
reads, under the Triton interpreter, so the (L, B) padding semantics are tested without a GPU.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

from sglang_pd.core.step import ForwardMode
from sglang_pd.engine.kv_pool import KVPool
from sglang_pd.engine.model_runner import ModelRunner
from sglang_pd.engine.prefill_graph import (PrefillGraphRunner, prefill_graph_reserve_bytes,
                                            short_prefill_graph_grid)
from sglang_pd.core.step import BucketGrid
from sglang_pd.engine.request import Req
from sglang_pd.models.loader import load_model
from sglang_pd.protocol import SamplingParams
from sglang_pd.server_args import ServerArgs

try:
    from sglang_pd.engine.attention.triton_backend import TritonAttnBackend
except ImportError:
    TritonAttnBackend = None  # type: ignore[assignment,misc]
needs_triton = pytest.mark.skipif(TritonAttnBackend is None, reason="triton not installed (the gpu extra)")
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
GRID = BucketGrid((4, 8), (1, 2, 4))
PAGE = 4


def _setup(tiny_model_factory):
    model, cfg = load_model(tiny_model_factory("llama"), torch.float32, DEVICE)
    pool = KVPool(cfg.num_layers, 64, PAGE, cfg.num_kv_heads, cfg.head_dim, torch.float32, DEVICE)
    backend = TritonAttnBackend()
    runner = ModelRunner(model, pool, backend)
    graphs = PrefillGraphRunner(model, pool, backend, GRID)
    graphs.capture()
    return model, cfg, pool, runner, graphs


def _reqs(lengths: list[int], vocab: int, cached: int = 0) -> list[tuple[Req, int]]:
    """Requests with fresh pages (interleaved across requests, from the pool's end backwards,
    so slots are not contiguous); ``cached`` tokens of each already in KV."""
    gen = torch.Generator().manual_seed(sum(lengths) * 31 + len(lengths))
    plan, next_page = [], 63
    for b, n in enumerate(lengths):
        total = cached + n
        pages = list(range(next_page, next_page - 2 * (-(-total // PAGE)), -2))
        next_page = pages[-1] - 1
        ids = torch.randint(3, vocab, (total,), generator=gen).tolist()
        plan.append((Req(rid=str(b), prompt_ids=ids, params=SamplingParams(), arrival=0.0,
                         pages=pages, kv_len=cached), n))
    return plan


def _cases() -> list[tuple[tuple[int, int], list[int]]]:
    """For every bucket, a step that needs exactly it: one more row than the smaller batch
    bucket holds, the longest row longer than the smaller token bucket, uneven row lengths."""
    cases = []
    for ti, tokens in enumerate(GRID.tokens):
        lo_t = GRID.tokens[ti - 1] if ti else 0
        for bi, rows in enumerate(GRID.batch):
            real = (GRID.batch[bi - 1] if bi else 0) + 1
            lengths = [tokens - (k % (tokens - lo_t)) for k in range(real)]
            cases.append(((tokens, rows), lengths))
    return cases


@needs_triton
def test_statics_give_the_eager_rows_for_every_bucket_and_page_0_stays_zero(tiny_model_factory) -> None:
    model, cfg, pool, runner, graphs = _setup(tiny_model_factory)
    assert sorted(graphs._batches) == sorted((t, b) for t in GRID.tokens for b in GRID.batch)
    for bucket, lengths in _cases():
        pool.kv_buffer.zero_()
        batch = runner.build_extend(_reqs(lengths, cfg.vocab_size))
        assert graphs.bucket_for(batch) == bucket, (bucket, lengths)
        with torch.inference_mode():
            want = model.forward(batch).float()
        want_kv = pool.kv_buffer.clone()
        pool.kv_buffer.zero_()
        with torch.inference_mode():
            got = graphs.replay(batch, bucket)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4, msg=f"bucket {bucket} {lengths}")
        # the padded step wrote exactly the real tokens' K/V, and nothing into dummy page 0
        torch.testing.assert_close(pool.kv_buffer, want_kv, atol=1e-5, rtol=1e-5)
        assert not pool.kv_buffer[:, :, :PAGE].any(), f"bucket {bucket}: padding wrote into page 0"
        # the padding of the statics points at page 0 only
        tokens, rows = bucket
        loc = graphs.statics.out_cache_loc[: tokens * rows].view(rows, tokens)
        for b, n in enumerate(lengths):
            assert loc[b, :n].min() >= PAGE and not loc[b, n:].any()
        assert not loc[len(lengths):].any()


@needs_triton
def test_steps_a_bucket_cannot_express_run_eagerly(tiny_model_factory) -> None:
    _model, cfg, _pool, runner, graphs = _setup(tiny_model_factory)
    runner.prefill_graphs = graphs  # what ModelRunner does on CUDA with a grid
    with torch.inference_mode():
        short = runner.build_extend(_reqs([3, 7], cfg.vocab_size))
        runner.forward(short)
        assert graphs.replays == 1  # the ModelRunner hook took the graph path
        for batch in (runner.build_extend(_reqs([3, 2], cfg.vocab_size, cached=5)),  # cached prefix
                      runner.build_extend(_reqs([9], cfg.vocab_size)),  # longer than L_max
                      runner.build_extend(_reqs([2] * 5, cfg.vocab_size))):  # more rows than B_max
            assert graphs.bucket_for(batch) is None
            runner.forward(batch)
        reqs = [r for r, _ in _reqs([3, 3], cfg.vocab_size)]
        for r in reqs:
            r.kv_len, r.output_ids = 3, [5]
        decode = runner.build_decode(reqs)
        assert decode.mode == ForwardMode.DECODE and graphs.bucket_for(decode) is None
    assert graphs.replays == 1


def test_graphs_only_where_a_short_queue_forms_bucketed_steps() -> None:
    grid = "16,64x1,8"
    assert short_prefill_graph_grid(ServerArgs(model_path="m", short_prefill_buckets=grid), True) is None
    for args in (ServerArgs(model_path="m", disaggregation_mode="prefill", short_prefill_buckets=grid),
                 ServerArgs(model_path="m", prefill_queues="dual", short_prefill_buckets=grid)):
        assert short_prefill_graph_grid(args, True) == BucketGrid((16, 64), (1, 8))
        assert short_prefill_graph_grid(args, False) is None  # graphs off or backend cannot


def test_reserve_covers_the_largest_bucket() -> None:
    """At least one layer's activations for L_max x B_max tokens plus B_max rows of float32
    logits; grows with the grid's largest bucket only."""
    from sglang_pd.models.config import ModelConfig
    from sglang_pd.tools.make_dummy_config import PRESETS

    cfg = ModelConfig.from_dict(PRESETS["llama-3-8b"])
    got = prefill_graph_reserve_bytes(BucketGrid(), cfg, torch.bfloat16)
    tokens = 256 * 64
    one_layer = tokens * 2 * (cfg.hidden_size + cfg.q_size + 2 * cfg.kv_size + 2 * cfg.intermediate_size)
    assert one_layer + 64 * cfg.vocab_size * 4 < got < 8 << 30
    assert prefill_graph_reserve_bytes(BucketGrid((8, 64), (1, 64)), cfg, torch.bfloat16) < got
    assert prefill_graph_reserve_bytes(BucketGrid((8, 256), (1, 2, 64)), cfg, torch.bfloat16) == got
