"""Stage prefill: Llama-3-8B shape, one request's prefill of 1K/4K/8K tokens (eager: graphs do
not cover long prefills), MFU = model FLOPs / time over the matmul rate the env stage measured.
FLOPs: 2 x (every matrix but embedding and lm_head) per token, the lm_head for the last token,
and causal attention 2 x head_dim x L(L+1) per query head per layer (QK^T and PV)."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from sglang_pd.tools.gpu_check import llama_shape as ls
from sglang_pd.tools.gpu_check.common import Ctx, attempt, ceilings, sig, time_ms

GPU_LENS = [1024, 4096, 8192]
CPU_LENS = [32, 96]


def flops(shape: ls.Shape, n: int) -> float:
    attn = 2 * shape.head_dim * n * (n + 1) * shape.q_heads * shape.layers
    return 2.0 * shape.matmul_params * n + 2.0 * shape.lm_head_params + attn


def measure(ctx: Ctx, core: Any, shape: ls.Shape, rate: float, n: int) -> dict[str, Any]:
    runner = core.runner
    (req,) = ls.fake_reqs(core, 1, n, extend=True)
    batch = runner.build_extend([(req, n)])
    with torch.inference_mode():
        t = time_ms(lambda: runner.forward(batch), ctx.device, iters=3 if ctx.dry_run else 5,
                    warmup=1 if ctx.dry_run else 2)["median_ms"]
    f = flops(shape, n)
    return {"tokens": n, "ms": round(t, 3), "tflops": sig(f / (t / 1e3) / 1e12),
            "mfu": sig(f / (t / 1e3) / (rate * 1e12), 3), "flops": f}


def run(ctx: Ctx, rec: Any) -> str:
    lens = CPU_LENS if ctx.dry_run else GPU_LENS
    rate = ceilings(ctx)["matmul_tflops"]
    rec.data["matmul_tflops"] = rate
    want = max(lens) + 2 * ls.PAGE
    wbytes = ls.estimate_weight_bytes(ctx) if not ctx.dry_run else 0
    core = ls.build_core(ctx, False, ls.pool_tokens(ctx, want, wbytes, 131072), 1)
    shape = ls.shape_of(core)
    rows = [attempt(rec, f"len{n}", partial(measure, ctx, core, shape, rate, n)) for n in lens]
    ls.release(core)
    ok = [r for r in rows if "mfu" in r]
    if not ok:
        rec.piece["status"] = "fail"
        return "no length measured"
    return ", ".join(f"{r['tokens']}: {r['ms']} ms MFU {r['mfu']:.0%}" for r in ok)
