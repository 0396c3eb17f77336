"""Stage parity: the tiny model through the engine core on the device, greedy outputs of every
attention backend with CUDA graphs on and off against the torch backend run eagerly, and
sampled requests (temperature > 0, top-k/top-p/min-p, penalties) served without error.

Requests arrive in two waves (the second while the first decodes) so the steps include mixed
prefill + decode batches, not only a pure prefill and pure decodes."""

from __future__ import annotations

import importlib.util
import random
import time
from typing import Any

from sglang_pd.tools.gpu_check.common import Ctx, attempt

GREEDY = {"max_new_tokens": 24, "temperature": 0.0, "ignore_eos": True}
SAMPLED = {"max_new_tokens": 16, "temperature": 1.0, "top_p": 0.9, "top_k": 50, "min_p": 0.05,
           "repetition_penalty": 1.1, "frequency_penalty": 0.2, "ignore_eos": True}
PROMPT_LENS = (5, 17, 40, 130, 9, 300)


def prompts(vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in PROMPT_LENS]


def make_engine(ctx: Ctx, backend: str, graphs: bool, dtype: str) -> Any:
    from sglang_pd.offline_engine import Engine

    return Engine(model_path=str(ctx.tiny_model), device=ctx.device, dtype=dtype,
                  attention_backend=backend, disable_cuda_graph=not graphs, cuda_graph_max_bs=8,
                  max_total_tokens=8192, skip_tokenizer_init=True, max_running_requests=16)


def drive(engine: Any, batch: list[list[int]], params: dict[str, Any], timeout_s: float = 30.0
          ) -> list[list[int]]:
    """Half the prompts, three steps, the other half; step until all finish. A request that
    fails (error status) raises with its message."""
    from sglang_pd.offline_engine import parse_sampling_params
    from sglang_pd.protocol import GenerateReq

    core, sp = engine.core, parse_sampling_params(params)
    reqs = [GenerateReq(rid=f"p{i}", input_ids=ids, sampling_params=sp, arrival_time=time.time())
            for i, ids in enumerate(batch)]
    out: dict[str, list[int]] = {r.rid: [] for r in reqs}
    pending = set(out)
    half = len(reqs) // 2
    for r in reqs[:half]:
        core.add_request(r)
    steps, deadline = 0, time.monotonic() + timeout_s
    while pending:
        if steps == 3:
            for r in reqs[half:]:
                core.add_request(r)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(pending)} requests unfinished after {timeout_s} s")
        for o in core.step():
            out[o.rid].extend(o.new_token_ids)
            if o.finish_reason is not None:
                if o.error_status:
                    raise RuntimeError(f"request {o.rid} failed ({o.error_status}): {o.finish_reason}")
                pending.discard(o.rid)
        steps += 1
    return [out[r.rid] for r in reqs]


def compare(got: list[list[int]], ref: list[list[int]]) -> dict[str, Any]:
    first = [next((i for i, (a, b) in enumerate(zip(g, r)) if a != b), None if len(g) == len(r) else
                  min(len(g), len(r))) for g, r in zip(got, ref)]
    return {"identical": sum(f is None for f in first), "prompts": len(ref),
            "first_divergence": first}


def one_config(ctx: Ctx, backend: str, graphs: bool, dtype: str, ref: list[list[int]] | None,
               sampled: bool) -> dict[str, Any]:
    t = time.monotonic()
    engine = make_engine(ctx, backend, graphs, dtype)
    try:
        vocab = engine.core.vocab_size
        row: dict[str, Any] = {"backend": backend, "dtype": dtype, "graphs_asked": graphs,
                               "graphs_used": engine.core.runner.graph_runner is not None,
                               "start_s": round(time.monotonic() - t, 2)}
        row["greedy"] = drive(engine, prompts(vocab), GREEDY)
        if ref is not None:
            row.update(compare(row["greedy"], ref))
        if sampled:
            outs = drive(engine, prompts(vocab, seed=1), SAMPLED)
            row["sampled_served"] = sum(len(o) == SAMPLED["max_new_tokens"] for o in outs)
    finally:
        engine.shutdown()
    return row


def configs(ctx: Ctx) -> list[tuple[str, bool, str]]:
    """(backend, graphs, dtype) after the reference (torch, eager, production dtype)."""
    d = ctx.dtype_name
    if ctx.dry_run:  # the CPU has neither graphs nor a fast Triton: the torch path, both ways
        return [("torch", True, d)]
    rows = [("triton", True, d), ("triton", False, d), ("torch", True, d), ("auto", True, d)]
    if importlib.util.find_spec("flashinfer") is not None:
        rows += [("flashinfer", True, d), ("flashinfer", False, d)]
    return rows + [("torch", False, "float32"), ("triton", True, "float32")]


def run(ctx: Ctx, rec: Any) -> str:
    base = attempt(rec, "torch_eager_" + ctx.dtype_name,
                   lambda: one_config(ctx, "torch", False, ctx.dtype_name, None, sampled=True))
    ref = base.get("greedy")
    ref32: list[list[int]] | None = None
    bad: list[str] = []
    for backend, graphs, dtype in configs(ctx):
        key = f"{backend}_{'graphs' if graphs else 'eager'}_{dtype}"
        against = ref if dtype == ctx.dtype_name else ref32
        row = attempt(rec, key, lambda: one_config(ctx, backend, graphs, dtype, against, sampled=graphs))
        if backend == "torch" and dtype == "float32" and not graphs:
            ref32 = row.get("greedy")
        if "error" in row or row.get("identical", row.get("prompts")) != row.get("prompts") or (
                "sampled_served" in row and row["sampled_served"] != len(PROMPT_LENS)):
            bad.append(key)
    if "error" in base or base.get("sampled_served") != len(PROMPT_LENS):
        bad.insert(0, "torch_eager (reference)")
    if bad:
        rec.piece["status"] = "fail"
    n = len(configs(ctx))
    return f"{n - len([b for b in bad if 'reference' not in b])}/{n} configs match the torch eager reference" + (
        f"; failing: {', '.join(bad)}" if bad else "")
