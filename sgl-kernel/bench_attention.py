"""Time the Triton attention kernels alone on a GPU, at Llama-3-8B head shapes, one layer.

Decode: bandwidth used (K/V bytes read / time) over batch x context, against --hbm-gbs.
Extend: attention FLOP/s of one causal prompt over prompt length, against --peak-tflops.
Whole-model MBU/MFU (the issue's bars) need the engine; these are the attention parts only.

    python sgl-kernel/bench_attention.py [--hbm-gbs 3350] [--peak-tflops 989] [--json out.json]
"""

from __future__ import annotations

import argparse
import json

import torch

from sgl_pd_kernel import triton_attention as tk

HQ, HKV, D, PAGE = 32, 8, 128, 16


def _time_ms(fn, iters: int = 50) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def _cache(total_tokens: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    slots = (total_tokens // PAGE + 2) * PAGE
    return (torch.randn(slots, HKV, D, dtype=dtype, device="cuda"),
            torch.randn(slots, HKV, D, dtype=dtype, device="cuda"))


def bench_decode(batch: int, ctx: int, dtype: torch.dtype) -> dict:
    k, v = _cache(batch * ctx, dtype)
    pages = ctx // PAGE
    table = (torch.arange(batch * pages, device="cuda", dtype=torch.int32) + 1).view(batch, pages)
    seq_lens = torch.full((batch,), ctx, device="cuda")
    q = torch.randn(batch, HQ, D, dtype=dtype, device="cuda")
    splits = tk.decode_splits(batch, HKV, ctx, torch.cuda.get_device_properties(0).multi_processor_count)
    ms = _time_ms(lambda: tk.decode_attention(q, k, v, table, PAGE, seq_lens, D**-0.5, num_splits=splits))
    kv_bytes = 2 * batch * ctx * HKV * D * k.element_size()
    return {"batch": batch, "ctx": ctx, "splits": splits, "ms": ms, "gbs": kv_bytes / ms / 1e6}


def bench_extend(prompt: int, dtype: torch.dtype) -> dict:
    k, v = _cache(prompt, dtype)
    table = (torch.arange(prompt // PAGE, device="cuda", dtype=torch.int32) + 1).view(1, -1)
    lens = torch.tensor([prompt], device="cuda")
    q = torch.randn(prompt, HQ, D, dtype=dtype, device="cuda")
    zero = torch.zeros(1, dtype=torch.long, device="cuda")
    ms = _time_ms(lambda: tk.extend_attention(q, k, v, table, PAGE, lens, lens, zero, prompt, D**-0.5),
                  iters=10)
    flops = 2 * 2 * HQ * D * prompt * prompt / 2  # QK^T and PV, causal half
    return {"prompt": prompt, "ms": ms, "tflops": flops / ms / 1e9}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hbm-gbs", type=float, default=3350.0, help="H100 SXM: 3350; H200: 4800")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_attention.py needs a CUDA GPU")
    dtype = torch.bfloat16
    print(f"device: {torch.cuda.get_device_name(0)}")
    decode = [bench_decode(b, c, dtype) for b in (1, 8, 32, 128) for c in (1024, 4096)]
    print(f"{'batch':>6} {'ctx':>6} {'splits':>6} {'ms':>8} {'GB/s':>8} {'BW%':>6}")
    for r in decode:
        print(f"{r['batch']:>6} {r['ctx']:>6} {r['splits']:>6} {r['ms']:>8.4f} {r['gbs']:>8.0f} "
              f"{100 * r['gbs'] / args.hbm_gbs:>5.1f}%")
    extend = [bench_extend(n, dtype) for n in (512, 2048, 8192)]
    print(f"{'prompt':>6} {'ms':>8} {'TFLOP/s':>8} {'peak%':>6}")
    for r in extend:
        peak = 100 * r["tflops"] / args.peak_tflops
        print(f"{r['prompt']:>6} {r['ms']:>8.3f} {r['tflops']:>8.1f} {peak:>5.1f}%")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "decode": decode, "extend": extend},
                      f, indent=1)


if __name__ == "__main__":
    main()
