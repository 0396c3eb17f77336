#!/usr/bin/env python3
"""Why the Medha scenario lost prefill throughput under the colocated interleave (issue 28, wave 3).

Runs the Medha scenario's workload (scripts/sim_scenarios.py medha: Llama-3-8B TP8 H100,
ShareGPT + 5% Medha-SWE long prompts, short TTFT SLO 2 s, long 60 s) on one colocated instance
and prints short-prompt TTFT p50/p90 with what the interleave chose: the decode step it
measured, its budget B, and the prefill tokens per step (most frequent caps). Two switches
take one input of the cap away, as what-ifs (not the engine's rule):
  --cap-context-zero   the cap computed at context 0 instead of the longest partial's context
  --no-measured-rate   the cap not limited by the measured seconds per prefill token

  python scripts/sim_interleave_probe.py --policy edf --requests 110 [--slo-tpot-ms 50]
"""

from __future__ import annotations

import argparse
import collections
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from sglang_pd.scheduling import colocated
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.sim.cluster import Cluster, ClusterSpec
from sglang_pd.sim.profiles import build_cost
from sglang_pd.sim.workload import synthetic


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", default="edf")
    ap.add_argument("--requests", type=int, default=110)
    ap.add_argument("--qps", type=float, default=0.25)
    ap.add_argument("--slo-tpot-ms", type=float, default=None)
    ap.add_argument("--cap-context-zero", action="store_true")
    ap.add_argument("--no-measured-rate", action="store_true")
    a = ap.parse_args()
    caps: collections.Counter[int] = collections.Counter()
    seen: list[tuple[float, float]] = []  # (decode step, B) at each cap
    rule = colocated.ColocatedInterleave.prefill_tokens

    def probed(self: colocated.ColocatedInterleave, context: int, cap: int) -> int:
        saved = self.token_s
        if a.no_measured_rate:
            self.token_s = None
        try:
            n = rule(self, 0 if a.cap_context_zero else context, cap)
        finally:
            self.token_s = saved
        caps[n] += 1
        seen.append((self.decode_s, self.budget_s()))
        return n

    colocated.ColocatedInterleave.prefill_tokens = probed  # type: ignore[method-assign]
    cfg = PolicyConfig(slo_ttft_ms=2000.0, chunked_prefill_size=4096, max_prefill_tokens=8192,
                       slo_tpot_ms=a.slo_tpot_ms)
    wl = synthetic([("sharegpt-lengths", 0.95), ("medha-swe", 0.05)], a.requests, qps=a.qps, seed=5)
    wl.arrivals = [replace(x, slo_ttft_s=60.0) if x.source == "medha-swe" else x for x in wl.arrivals]
    res = Cluster(ClusterSpec(num_colocated=1, prefill_policy=a.policy, cfg=cfg), build_cost("llama-3-8b@h100x8")).run(wl)
    short = sorted(t.first_token - t.arrival for t in res.tracks if t.source != "medha-swe" and t.first_token is not None)
    mid = seen[len(seen) // 2] if seen else (float("nan"), float("nan"))
    print(f"{a.policy} qps {a.qps} n {a.requests} slo_tpot_ms {a.slo_tpot_ms} context0 {a.cap_context_zero} "
          f"no_rate {a.no_measured_rate}: short TTFT p50 {short[len(short) // 2]:.2f} s p90 "
          f"{short[int(0.9 * len(short))]:.2f} s | decode step {1e3 * mid[0]:.2f} ms, B {1e3 * mid[1]:.2f} ms | "
          f"prefill tokens per step (most frequent): {caps.most_common(4)} of {sum(caps.values())}")


if __name__ == "__main__":
    main()
