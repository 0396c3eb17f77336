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
from torch import nn

from sglang_pd.engine.forward_batch import ForwardBatch
from sglang_pd.models.config import ModelConfig
from sglang_pd.models.layers import RMSNorm, RopeStep, RotaryEmbedding, SwiGLUMLP
from sglang_pd.models.parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    TPGroup,
    VocabParallelEmbedding,
    kv_head_start,
    local_heads,
    local_kv_heads,
    vocab_block,
    vocab_parallel_logits,
)


@dataclass(frozen=True)
class WeightTarget:
    """Where one HF checkpoint tensor goes: rows [row_start, row_start + rows) of ``param``.

    ``shard_dim`` (tensor parallelism): this rank takes only [shard_start, shard_start +
    shard_len) of the checkpoint tensor along that dimension (0: output rows, 1: input columns);
    ``full`` is the tensor's whole length there, checked against the checkpoint. None: all of it."""

    param: str
    row_start: int
    rows: int
    shard_dim: int | None = None
    shard_start: int = 0
    shard_len: int = 0
    full: int = 0


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype,
                 tp: TPGroup | None = None) -> None:
        super().__init__()
        tp = tp or TPGroup.single()
        self.layer_id = layer_id
        # this rank's heads (all of them without tensor parallelism)
        self.num_heads = local_heads(cfg, tp)
        self.num_kv_heads = local_kv_heads(cfg, tp)
        self.head_dim = cfg.head_dim
        self.q_size, self.kv_size = self.num_heads * cfg.head_dim, self.num_kv_heads * cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        self.qkv_proj = ColumnParallelLinear(
            cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias, dtype=dtype
        )
        self.o_proj = RowParallelLinear(self.q_size, cfg.hidden_size, cfg.o_bias, dtype, tp)
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
        self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype, merge_gate_up: bool = False,
        tp: TPGroup | None = None,
    ) -> None:
        super().__init__()
        tp = tp or TPGroup.single()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.self_attn = LlamaAttention(cfg, layer_id, dtype, tp)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.mlp = SwiGLUMLP(cfg.hidden_size, cfg.intermediate_size // tp.size, dtype,
                             merge_gate_up, tp)

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


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, merge_gate_up: bool = False,
                 tp: TPGroup | None = None) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, dtype,
                                                   tp or TPGroup.single())
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(cfg, i, dtype, merge_gate_up, tp) for i in range(cfg.num_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, merge_gate_up: bool = False,
                 tp: TPGroup | None = None) -> None:
        super().__init__()
        self.config = cfg
        self.merge_gate_up = merge_gate_up
        self.tp = tp = tp or TPGroup.single()
        self.model = LlamaModel(cfg, dtype, merge_gate_up, tp)
        # the LM head splits the vocabulary as the embedding does (the same weight when tied)
        self.lm_head = (
            None
            if cfg.tie_word_embeddings
            else ColumnParallelLinear(cfg.hidden_size, vocab_block(cfg.vocab_size, tp)[2],
                                      bias=False, dtype=dtype)
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
        return vocab_parallel_logits(h, weight, self.config.vocab_size, self.tp)

    def hf_weight_map(self) -> dict[str, WeightTarget]:
        """Every tensor name a HF checkpoint of this config must provide -> where it goes (and,
        with tensor parallelism, which slice of it this rank takes)."""
        cfg, tp = self.config, self.tp
        params = dict(self.named_parameters())
        out: dict[str, WeightTarget] = {}

        def whole(name: str) -> None:
            out[name] = WeightTarget(name, 0, params[name].shape[0])

        def part(name: str, param: str, row: int, dim: int, start: int, length: int,
                 full: int) -> None:
            rows = length if dim == 0 else params[param].shape[0]
            if tp.size == 1:
                out[name] = WeightTarget(param, row, rows)
            else:
                out[name] = WeightTarget(param, row, rows, dim, start, length, full)

        v_start, v_rows, _ = vocab_block(cfg.vocab_size, tp)
        part("model.embed_tokens.weight", "model.embed_tokens.weight", 0, 0, v_start, v_rows,
             cfg.vocab_size)
        whole("model.norm.weight")
        if self.lm_head is not None:
            part("lm_head.weight", "lm_head.weight", 0, 0, v_start, v_rows, cfg.vocab_size)
        d = cfg.head_dim
        q, kv = local_heads(cfg, tp) * d, local_kv_heads(cfg, tp) * d
        q0, kv0 = tp.rank * q, kv_head_start(cfg, tp) * d
        inter = cfg.intermediate_size // tp.size
        i0 = tp.rank * inter
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            for suffix in ("weight", "bias") if cfg.qkv_bias else ("weight",):
                fused = f"{p}self_attn.qkv_proj.{suffix}"
                part(f"{p}self_attn.q_proj.{suffix}", fused, 0, 0, q0, q, cfg.q_size)
                part(f"{p}self_attn.k_proj.{suffix}", fused, q, 0, kv0, kv, cfg.kv_size)
                part(f"{p}self_attn.v_proj.{suffix}", fused, q + kv, 0, kv0, kv, cfg.kv_size)
            o = f"{p}self_attn.o_proj.weight"
            part(o, o, 0, 1, q0, q, cfg.q_size)
            if cfg.o_bias:
                whole(f"{p}self_attn.o_proj.bias")  # added once, after the all-reduce
            if cfg.qk_norm:
                whole(f"{p}self_attn.q_norm.weight")
                whole(f"{p}self_attn.k_norm.weight")
            full_inter = cfg.intermediate_size
            if self.merge_gate_up:
                merged = f"{p}mlp.gate_up_proj.weight"
                part(f"{p}mlp.gate_proj.weight", merged, 0, 0, i0, inter, full_inter)
                part(f"{p}mlp.up_proj.weight", merged, inter, 0, i0, inter, full_inter)
            else:
                for name in (f"{p}mlp.gate_proj.weight", f"{p}mlp.up_proj.weight"):
                    part(name, name, 0, 0, i0, inter, full_inter)
            down = f"{p}mlp.down_proj.weight"
            part(down, down, 0, 1, i0, inter, full_inter)
            whole(f"{p}input_layernorm.weight")
            whole(f"{p}post_attention_layernorm.weight")
        return out
