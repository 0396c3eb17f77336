"""Start-up warm-up (engine/warmup.py): its dummy steps reach every kernel variant the Triton
backend can compile, and they leave the KV pool as they found it (dummy page 0 zero)."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

from sglang_pd.core.step import ForwardMode
from sglang_pd.engine.attention.torch_backend import TorchAttnBackend
from sglang_pd.engine.kv_pool import KVPool
from sglang_pd.engine.model_runner import ModelRunner
from sglang_pd.engine.warmup import warm_up, warmup_shapes
from sglang_pd.models.config import ModelConfig
from sglang_pd.models.llama import LlamaForCausalLM


def test_shapes_reach_every_triton_variant() -> None:
    kernels = pytest.importorskip("sgl_pd_kernel.triton_attention", exc_type=ImportError)
    max_len = 8192
    shapes = warmup_shapes(max_len)
    ext_blocks = {min(64, kernels._pow2(n)) for mode, n in shapes if mode == ForwardMode.EXTEND}
    assert ext_blocks == {min(64, kernels._pow2(n)) for n in range(1, max_len + 1)}
    for sms in (1, 78, 132):
        for kv_heads in (1, 2, 8):
            warmed = {kernels.decode_splits(1, kv_heads, n, sms)
                      for mode, n in shapes if mode == ForwardMode.DECODE}
            # every (batch, context) a server can see uses a split count already compiled
            served = {kernels.decode_splits(bs, kv_heads, n, sms)
                      for bs in (1, 2, 3, 8, 64, 160) for n in (1, 63, 65, 700, 2049, max_len)}
            assert served <= warmed, (sms, kv_heads)
    assert warmup_shapes(100) == [(ForwardMode.EXTEND, 16), (ForwardMode.EXTEND, 32),
                                  (ForwardMode.EXTEND, 64), (ForwardMode.DECODE, 64)]


def test_warm_up_runs_each_shape_and_leaves_the_pool_zero() -> None:
    cfg = ModelConfig.from_dict({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                 "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
                                 "num_key_value_heads": 2, "intermediate_size": 48, "vocab_size": 50,
                                 "rms_norm_eps": 1e-5, "max_position_embeddings": 512})
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg, torch.float32)
    with torch.no_grad():
        for param in model.parameters():  # Embedding starts uninitialised
            param.normal_(0.0, 0.5)
    pool = KVPool(1, 8, 4, cfg.num_kv_heads, cfg.head_dim, torch.float32)
    pool.kv_buffer[:, :, 1:] = 1.0  # live pages of other requests must not change
    before = pool.kv_buffer.clone()
    calls: list[tuple[ForwardMode, int]] = []
    real_forward = model.forward
    model.forward = lambda batch: calls.append((batch.mode, int(batch.seq_lens[0]))) or real_forward(batch)
    runner = ModelRunner(model, pool, TorchAttnBackend(), max_positions=512)
    assert warm_up(runner, 256) == len(warmup_shapes(256)) == 6
    assert calls == warmup_shapes(256)
    assert torch.equal(pool.kv_buffer, before)  # the torch store wrote page 0; it was zeroed
