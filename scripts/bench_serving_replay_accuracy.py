#!/usr/bin/env python3
"""How closely does the client keep a trace's arrival times?

Starts the stub server (fast replies, so the server never holds requests back), replays the
first N requests of a trace at --time-scale, and prints |send time - trace time| in ms.
Exit status 1 when the max exceeds --bar-ms. With --baseline it first walks the same schedule
with a bare timer loop (no HTTP at all): the host's own wakeup lateness, which tells client
error apart from a busy machine.

    python scripts/bench_serving_replay_accuracy.py --num-prompts 500 --time-scale 1 --baseline
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from sglang_pd.bench.app import run_benchmark
from sglang_pd.bench.cli import build_parser
from sglang_pd.bench.runner import sleep_until
from sglang_pd.bench.stub_harness import running_stub
from sglang_pd.bench.traces import load_trace


def _baseline(trace: str, n: int, scale: float) -> str:
    """Lateness of a bare asyncio timer loop over the same schedule, with the client's sleep."""
    recs = load_trace(trace, limit=n)

    async def walk() -> list[float]:
        t0, errs = time.perf_counter(), []
        for r in recs:
            target = t0 + (r.arrival_s or 0.0) * scale
            await sleep_until(target)
            errs.append((time.perf_counter() - target) * 1000)
        return sorted(errs)

    e = asyncio.run(walk())
    return (
        f"baseline timer loop, no HTTP, {len(e)} wakeups: p50 {e[len(e) // 2]:.3f} ms, "
        f"p99 {e[int(0.99 * (len(e) - 1))]:.3f} ms, max {e[-1]:.3f} ms"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", default="azure-conv", help="trace file or short name")
    p.add_argument("--num-prompts", type=int, default=500)
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--bar-ms", type=float, default=5.0, help="fail above this max error (ms)")
    p.add_argument("--baseline", action="store_true", help="also time a bare timer loop first")
    a = p.parse_args()
    baseline = _baseline(a.trace, a.num_prompts, a.time_scale) if a.baseline else ""
    flags = ["--trace", a.trace, "--num-prompts", str(a.num_prompts)]
    flags += ["--time-scale", str(a.time_scale), "--max-input-len", "16", "--max-output-len", "2"]
    with running_stub("--first-ms", "2", "--itl-ms", "1", "--lifetime", "7200") as base:
        t = time.monotonic()
        (rec,) = run_benchmark(build_parser().parse_args(["--base-url", base, *flags]))
        wall = time.monotonic() - t
    d = rec["dispatch_error_ms"]
    print(
        f"trace {a.trace}: first {a.num_prompts} requests at time scale {a.time_scale:g}, "
        f"wall time {wall:.1f} s"
    )
    if baseline:
        print(baseline)
    print(
        f"|send - trace time| over {int(d['count'])} requests: mean {d['mean_ms']:.3f} ms, "
        f"p50 {d['p50_ms']:.3f} ms, p99 {d['p99_ms']:.3f} ms, max {d['max_ms']:.3f} ms "
        f"(bar {a.bar_ms:g} ms)"
    )
    return 0 if d["max_ms"] <= a.bar_ms else 1


if __name__ == "__main__":
    sys.exit(main())
