"""Stage short_prefill: 64 concurrent 64-token prompts (one output token each), engine with CUDA
graphs vs without, on the tiny model; the bar is graphs >= 1.3x eager. Runs only once the
engine has short-prefill graphs (a prefill graph runner in engine/cuda_graph.py or on the model
runner); otherwise the stage is skipped as "not built". Extra server arguments for the run
(a dual-queue policy, say) can be given as JSON in GPU_CHECK_SHORT_PREFILL_ARGS."""

from __future__ import annotations

import json
import os
import random
import statistics
import time
from typing import Any

from sglang_pd.tools.gpu_check.common import Ctx, Skip, attempt

PROMPTS, LEN = 64, 64


def built() -> str | None:
    """Where the engine's short-prefill graphs live, or None."""
    import sglang_pd.engine.cuda_graph as cg
    from sglang_pd.engine.model_runner import ModelRunner

    names = [n for n in dir(cg) if "prefill" in n.lower() and isinstance(getattr(cg, n), type)]
    if names:
        return f"engine.cuda_graph.{names[0]}"
    attrs = [n for n in vars(ModelRunner) if "prefill_graph" in n.lower()]
    return f"ModelRunner.{attrs[0]}" if attrs else None


def timed(ctx: Ctx, graphs: bool, extra: dict[str, Any]) -> dict[str, Any]:
    from sglang_pd.offline_engine import Engine

    args = dict(model_path=str(ctx.tiny_model), device=ctx.device, dtype=ctx.dtype_name,
                attention_backend="torch" if ctx.dry_run else "triton", disable_cuda_graph=not graphs,
                skip_tokenizer_init=True, max_running_requests=PROMPTS, max_total_tokens=16384)
    args.update(extra)
    rng = random.Random(0)
    with Engine(**args) as engine:
        prompts = [[rng.randrange(3, engine.core.vocab_size) for _ in range(LEN)] for _ in range(PROMPTS)]
        params = {"max_new_tokens": 1, "temperature": 0.0}
        engine.generate(input_ids=prompts, sampling_params=params)  # warm-up
        times = []
        for _ in range(2 if ctx.dry_run else 5):
            t = time.perf_counter()
            engine.generate(input_ids=prompts, sampling_params=params)
            times.append((time.perf_counter() - t) * 1e3)
    return {"graphs": graphs, "median_ms": round(statistics.median(times), 3), "runs_ms": times}


def run(ctx: Ctx, rec: Any) -> str:
    where = built()
    rec.data["short_prefill_graphs"] = where or "not built"
    if where is None and not ctx.dry_run:
        raise Skip("not built: the engine has no short-prefill CUDA graphs yet (issue 29 item 5)")
    extra = json.loads(os.environ.get("GPU_CHECK_SHORT_PREFILL_ARGS", "{}"))
    rec.data["extra_args"] = extra
    eager = attempt(rec, "eager", lambda: timed(ctx, False, extra))
    if ctx.dry_run:
        return f"dry run: eager {eager.get('median_ms')} ms (graphs: {where or 'not built'})"
    graph = attempt(rec, "graphs", lambda: timed(ctx, True, extra))
    if "median_ms" not in eager or "median_ms" not in graph:
        rec.piece["status"] = "fail"
        return "a run failed"
    rec.data["speedup"] = round(eager["median_ms"] / graph["median_ms"], 3)
    return f"graphs {graph['median_ms']} ms vs eager {eager['median_ms']} ms: {rec.data['speedup']}x"
