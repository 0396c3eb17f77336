"""Tensor-parallel sharding without processes: which heads, rows and columns each rank holds, and
that each rank's loaded weights are exactly its slice of the single-process model's (loading
runs no collective, so a group object with no process group stands in for rank r of N)."""

from __future__ import annotations

import pytest
import torch
from sglang_pd.models.config import ModelConfig
from sglang_pd.models.loader import load_model
from sglang_pd.models.parallel import (
    TPGroup,
    check_tp_size,
    kv_head_start,
    local_heads,
    local_kv_heads,
    vocab_block,
)
from sglang_pd.tools.make_tiny_model import TinySpec, make_tiny_model


def _cfg(heads: int = 8, kv: int = 2, inter: int = 688) -> ModelConfig:
    return ModelConfig.from_dict({"architectures": ["LlamaForCausalLM"], "hidden_size": 256,
                                  "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": 32,
                                  "num_hidden_layers": 1, "intermediate_size": inter,
                                  "vocab_size": 6144})


def test_sizes_the_heads_do_not_allow_are_refused_with_what_fits() -> None:
    cfg = _cfg()
    for ok in (1, 2, 4, 8):
        check_tp_size(cfg, ok)
    with pytest.raises(ValueError, match=r"--tp-size 3 cannot split .*8 attention heads.*"
                                         r"sizes that fit: \[1, 2, 4, 8\]"):
        check_tp_size(cfg, 3)
    with pytest.raises(ValueError, match="6 KV heads"):
        check_tp_size(_cfg(heads=12, kv=6), 4)  # 4 neither divides 6 nor is a multiple of it
    with pytest.raises(ValueError, match="intermediate size 690"):
        check_tp_size(_cfg(inter=690), 4)


@pytest.mark.parametrize(("n", "kv", "want"), [
    (2, 2, [(0, 1), (1, 1)]),                  # split: one KV head each
    (4, 2, [(0, 1), (0, 1), (1, 1), (1, 1)]),  # fewer KV heads than ranks: replicated
    (2, 1, [(0, 1), (0, 1)]),
])
def test_kv_heads_follow_the_q_heads_of_each_rank(n: int, kv: int, want: list) -> None:
    cfg = _cfg(kv=kv)
    got = [(kv_head_start(cfg, TPGroup(r, n)), local_kv_heads(cfg, TPGroup(r, n))) for r in range(n)]
    assert got == want
    group = cfg.num_heads // cfg.num_kv_heads
    for r in range(n):  # every q head of rank r reads a KV head that rank holds
        q0 = r * local_heads(cfg, TPGroup(r, n))
        for h in range(q0, q0 + local_heads(cfg, TPGroup(r, n))):
            start, count = got[r]
            assert start <= h // group < start + count


def test_vocab_blocks_cover_the_vocabulary_once() -> None:
    for vocab, n in ((6144, 2), (6143, 2), (10, 4)):
        blocks = [vocab_block(vocab, TPGroup(r, n)) for r in range(n)]
        covered = [i for start, rows, _ in blocks for i in range(start, start + rows)]
        assert covered == list(range(vocab))
        assert len({padded for _, _, padded in blocks}) == 1


@pytest.mark.parametrize(("arch", "kv"), [("llama", 2), ("qwen2", 2), ("qwen3", 2), ("llama", 1)])
def test_each_rank_loads_exactly_its_slice(arch: str, kv: int, tmp_path) -> None:
    path = make_tiny_model(tmp_path / arch, arch, spec=TinySpec(num_kv_heads=kv, num_layers=1))
    full, cfg = load_model(path)
    fp = dict(full.named_parameters())
    d, n = cfg.head_dim, 2
    for r in range(n):
        tp = TPGroup(r, n)
        part, _ = load_model(path, tp=tp)
        pp = dict(part.named_parameters())
        q, kvs = local_heads(cfg, tp) * d, local_kv_heads(cfg, tp) * d
        q0, k0 = r * q, kv_head_start(cfg, tp) * d
        fq = fp["model.layers.0.self_attn.qkv_proj.weight"]
        qkv = pp["model.layers.0.self_attn.qkv_proj.weight"]
        ks = cfg.q_size
        assert torch.equal(qkv[:q], fq[q0:q0 + q])
        assert torch.equal(qkv[q:q + kvs], fq[ks + k0:ks + k0 + kvs])
        assert torch.equal(qkv[q + kvs:], fq[ks + cfg.kv_size + k0:ks + cfg.kv_size + k0 + kvs])
        o = "model.layers.0.self_attn.o_proj.weight"
        assert torch.equal(pp[o], fp[o][:, q0:q0 + q])
        inter = cfg.intermediate_size // n
        down = "model.layers.0.mlp.down_proj.weight"
        assert torch.equal(pp[down], fp[down][:, r * inter:(r + 1) * inter])
        emb = "model.embed_tokens.weight"
        start, rows, _ = vocab_block(cfg.vocab_size, tp)
        assert torch.equal(pp[emb][:rows], fp[emb][start:start + rows])
        norm = "model.layers.0.input_layernorm.weight"
        assert torch.equal(pp[norm], fp[norm])  # replicated


def test_dummy_weights_are_the_single_process_values_sliced(tmp_path) -> None:
    path = make_tiny_model(tmp_path / "m", "qwen2", spec=TinySpec(num_layers=1))
    full, cfg = load_model(path, load_format="dummy")
    part, _ = load_model(path, load_format="dummy", tp=TPGroup(1, 2))
    up = "model.layers.0.mlp.up_proj.weight"
    inter = cfg.intermediate_size // 2
    assert torch.equal(dict(part.named_parameters())[up], dict(full.named_parameters())[up][inter:])
    bias = "model.layers.0.self_attn.qkv_proj.bias"
    half = cfg.q_size // 2
    assert torch.equal(dict(part.named_parameters())[bias][:half],
                       dict(full.named_parameters())[bias][half:cfg.q_size])
