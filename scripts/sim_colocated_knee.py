#!/usr/bin/env python3
"""Where the CPU engine's knee is for bench_prefill_policies.py's long-tail mix, simulated.

    python scripts/sim_colocated_knee.py [--rates 0.05,0.1,0.15,0.2,0.3] [--num-requests 120]

One colocated instance with CPU-like step costs (SmolLM2-135M shape on the shared 2-core dev
machine; ours, fitted by eye to the measured runs in docs/bench/colocated_interleave.md):
prefill 20 ms per forward + 2 ms per request + 4 ms per new token + 1e-6 s per L(L + 2H);
decode 100 ms + 15 ms per request. The mix is the bench's (``--length-mix``: IN:OUT:WEIGHT),
chunk 512, one TTFT SLO (5 s), Poisson arrivals (seed 11), the real Scheduler, policies and
colocated interleave. Per rate and policy: short p90 TTFT (prompts under 1,024 tokens), its
ratio to fcfs, p50 TPOT and the prefill work offered per second (utilisation; > 1 = overload).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.cost_model import PrefillCoeffs
from sglang_pd.sim.cluster import Cluster
from sglang_pd.sim.cluster_spec import ClusterSpec
from sglang_pd.sim.profiles import StepCost
from sglang_pd.sim.workload import synthetic

PREFILL = PrefillCoeffs(launch_s=0.020, per_req_s=0.002, a=1e-6, b=0.004)
LONG = 1024  # prompt tokens from which a request is long (the bench's --long-threshold)


def cost() -> StepCost:
    return StepCost("cpu-smollm2", PREFILL, lambda batch, ctx, ctx_max: 0.100 + 0.015 * batch,
                    kv_bytes_per_token=1.0, kv_capacity_tokens=200_000)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def run(policy: str, rate: float, mix: list[tuple[str, float]], n: int, chunk: int) -> dict:
    dual = policy == "dual"
    cfg = PolicyConfig(slo_ttft_ms=5000, chunked_prefill_size=chunk,
                       prefill_queues="dual" if dual else "single", short_prefill_threshold=256, role="colocated")
    spec = ClusterSpec(num_colocated=1, prefill_policy="fcfs" if dual else policy, cfg=cfg)
    res = Cluster(spec, cost()).run(synthetic(mix, n, qps=rate, seed=11))
    short = [t.first_token - t.arrival for t in res.tracks if t.first_token is not None and t.prompt_len < LONG]
    tpot = [(t.finish - t.first_token) / (t.output_len - 1) for t in res.tracks
            if t.finish is not None and t.first_token is not None and t.output_len > 1]
    return {"short_p90": pct(short, 0.9), "tpot_p50": pct(tpot, 0.5), "errors": sum(1 for t in res.tracks if t.error)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="0.05,0.08,0.1,0.12,0.15,0.2,0.3")
    ap.add_argument("--policies", default="fcfs,kairos+,dual")
    ap.add_argument("--length-mix", default="64:32:0.47,200:32:0.47,3072:16:0.06")
    ap.add_argument("--num-requests", type=int, default=120)
    ap.add_argument("--chunk", type=int, default=512)
    a = ap.parse_args()
    parts = [p.split(":") for p in a.length_mix.split(",")]
    mix = [(f"fixed:{i}:{o}", float(w)) for i, o, w in parts]
    # prefill seconds a request costs alone (chunked), weighted by the mix: offered load per req/s
    per_req = 0.0
    for i, _, w in parts:
        left, h, s = int(i), 0, 0.0
        while left > 0:
            c = min(left, a.chunk)
            s += PREFILL.launch_s + PREFILL.per_req_s + PREFILL.a * c * (c + 2 * h) + PREFILL.b * c
            left, h = left - c, h + c
        per_req += float(w) * s
    pols = a.policies.split(",")
    print("| rate (req/s) | prefill load | " + " | ".join(f"{p} short p90 TTFT" for p in pols)
          + " | " + " / ".join(pols) + " p50 TPOT | errors |")
    print("|---" * (len(pols) + 4) + "|")
    for rate in (float(r) for r in a.rates.split(",")):
        rows = {p: run(p, rate, mix, a.num_requests, a.chunk) for p in pols}
        base = rows[pols[0]]["short_p90"]
        cells = [f"{rows[p]['short_p90']:.1f} s" + ("" if p == pols[0] else f" ({base / rows[p]['short_p90']:.2f}x)")
                 for p in pols]
        print(f"| {rate:g} | {rate * per_req:.2f} | " + " | ".join(cells) + " | "
              + " / ".join(f"{1e3 * rows[p]['tpot_p50']:.0f}" for p in pols) + " ms | "
              + str(sum(r["errors"] for r in rows.values())) + " |", flush=True)


if __name__ == "__main__":
    main()
