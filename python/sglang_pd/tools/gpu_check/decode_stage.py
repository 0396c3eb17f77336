"""Stage decode: Llama-3-8B shape (dummy bf16 weights, Triton attention), one decode step's time
over batch {1, 8, 32, 64, 128} x context {1K, 4K}, with CUDA graphs (the engine's replay) and
eagerly (the model's forward), and MBU = (weight bytes + KV bytes read) / time over the copy
bandwidth the env stage measured. If the engine cannot start with graphs, that error is
recorded and the stage goes on eagerly. Cells that do not fit the card's memory are skipped."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from sglang_pd.tools.gpu_check import llama_shape as ls
from sglang_pd.tools.gpu_check.common import Ctx, attempt, ceilings, sig, time_ms

GPU_CELLS = ([1, 8, 32, 64, 128], [1024, 4096])
CPU_CELLS = ([1, 2], [16, 48])


def measure_cell(ctx: Ctx, core: Any, shape: ls.Shape, bw_gbps: float, batch: int, context: int
                 ) -> dict[str, Any]:
    runner = core.runner
    reqs = ls.fake_reqs(core, batch, context)
    batch_fb = runner.build_decode(reqs)
    moved = shape.decode_weight_bytes(batch) + batch * (context + 1) * shape.kv_bytes_per_token
    iters = 5 if ctx.dry_run else 20
    row: dict[str, Any] = {"batch": batch, "context": context, "bytes": moved}

    def add(name: str, fn: Any) -> None:
        t = time_ms(fn, ctx.device, iters=iters)["median_ms"]
        row[f"{name}_ms"] = round(t, 3)
        row[f"{name}_mbu"] = sig(moved / (t / 1e3) / (bw_gbps * 1e9), 3)

    with torch.inference_mode():
        graphs = runner.graph_runner is not None and runner.graph_runner.can_run(batch_fb)
        row["graph"] = graphs
        if graphs:
            add("graph", lambda: runner.forward(batch_fb))
            add("graph_with_build", lambda: runner.forward(runner.build_decode(reqs)))
        add("eager", lambda: runner.model.forward(batch_fb))
    return row


def run(ctx: Ctx, rec: Any) -> str:
    batches, contexts = CPU_CELLS if ctx.dry_run else GPU_CELLS
    bw = ceilings(ctx)["copy_gbps"]
    rec.data["copy_gbps"] = bw
    per = -(-(max(contexts) + 1) // ls.PAGE) * ls.PAGE
    want = max(batches) * per + ls.PAGE
    wbytes = ls.estimate_weight_bytes(ctx) if not ctx.dry_run else 0
    core = None
    for graphs in ([False] if ctx.dry_run else [True, False]):
        def start(graphs: bool = graphs) -> dict[str, Any]:
            nonlocal core
            tokens = ls.pool_tokens(ctx, want, wbytes, 131072 if not ctx.dry_run else 1)
            core = ls.build_core(ctx, graphs, tokens, max(batches))
            return {"graphs_asked": graphs, "graphs_used": core.runner.graph_runner is not None,
                    "pool_tokens": tokens}
        res = attempt(rec, f"start_graphs_{'on' if graphs else 'off'}", start)
        if "error" not in res:
            break
        ls.release(None)  # the failed engine's weights and pool go before the eager one comes
    if core is None:
        rec.piece["status"] = "fail"
        return "engine did not start (see start_graphs_*)"
    shape = ls.shape_of(core)
    rec.data["shape"] = {"params": shape.params, "layers": shape.layers, "kv_heads": shape.kv_heads,
                         "head_dim": shape.head_dim, "dtype_bytes": shape.dtype_bytes}
    cells = []
    for c in contexts:
        for b in batches:
            cells.append(attempt(rec, f"b{b}_c{c}", partial(measure_cell, ctx, core, shape, bw, b, c)))
    ls.release(core)
    ok = [c for c in cells if "eager_ms" in c]
    if not ok:
        rec.piece["status"] = "fail"
        return "no cell measured"
    first = ok[0]
    mode = "graph" if first.get("graph") else "eager"
    return (f"{len(ok)}/{len(cells)} cells; b{first['batch']} c{first['context']}: {mode} "
            f"{first[mode + '_ms']} ms, MBU {first[mode + '_mbu']:.0%}")
