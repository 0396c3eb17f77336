#!/usr/bin/env python3
"""Tensor-parallel step overhead: what rank 0 pays per step to send the plan to the other ranks
(msgpack encode + one ZMQ send per rank), the plan's size, and decode-step time at --tp-size 1
and N, at a few batch sizes. One process is rank 0 (this script); ranks 1..N-1 are the real
workers (gloo on CPU, NCCL on CUDA). The forward's collectives (2 all-reduces per layer, one
for the embedding, one gather of the logits) show in the forward time of tp=N against tp=1.

  python scripts/measure_tp_overhead.py [--model-path DIR] [--tp-size 2] [--batches 1,16,64]

Without --model-path the tiny llama is built in a temporary directory. Numbers from a shared
2-core CPU host say what the plan costs, not what TP gains: N ranks there share the same cores.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

from sglang_pd.core.step import ForwardMode  # noqa: E402 (after the path insert)
from sglang_pd.engine.tp.inprocess import engine_core  # noqa: E402 (after the path insert)
from sglang_pd.protocol import GenerateReq, SamplingParams  # noqa: E402 (after the path insert)
from sglang_pd.server_args import ServerArgs  # noqa: E402 (after the path insert)


def decode_steps(args: ServerArgs, batches: list[int], prompt_len: int, steps: int) -> list[dict]:
    rows = []
    with engine_core(args) as (core, ranks):
        vocab = core.vocab_size
        for b in batches:
            rng = random.Random(b)
            params = SamplingParams(max_new_tokens=steps + 2, temperature=0.0, ignore_eos=True)
            for i in range(b):
                ids = [rng.randrange(10, vocab - 10) for _ in range(prompt_len)]
                core.add_request(GenerateReq(rid=f"{b}-{i}", input_ids=ids, sampling_params=params))
            core.step_profiles.clear()
            plan_s: list[float] = []
            plan_bytes: list[int] = []
            while core.has_work:
                before = (ranks.stats.seconds, ranks.stats.bytes) if ranks else (0.0, 0)
                core.step()
                prof = core.step_profiles[-1] if core.step_profiles else None
                if ranks and prof is not None and prof.mode is ForwardMode.DECODE:
                    plan_s.append(ranks.stats.seconds - before[0])
                    plan_bytes.append(ranks.stats.bytes - before[1])
            dec = [p for p in core.step_profiles if p.mode is ForwardMode.DECODE and p.batch_size == b]
            row = {"tp": args.tp_size, "batch": b, "steps": len(dec),
                   "step_ms": statistics.median(p.total_s for p in dec) * 1e3,
                   "forward_ms": statistics.median(p.forward_s for p in dec) * 1e3,
                   "plan_us_p50": statistics.median(plan_s) * 1e6 if plan_s else 0.0,
                   "plan_us_max": max(plan_s) * 1e6 if plan_s else 0.0,
                   "plan_bytes": statistics.mean(plan_bytes) if plan_bytes else 0}
            rows.append(row)
            print(f"  tp={row['tp']} batch {b:3d}: decode step p50 {row['step_ms']:.2f} ms "
                  f"(forward {row['forward_ms']:.2f} ms); plan encode+send p50 "
                  f"{row['plan_us_p50']:.1f} us, max {row['plan_us_max']:.1f} us, "
                  f"{row['plan_bytes']:.0f} bytes", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path")
    ap.add_argument("--tp-size", type=int, default=2)
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--output-json")
    a = ap.parse_args()
    model = a.model_path
    if model is None:
        from sglang_pd.tools.make_tiny_model import make_tiny_model
        model = str(make_tiny_model(tempfile.mkdtemp(prefix="tiny-llama-"), "llama"))
    batches = [int(x) for x in a.batches.split(",")]
    rows = []
    for tp in (1, a.tp_size):
        args = ServerArgs(model_path=model, tp_size=tp, device=a.device, page_size=16,
                          max_total_tokens=1 << 16, max_running_requests=max(batches),
                          skip_tokenizer_init=True, disable_cuda_graph=True)
        t0 = time.perf_counter()
        rows += decode_steps(args, batches, a.prompt_len, a.steps)
        print(f"  (tp={tp} run took {time.perf_counter() - t0:.1f} s)")
    print(f"\n{'tp':>3s} {'batch':>5s} {'step ms':>8s} {'fwd ms':>7s} {'plan us p50':>12s} "
          f"{'plan bytes':>10s}")
    for r in rows:
        print(f"{r['tp']:3d} {r['batch']:5d} {r['step_ms']:8.2f} {r['forward_ms']:7.2f} "
              f"{r['plan_us_p50']:12.1f} {r['plan_bytes']:10.0f}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads in rank 0 after the run")
    if a.output_json:
        Path(a.output_json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
