#!/usr/bin/env python3
"""Offline throughput: our Engine vs HF transformers ``generate`` on the same weights and dtype.

Workloads
  fixed     input 128 / output 128 tokens at batch 1, 16 and 32 (one static batch each)
  sharegpt  64 requests, ShareGPT input/output lengths divided by 8 (>= 4 tokens each); HF runs
            static batches of --max-batch (left-padded, each batch generates until its longest
            request), ours runs continuous batching with --max-running-requests = --max-batch
Only requested output tokens count for both sides. With --overhead, also the step overhead:
per decode step, wall time outside the model forward, at 1/16/64/256 running requests.

  python scripts/bench_offline.py --model-path DIR --load-format dummy --output-json F
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
SHAREGPT = REPO / "data/traces/sharegpt/sharegpt_8k_filtered_stats_llama2_tokenizer.csv"


@dataclass
class Row:
    workload: str  # fixed | sharegpt
    batch: int
    num_requests: int
    output_tokens: int
    input_tokens: int
    ours_s: float
    hf_s: float
    ours_output_tok_s: float
    hf_output_tok_s: float
    ours_total_tok_s: float
    hf_total_tok_s: float
    ratio: float  # ours / HF output tokens/s


def sharegpt_lengths(n: int, seed: int, divisor: int = 8) -> list[tuple[int, int]]:
    with open(SHAREGPT) as f:
        rows = [(int(r["num_prefill_tokens"]), int(r["num_decode_tokens"])) for r in csv.DictReader(f)]
    rng = random.Random(seed)
    return [(max(i // divisor, 4), max(o // divisor, 4)) for i, o in rng.sample(rows, n)]


def random_prompts(lengths: list[int], vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab - 100) for _ in range(n)] for n in lengths]


# ---------------------------------------------------------------------------- the two sides
def hf_model_from_ours(engine, model_path: str, dtype: torch.dtype):
    """A HF model holding exactly our engine's weights (dummy or loaded)."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(model_path)
    hf = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    ours = engine.core.model
    params = dict(ours.named_parameters())
    state = {name: params[t.param][t.row_start: t.row_start + t.rows]
             for name, t in ours.hf_weight_map().items()}
    if getattr(config, "tie_word_embeddings", False):
        state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
    hf.load_state_dict(state, strict=False, assign=True)
    hf.tie_weights()
    hf.generation_config.eos_token_id = None  # as our ignore_eos: run every batch to full length
    missing = [n for n, p in hf.named_parameters() if p.is_meta]
    if missing:
        raise RuntimeError(f"HF parameters not filled from our weights: {missing[:5]}")
    return hf.eval()


def run_hf(hf, prompts: list[list[int]], outputs: list[int], batch: int) -> float:
    start = time.perf_counter()
    with torch.inference_mode():
        for b in range(0, len(prompts), batch):
            chunk, outs = prompts[b:b + batch], outputs[b:b + batch]
            width = max(map(len, chunk))
            ids = torch.tensor([[0] * (width - len(p)) + p for p in chunk])  # left padding
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
            hf.generate(input_ids=ids, attention_mask=mask, do_sample=False, pad_token_id=0,
                        max_new_tokens=max(outs))
    return time.perf_counter() - start


def run_ours(engine, prompts: list[list[int]], outputs: list[int]) -> float:
    params = [{"max_new_tokens": o, "temperature": 0.0, "ignore_eos": True} for o in outputs]
    start = time.perf_counter()
    results = engine.generate(input_ids=prompts, sampling_params=params)
    elapsed = time.perf_counter() - start
    got = [r["meta_info"]["completion_tokens"] for r in results]
    if got != outputs:
        raise RuntimeError("our engine produced the wrong number of tokens")
    return elapsed


def measure(workload: str, batch: int, engine, hf, prompts, outputs, skip_hf: bool) -> Row:
    print(f"  {workload:8s} batch {batch:3d}: {len(prompts)} requests ...", flush=True)
    ours_s = run_ours(engine, prompts, outputs)
    hf_s = float("nan") if skip_hf else run_hf(hf, prompts, outputs, batch)
    out_tok, in_tok = sum(outputs), sum(map(len, prompts))
    return Row(workload, batch, len(prompts), out_tok, in_tok, ours_s, hf_s, out_tok / ours_s,
               out_tok / hf_s, (out_tok + in_tok) / ours_s, (out_tok + in_tok) / hf_s,
               (out_tok / ours_s) / (out_tok / hf_s))


