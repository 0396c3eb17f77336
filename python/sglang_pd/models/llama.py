"""The Llama family on ForwardBatch: Llama (2/3/3.x), Qwen2 (q/k/v bias), Qwen3 (q/k norm).

The three differ only in flags carried by ModelConfig (qkv_bias, o_bias, qk_norm, rope
scaling), so one implementation serves all of them. Module names mirror the HF checkpoint
names ("model.layers.N.self_attn...") except that q, k and v are fused into one qkv_proj
(one matmul instead of three; gate/up stay separate, see SwiGLUMLP); ``hf_weight_map`` tells
the loader which HF tensor fills which rows of which parameter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from sglang_pd.engine.forward_batch import ForwardBatch
from sglang_pd.models.config import ModelConfig
from sglang_pd.models.layers import RMSNorm, RotaryEmbedding, SwiGLUMLP, apply_rope


@dataclass(frozen=True)
class WeightTarget:
    """Where one HF checkpoint tensor goes: rows [row_start, row_start + rows) of ``param``."""

    param: str
    row_start: int
    rows: int


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = cfg.num_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.q_size, self.kv_size = cfg.q_size, cfg.kv_size
        self.scale = cfg.head_dim**-0.5
        self.qkv_proj = nn.Linear(
            cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size, bias=cfg.qkv_bias, dtype=dtype
        )
        self.o_proj = nn.Linear(cfg.q_size, cfg.hidden_size, bias=cfg.o_bias, dtype=dtype)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype) if cfg.qk_norm else None

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = batch.attn_backend.forward(q, k, v, self.layer_id, batch, self.scale)
        return self.o_proj(out)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.self_attn = LlamaAttention(cfg, layer_id, dtype)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.mlp = SwiGLUMLP(cfg.hidden_size, cfg.intermediate_size, dtype)

    def forward(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        # h is a fresh tensor owned by this forward, so the residual adds may be in place.
        h = h.add_(self.self_attn(self.input_layernorm(h), cos, sin, batch))
        return h.add_(self.mlp(self.post_attention_layernorm(h)))


class Embedding(nn.Module):
    """Token embedding without nn.Embedding's random init (the loader fills the weight)."""

    def __init__(self, vocab_size: int, hidden: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden, dtype=dtype))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, dtype)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, i, dtype) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg, dtype)
        self.lm_head = (
            None
            if cfg.tie_word_embeddings
            else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, dtype=dtype)
        )
        self.rotary = RotaryEmbedding(
            cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling
        )

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """float32 logits [B, vocab] of each request's last new token in ``batch``."""
        if batch.attn_metadata is None:
            batch.attn_backend.init_forward_metadata(batch)
        h = self.model.embed_tokens(batch.input_ids)
        cos, sin = self.rotary.cos_sin(batch.positions, h.dtype)  # once per step, not per layer
        for layer in self.model.layers:
            h = layer(h, cos, sin, batch)
        if batch.num_tokens != batch.batch_size:  # else every request has exactly one new token
            h = h[batch.last_token_indices.to(h.device)]  # norm + lm_head only where sampled
        h = self.model.norm(h)
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(h, weight).float()

    def hf_weight_map(self) -> dict[str, WeightTarget]:
        """Every tensor name a HF checkpoint of this config must provide -> where it goes."""
        cfg = self.config
        params = dict(self.named_parameters())
        out: dict[str, WeightTarget] = {}

        def whole(name: str) -> None:
            out[name] = WeightTarget(name, 0, params[name].shape[0])

        whole("model.embed_tokens.weight")
        whole("model.norm.weight")
        if self.lm_head is not None:
            whole("lm_head.weight")
        q, kv = cfg.q_size, cfg.kv_size
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            for suffix in ("weight", "bias") if cfg.qkv_bias else ("weight",):
                fused = f"{p}self_attn.qkv_proj.{suffix}"
                out[f"{p}self_attn.q_proj.{suffix}"] = WeightTarget(fused, 0, q)
                out[f"{p}self_attn.k_proj.{suffix}"] = WeightTarget(fused, q, kv)
                out[f"{p}self_attn.v_proj.{suffix}"] = WeightTarget(fused, q + kv, kv)
            whole(f"{p}self_attn.o_proj.weight")
            if cfg.o_bias:
                whole(f"{p}self_attn.o_proj.bias")
            if cfg.qk_norm:
                whole(f"{p}self_attn.q_norm.weight")
                whole(f"{p}self_attn.k_norm.weight")
            whole(f"{p}mlp.gate_proj.weight")
            whole(f"{p}mlp.up_proj.weight")
            whole(f"{p}mlp.down_proj.weight")
            whole(f"{p}input_layernorm.weight")
            whole(f"{p}post_attention_layernorm.weight")
        return out
