"""Stage parity: the tiny model through the engine core on the device, greedy outputs of every
attention backend with CUDA graphs on and off against the torch backend run eagerly, and
sampled requests (temperature > 0, top-k/top-p/min-p, penalties) served without error.

What must be equal token for token, and what cannot be (two H200 runs):
- float32 is the parity bar: every backend, graphs on and off, equals the torch backend run
  eagerly (rounding is far below the tiny model's logit gaps). Run 1 and 2: Triton with graphs
  6/6 identical.
- bfloat16 is served and reported, not held to token equality: even the torch backend against
  itself differed on 1 of 6 prompts in run 2 (a step's batch composition depends on measured step
  times, and a bf16 matmul's rounding on its batch size), and Triton vs torch SDPA sum in another
  order. For each first divergence the reference's top-2 log-probabilities there are reported
  (``divergence_top2``: the gap, and whether the token taken was the runner-up).
"""

from __future__ import annotations

import importlib.util
import random
import time
from functools import partial
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


def drive(engine: Any, batch: list[list[int]], params: dict[str, Any], timeout_s: float = 30.0,
          top2: list[list[list[tuple[float, int]]]] | None = None) -> list[list[int]]:
    """Half the prompts, three steps, the other half; step until all finish. A request that
    fails (error status) raises with its message. With ``top2`` (a list to fill), each
    request's top-2 (logprob, token) per generated token is appended to it."""
    from sglang_pd.offline_engine import parse_sampling_params
    from sglang_pd.protocol import GenerateReq

    core, sp = engine.core, parse_sampling_params(params)
    reqs = [GenerateReq(rid=f"p{i}", input_ids=ids, sampling_params=sp, arrival_time=time.time(),
                        return_logprob=top2 is not None, top_logprobs_num=2 if top2 is not None else 0)
            for i, ids in enumerate(batch)]
    out: dict[str, list[int]] = {r.rid: [] for r in reqs}
    tops: dict[str, list[list[tuple[float, int]]]] = {r.rid: [] for r in reqs}
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
            for row in o.output_top_logprobs or []:
                tops[o.rid].append([(t.logprob, t.token_id) for t in row])
            if o.finish_reason is not None:
                if o.error_status:
                    raise RuntimeError(f"request {o.rid} failed ({o.error_status}): {o.finish_reason}")
                pending.discard(o.rid)
        steps += 1
    if top2 is not None:
        top2.extend(tops[r.rid] for r in reqs)
    return [out[r.rid] for r in reqs]


def compare(got: list[list[int]], ref: list[list[int]],
            ref_top2: list[list[list[tuple[float, int]]]] | None = None) -> dict[str, Any]:
    """Token-for-token comparison; with the reference's top-2 per token, each first divergence
    gets the reference's gap there and whether the token taken was its runner-up."""
    first = [next((i for i, (a, b) in enumerate(zip(g, r)) if a != b), None if len(g) == len(r) else
                  min(len(g), len(r))) for g, r in zip(got, ref)]
    row: dict[str, Any] = {"identical": sum(f is None for f in first), "prompts": len(ref),
                           "first_divergence": first}
    if ref_top2 is not None:
        at: list[dict[str, Any] | None] = []
        for p, f in enumerate(first):
            if f is None or f >= len(ref_top2[p]) or f >= len(got[p]):
                at.append(None)
                continue
            top = ref_top2[p][f]
            at.append({"gap": round(top[0][0] - top[1][0], 5), "runner_up": top[1][1] == got[p][f]}
                      if len(top) == 2 else None)
        row["divergence_top2"] = at
    return row


def mismatched(row: dict[str, Any]) -> bool:
    """True when a strict (float32) row's greedy outputs differ from the reference's."""
    return "identical" in row and row["identical"] != row["prompts"]


def one_config(ctx: Ctx, backend: str, graphs: bool, dtype: str, ref: list[list[int]] | None,
               sampled: bool, ref_top2: list[Any] | None = None,
               top2_out: list[Any] | None = None) -> dict[str, Any]:
    t = time.monotonic()
    engine = make_engine(ctx, backend, graphs, dtype)
    try:
        vocab = engine.core.vocab_size
        row: dict[str, Any] = {"backend": backend, "dtype": dtype, "graphs_asked": graphs,
                               "graphs_used": engine.core.runner.graph_runner is not None,
                               "start_s": round(time.monotonic() - t, 2)}
        row["greedy"] = drive(engine, prompts(vocab), GREEDY, top2=top2_out)
        if ref is not None:
            row.update(compare(row["greedy"], ref, ref_top2))
        if sampled:
            outs = drive(engine, prompts(vocab, seed=1), SAMPLED)
            row["sampled_served"] = sum(len(o) == SAMPLED["max_new_tokens"] for o in outs)
    finally:
        engine.shutdown()
    return row


def configs(ctx: Ctx) -> list[tuple[str, bool, str]]:
    """(backend, graphs, dtype) after the two references (torch eager in float32, the parity
    bar, and in the production dtype); each backend's eager run before its graph run."""
    if ctx.dry_run:  # the CPU has neither graphs nor a fast Triton: the torch path, both ways
        return [("torch", True, ctx.dtype_name)]
    backends = ["triton"] + (["flashinfer"] if importlib.util.find_spec("flashinfer") else [])
    rows = [(b, g, "float32") for b in backends for g in (False, True)]
    rows += [("torch", True, "float32"), ("auto", True, "float32")]
    if ctx.dtype_name != "float32":
        rows += [(b, g, ctx.dtype_name) for b in backends for g in (False, True)]
    return rows


def run(ctx: Ctx, rec: Any) -> str:
    prod = ctx.dtype_name
    ref32 = attempt(rec, "torch_eager_float32", lambda: one_config(
        ctx, "torch", False, "float32", None, sampled=True)).get("greedy")
    ref_top2: list[Any] = []
    refp = ref32
    if prod != "float32":
        refp = attempt(rec, f"torch_eager_{prod}", lambda: one_config(
            ctx, "torch", False, prod, None, sampled=True, top2_out=ref_top2)).get("greedy")
    bad: list[str] = []
    strict = 0
    for backend, graphs, dtype in configs(ctx):
        key = f"{backend}_{'graphs' if graphs else 'eager'}_{dtype}"
        exact = dtype == "float32"
        strict += exact
        row = attempt(rec, key, partial(one_config, ctx, backend, graphs, dtype, ref32 if exact else refp,
                                        sampled=graphs, ref_top2=None if exact else ref_top2))
        if "error" in row or (exact and mismatched(row)) or (
                "sampled_served" in row and row["sampled_served"] != len(PROMPT_LENS)):
            bad.append(key)
    for key in {"torch_eager_float32", f"torch_eager_{prod}"}:
        ref_row = rec.data.get(key, {})
        if "error" in ref_row or ref_row.get("sampled_served") != len(PROMPT_LENS):
            bad.insert(0, key + " (reference)")
    if bad:
        rec.piece["status"] = "fail"
    reported = [f"{k}: {v['identical']}/{v['prompts']}" for k, v in rec.data.items()
                if isinstance(v, dict) and "identical" in v and not k.endswith("float32")]
    return (f"float32: {strict - len([b for b in bad if b.endswith('float32')])}/{strict} configs "
            f"equal torch eager" + (f"; {prod} (reported): {', '.join(reported)}" if reported else "")
            + (f"; failing: {', '.join(bad)}" if bad else ""))