# ---------------------------------------------------------------------------- step overhead
def step_overhead(engine, vocab: int, sizes: list[int], steps: int = 12) -> list[dict]:
    from sglang_pd.core.step import ForwardMode

    core = engine.core
    rows = []
    for n in sizes:
        prompts = random_prompts([16] * n, vocab, seed=n)
        params = {"max_new_tokens": steps + 4, "temperature": 0.0, "ignore_eos": True}
        core.step_profiles.clear()
        engine.generate(input_ids=prompts, sampling_params=params)
        decode = [p for p in core.step_profiles if p.mode is ForwardMode.DECODE and p.batch_size == n]
        over = [p.overhead_s * 1e3 for p in decode]
        fwd = [p.forward_s * 1e3 for p in decode]
        rows.append({"running": n, "steps": len(decode), "overhead_ms_mean": statistics.mean(over),
                     "overhead_ms_p50": statistics.median(over), "overhead_ms_max": max(over),
                     "forward_ms_mean": statistics.mean(fwd)})
        r = rows[-1]
        print(f"  {n:4d} running: overhead mean {r['overhead_ms_mean']:.3f} ms, p50 "
              f"{r['overhead_ms_p50']:.3f} ms, max {r['overhead_ms_max']:.3f} ms "
              f"(forward {r['forward_ms_mean']:.1f} ms, {len(decode)} steps)", flush=True)
    return rows


def print_table(rows: list[Row]) -> None:
    print(f"\n{'workload':9s} {'batch':>5s} {'reqs':>5s} {'out tok':>8s} {'ours out tok/s':>15s} "
          f"{'HF out tok/s':>13s} {'ours tot tok/s':>15s} {'HF tot tok/s':>13s} {'ours/HF':>8s}")
    for r in rows:
        print(f"{r.workload:9s} {r.batch:5d} {r.num_requests:5d} {r.output_tokens:8d} "
              f"{r.ours_output_tok_s:15.1f} {r.hf_output_tok_s:13.1f} {r.ours_total_tok_s:15.1f} "
              f"{r.hf_total_tok_s:13.1f} {r.ratio:7.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--workloads", default="fixed,sharegpt")
    ap.add_argument("--batches", default="1,16,32", help="batch sizes of the fixed workload")
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--sharegpt-requests", type=int, default=64)
    ap.add_argument("--fixed-len", type=int, default=128)
    ap.add_argument("--overhead", action="store_true", help="also measure per-step overhead")
    ap.add_argument("--overhead-sizes", default="1,16,64,256")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1)))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output-json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(REPO / "python"))
    from sglang_pd import Engine

    dtype = getattr(torch, args.dtype)
    sizes = [int(x) for x in args.overhead_sizes.split(",")]
    engine = Engine(model_path=args.model_path, load_format=args.load_format, dtype=args.dtype,
                    skip_tokenizer_init=True, max_running_requests=args.max_batch,
                    chunked_prefill_size=8192, max_prefill_tokens=16384, max_total_tokens=1 << 18)
    vocab = engine.core.vocab_size
    hf = None if args.skip_hf else hf_model_from_ours(engine, args.model_path, dtype)
    print(f"model {args.model_path} ({engine.core.config.architecture}, {args.load_format} weights, "
          f"{args.dtype}), {args.threads} threads")
    rows: list[Row] = []
    workloads = args.workloads.split(",")
    if "fixed" in workloads:
        for b in [int(x) for x in args.batches.split(",")]:
            prompts = random_prompts([args.fixed_len] * b, vocab, seed=args.seed + b)
            rows.append(measure("fixed", b, engine, hf, prompts, [args.fixed_len] * b, args.skip_hf))
    if "sharegpt" in workloads:
        lengths = sharegpt_lengths(args.sharegpt_requests, args.seed)
        prompts = random_prompts([i for i, _ in lengths], vocab, seed=args.seed)
        rows.append(measure("sharegpt", args.max_batch, engine, hf, prompts, [o for _, o in lengths],
                            args.skip_hf))
    print_table(rows)
    if args.output_json:
        Path(args.output_json).write_text(json.dumps([asdict(r) for r in rows], indent=1))
    engine.shutdown()
    if args.overhead:
        print("\nstep overhead (decode steps; wall time outside the model forward):")
        with Engine(model_path=args.model_path, load_format=args.load_format, dtype=args.dtype,
                    skip_tokenizer_init=True, max_running_requests=max(sizes),
                    max_total_tokens=1 << 18) as engine:
            overhead = step_overhead(engine, vocab, sizes)
        if args.output_json:
            Path(args.output_json).with_suffix(".overhead.json").write_text(json.dumps(overhead, indent=1))


if __name__ == "__main__":
    main()
