"""Stage short_prefill: short-prefill CUDA graphs (engine/prefill_graph.py) against the eager
forward on the same prepared batches, timed with CUDA events: B concurrent new prompts of L
tokens each, for the bar's bucket (64 prompts of 64 tokens: graphs >= 1.3x eager) and two
others, on the tiny model (what graphs remove is launch overhead, which a tiny model exposes;
a Llama-3-8B 4096-token prefill is compute-bound and would gain little). Each bucket also
checks that the graph's next tokens equal eager's. Dry run: CPU, the torch backend, one tiny
bucket, where the "graph" path runs eagerly through the statics (plumbing only)."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from sglang_pd.tools.gpu_check.common import Ctx, Skip, attempt, time_ms

BAR = (64, 64)  # (L tokens per prompt, B prompts)
BUCKETS = [BAR, (16, 8), (128, 4)]
DRY_BUCKETS = [(8, 2)]


def built() -> str | None:
    """Where the engine's short-prefill graphs live, or None."""
    try:
        from sglang_pd.engine.prefill_graph import PrefillGraphRunner
    except ImportError:
        return None
    return f"engine.prefill_graph.{PrefillGraphRunner.__name__}"


def build(ctx: Ctx, buckets: list[tuple[int, int]]) -> tuple[Any, Any]:
    """An engine without graphs of its own (its runner's forward is the eager path) and a
    prefill graph runner over the grid spanned by ``buckets``, captured."""
    from sglang_pd.core.step import BucketGrid
    from sglang_pd.engine.engine_core import EngineCore
    from sglang_pd.engine.prefill_graph import PrefillGraphRunner
    from sglang_pd.server_args import ServerArgs
    from sglang_pd.tools.gpu_check.llama_shape import PAGE

    tokens = sum(-(-(t + 1) // PAGE) * PAGE * b for t, b in buckets) + 64 * PAGE
    args = ServerArgs(model_path=str(ctx.tiny_model), dtype=ctx.dtype_name, device=ctx.device,
                      attention_backend="torch" if ctx.dry_run else "triton", page_size=PAGE,
                      max_total_tokens=tokens, disable_cuda_graph=True, skip_tokenizer_init=True,
                      max_running_requests=max(b for _, b in buckets))
    core = EngineCore(args)
    grid = BucketGrid(tuple(sorted({t for t, _ in buckets})), tuple(sorted({b for _, b in buckets})))
    graphs = PrefillGraphRunner(core.model, core.kv_pool, core.runner.attn_backend, grid)
    graphs.capture()
    return core, graphs


def measure(ctx: Ctx, core: Any, graphs: Any, tokens: int, rows: int) -> dict[str, Any]:
    from sglang_pd.tools.gpu_check.llama_shape import fake_reqs

    reqs = fake_reqs(core, rows, tokens, extend=True)
    runner = core.runner
    batch = runner.build_extend([(r, tokens) for r in reqs])
    bucket = graphs.bucket_for(batch)
    if bucket != (tokens, rows):
        raise Skip(f"the step maps to bucket {bucket}, not {(tokens, rows)}")
    iters = 3 if ctx.dry_run else 20
    with torch.inference_mode():
        want = runner.forward(batch).argmax(-1).tolist()  # no graphs on this runner: eager
        got = graphs.replay(batch, bucket).argmax(-1).tolist()
        eager = time_ms(lambda: runner.forward(batch), ctx.device, iters=iters)
        graph = time_ms(lambda: graphs.replay(batch, bucket), ctx.device, iters=iters)
    return {"bucket": [tokens, rows], "eager_ms": round(eager["median_ms"], 4),
            "graph_ms": round(graph["median_ms"], 4),
            "speedup": round(eager["median_ms"] / graph["median_ms"], 3),
            "tokens_equal": got == want, "timing": "cuda events" if ctx.device == "cuda" else "perf_counter"}


def run(ctx: Ctx, rec: Any) -> str:
    where = built()
    rec.data["short_prefill_graphs"] = where or "not built"
    if where is None:
        raise Skip("not built: the engine has no short-prefill CUDA graphs (issue 29 item 3)")
    buckets = DRY_BUCKETS if ctx.dry_run else BUCKETS
    held: dict[str, Any] = {}

    def capture() -> dict[str, Any]:
        held["core"], held["graphs"] = build(ctx, buckets)
        return {"buckets": len(held["graphs"].buckets()),
                "captured_mib": round(held["graphs"].captured_bytes / 2**20, 1)}

    attempt(rec, "capture", capture)
    if "graphs" not in held:
        rec.piece["status"] = "fail"
        return "capture failed"
    core, graphs = held["core"], held["graphs"]
    results = [attempt(rec, f"L{t}xB{b}", partial(measure, ctx, core, graphs, t, b)) for t, b in buckets]
    core.close()
    if any("speedup" not in r for r in results):
        rec.piece["status"] = "partial"
    if any(r.get("tokens_equal") is False for r in results):
        rec.piece["status"] = "fail"
    head = results[0]
    if ctx.dry_run:
        return f"dry run: bucket {buckets[0]} eager {head.get('eager_ms')} ms, statics {head.get('graph_ms')} ms"
    if "speedup" not in head:
        return f"bar bucket {BAR} failed"
    rec.data["speedup"] = head["speedup"]
    rec.data["bar_met"] = head["speedup"] >= 1.3
    others = ", ".join(f"L{r['bucket'][0]}xB{r['bucket'][1]} {r['speedup']}x" for r in results[1:]
                       if "speedup" in r)
    return (f"{BAR[1]} prompts of {BAR[0]} tokens: graphs {head['graph_ms']} ms vs eager "
            f"{head['eager_ms']} ms = {head['speedup']}x (bar 1.3x); {others}")
