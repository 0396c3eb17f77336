"""The Llama family on ForwardBatch: Llama (2/3/3.x), Qwen2 (q/k/v bias), Qwen3 (q/k norm).

The three differ only in flags carried by ModelConfig (qkv_bias, o_bias, qk_norm, rope
scaling), so one implementation serves all of them. Module names mirror the HF checkpoint
names ("model.layers.N.self_attn...") except that q, k and v are fused into one qkv_proj
(one matmul instead of three), and gate/up into one gate_up_proj when ``merge_gate_up`` (the
loader sets it where the fused kernels run, see SwiGLUMLP); ``hf_weight_map`` tells the loader
which HF tensor fills which rows of which parameter.

The layers pass the residual stream separately from each sub-block's output, so the residual add
and the next RMSNorm are one step (RMSNorm.add_forward: one kernel on the fused path; on the
plain path the same add_ then norm as before).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from sglang_pd.engine.forward_batch import ForwardBatch
from sglang_pd.models.config import ModelConfig
from sglang_pd.models.layers import RMSNorm, RopeStep, RotaryEmbedding, SwiGLUMLP


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

    def forward(self, x: torch.Tensor, rope: RopeStep, batch: ForwardBatch) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q, rope.fused), self.k_norm(k, rope.fused)
        q, k = rope(q, k)
        out = batch.attn_backend.forward(q, k, v, self.layer_id, batch, self.scale)
        return self.o_proj(out)


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype, merge_gate_up: bool = False
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.self_attn = LlamaAttention(cfg, layer_id, dtype)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.mlp = SwiGLUMLP(cfg.hidden_size, cfg.intermediate_size, dtype, merge_gate_up)

    def forward(
        self, x: torch.Tensor | None, residual: torch.Tensor, rope: RopeStep, batch: ForwardBatch
    ) -> torch.Tensor:
        """x: the previous layer's MLP output, not yet added to ``residual`` (None in layer 0).
        Updates residual in place (a fresh tensor owned by this forward) and returns this
        layer's MLP output."""
        on = rope.fused  # the step's fused-or-plain decision
        if x is None:
            h = self.input_layernorm(residual, on)
        else:
            h = self.input_layernorm.add_forward(x, residual, on)
        h = self.post_attention_layernorm.add_forward(self.self_attn(h, rope, batch), residual, on)
        return self.mlp(h, on)


class Embedding(nn.Module):
    """Token embedding without nn.Embedding's random init (the loader fills the weight)."""

    def __init__(self, vocab_size: int, hidden: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden, dtype=dtype))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, merge_gate_up: bool = False) -> None:
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, dtype)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(cfg, i, dtype, merge_gate_up) for i in range(cfg.num_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, merge_gate_up: bool = False) -> None:
        super().__init__()
        self.config = cfg
        self.merge_gate_up = merge_gate_up
        self.model = LlamaModel(cfg, dtype, merge_gate_up)
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
        residual = self.model.embed_tokens(batch.input_ids)
        rope = self.rotary.for_step(batch.positions, residual.dtype)  # once per step
        x: torch.Tensor | None = None
        for layer in self.model.layers:
            x = layer(x, residual, rope, batch)
        if batch.num_tokens != batch.batch_size:  # else every request has exactly one new token
            h = residual if x is None else residual.add_(x)
            h = self.model.norm(h[batch.last_token_indices.to(h.device)], rope.fused)
        elif x is None:  # no layers
            h = self.model.norm(residual, rope.fused)
        else:
            h = self.model.norm.add_forward(x, residual, rope.fused)
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
            if self.merge_gate_up:
                inter, merged = cfg.intermediate_size, f"{p}mlp.gate_up_proj.weight"
                out[f"{p}mlp.gate_proj.weight"] = WeightTarget(merged, 0, inter)
                out[f"{p}mlp.up_proj.weight"] = WeightTarget(merged, inter, inter)
            else:
                whole(f"{p}mlp.gate_proj.weight")
                whole(f"{p}mlp.up_proj.weight")
            whole(f"{p}mlp.down_proj.weight")
            whole(f"{p}input_layernorm.weight")
            whole(f"{p}post_attention_layernorm.weight")
        return out
