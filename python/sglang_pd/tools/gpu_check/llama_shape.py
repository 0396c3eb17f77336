"""The Llama-3-8B-shaped engine the decode and prefill stages measure (dummy bf16 weights,
Triton attention) and the requests they feed it without a scheduler: each synthetic request
owns a run of pages already holding random K/V, so any (batch, context) cell is one
``build_decode`` away, with no prefill to wait for. Dry run: the tiny model on CPU."""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Any

import torch

from sglang_pd.tools.gpu_check.common import Ctx, Skip

PAGE = 16
GIB = 1 << 30


@dataclass
class Shape:
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    vocab: int
    tied: bool
    params: int  # every parameter
    matmul_params: int  # those multiplied by every token: all but the embedding and lm_head
    lm_head_params: int
    dtype_bytes: int

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def decode_weight_bytes(self, batch: int) -> int:
        """Weights one decode step reads: every matrix once, batch rows of the embedding."""
        return (self.matmul_params + self.lm_head_params + batch * self.hidden) * self.dtype_bytes


def model_dir(ctx: Ctx) -> tuple[str, str]:
    if ctx.dry_run:
        return str(ctx.tiny_model), "auto"
    from sglang_pd.tools.make_dummy_config import make_dummy_config

    return str(make_dummy_config("llama-3-8b", ctx.work / "llama-3-8b")), "dummy"


def build_core(ctx: Ctx, graphs: bool, max_tokens: int, max_bs: int) -> Any:
    from sglang_pd.engine.engine_core import EngineCore
    from sglang_pd.server_args import ServerArgs

    path, load = model_dir(ctx)
    args = ServerArgs(model_path=path, load_format=load, dtype=ctx.dtype_name, device=ctx.device,
                      attention_backend="torch" if ctx.dry_run else "triton", page_size=PAGE,
                      max_total_tokens=max_tokens, disable_cuda_graph=not graphs,
                      cuda_graph_max_bs=max_bs, max_running_requests=max(max_bs, 8),
                      chunked_prefill_size=8192, skip_tokenizer_init=True)
    core = EngineCore(args)
    buf = core.kv_pool.kv_buffer
    buf.normal_()  # random K/V (never zeros); dummy page 0 stays zero as the engine keeps it
    buf[:, :, 0].zero_()
    return core


def release(core: Any | None) -> None:
    if core is not None:
        core.close()
    del core
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def shape_of(core: Any) -> Shape:
    cfg = core.config
    params = dict(core.model.named_parameters())
    emb = sum(p.numel() for n, p in params.items() if "embed_tokens" in n)
    untied = any("lm_head" in n for n in params)
    head = sum(p.numel() for n, p in params.items() if "lm_head" in n) if untied else emb
    total = sum(p.numel() for p in params.values())
    return Shape(cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size,
                 cfg.vocab_size, not untied, total, total - emb - (head if untied else 0),
                 head, next(iter(params.values())).element_size())


def pool_tokens(ctx: Ctx, want_tokens: int, weight_bytes: int, kv_bytes_per_token: int,
                margin: int = 12 * GIB) -> int:
    """Tokens of KV pool to ask for: what the cells need, capped by the free device memory
    less the weights and a margin (graphs, activations, the allocator's slack)."""
    if ctx.dry_run:
        return want_tokens
    free, _ = torch.cuda.mem_get_info()
    fit = (free - weight_bytes - margin) // kv_bytes_per_token
    return int(max(PAGE * 4, min(want_tokens, fit)))


def fake_reqs(core: Any, batch: int, context: int, extend: bool = False) -> list[Any]:
    """``batch`` requests with ``context`` tokens of KV in pages 1, 2, ... (a decode step then
    writes position ``context``), or, with ``extend``, with none yet (a prefill of ``context``)."""
    from sglang_pd.engine.request import Req
    from sglang_pd.protocol import SamplingParams

    per = -(-(context + 1) // PAGE)
    if 1 + batch * per > core.kv_pool.num_pages:
        raise Skip(f"does not fit: {batch} x {context} tokens need {batch * per} pages; pool has "
                          f"{core.kv_pool.num_pages - 1}")
    gen = torch.Generator().manual_seed(batch * 100003 + context)
    ids = torch.randint(3, core.vocab_size, (context + 1,), generator=gen).tolist()
    reqs = []
    for b in range(batch):
        pages = list(range(1 + b * per, 1 + (b + 1) * per))
        reqs.append(Req(rid=f"fake{b}", prompt_ids=ids[:context], params=SamplingParams(),
                        arrival=0.0, output_ids=[] if extend else [ids[-1]], pages=pages,
                        kv_len=0 if extend else context))
    return reqs


def estimate_weight_bytes(ctx: Ctx) -> int:
    """From config.json, before the model exists (to size the pool): Llama layout, 2 bytes."""
    import json
    from pathlib import Path

    c = json.loads((Path(model_dir(ctx)[0]) / "config.json").read_text())
    h, hd = c["hidden_size"], c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    attn = h * hd * (2 * c["num_attention_heads"] + 2 * c["num_key_value_heads"])
    layer = attn + 3 * h * c["intermediate_size"]
    return 2 * (c["num_hidden_layers"] * layer + 2 * c["vocab_size"] * h)
