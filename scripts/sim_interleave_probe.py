#!/usr/bin/env python3
"""Why the Medha scenario lost prefill throughput under the colocated interleave (issue 28, wave 3).

Runs the Medha scenario's workload (scripts/sim_scenarios.py medha: Llama-3-8B TP8 H100,
ShareGPT + 5% Medha-SWE long prompts, short TTFT SLO 2 s, long 60 s) on one colocated instance
and prints short-prompt TTFT p50/p90 with what the interleave chose: the decode step it
measured, its budget B, and the prefill tokens per step taken beside running decodes (most
frequent). What-ifs (not the engine's rule):
  --no-measured-rate   chunks sized by the cost model alone (no measured/predicted ratio)
  --prefill-share X    B = X decode steps without a TPOT SLO (the rule: 1.5)
(Session 3's `--cap-context-zero` is gone: every request's chunk is now sized at its own context.)

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
    ap.add_argument("--no-measured-rate", action="store_true")
    ap.add_argument("--prefill-share", type=float, default=None)
    a = ap.parse_args()
    if a.prefill_share is not None:
        colocated.PREFILL_SHARE = a.prefill_share
    steps: list[colocated.StepAllowance] = []
    seen: list[tuple[float, float]] = []  # (decode step, B) at each step beside decodes
    allowance = colocated.ColocatedInterleave.allowance
    spend = colocated.StepAllowance.spend

    def probed(self: colocated.ColocatedInterleave) -> colocated.StepAllowance:
        saved = self.scale
        if a.no_measured_rate:
            self.scale = None
        try:
            st = allowance(self)
        finally:
            self.scale = saved
        st.tokens = 0  # type: ignore[attr-defined]
        steps.append(st)
        seen.append((self.decode_s, self.budget_s()))
        return st

    def counted(self: colocated.StepAllowance, req: object, n: int) -> None:
        self.tokens += n  # type: ignore[attr-defined]
        spend(self, req, n)  # type: ignore[arg-type]

    colocated.ColocatedInterleave.allowance = probed  # type: ignore[method-assign]
    colocated.StepAllowance.spend = counted  # type: ignore[method-assign]
    cfg = PolicyConfig(slo_ttft_ms=2000.0, chunked_prefill_size=4096, max_prefill_tokens=8192,
                       slo_tpot_ms=a.slo_tpot_ms)
    wl = synthetic([("sharegpt-lengths", 0.95), ("medha-swe", 0.05)], a.requests, qps=a.qps, seed=5)
    wl.arrivals = [replace(x, slo_ttft_s=60.0) if x.source == "medha-swe" else x for x in wl.arrivals]
    res = Cluster(ClusterSpec(num_colocated=1, prefill_policy=a.policy, cfg=cfg), build_cost("llama-3-8b@h100x8")).run(wl)
    short = sorted(t.first_token - t.arrival for t in res.tracks if t.source != "medha-swe" and t.first_token is not None)
    mid = seen[len(seen) // 2] if seen else (float("nan"), float("nan"))
    caps = collections.Counter(st.tokens for st in steps if st.tokens)  # type: ignore[attr-defined]
    print(f"{a.policy} qps {a.qps} n {a.requests} slo_tpot_ms {a.slo_tpot_ms} share {colocated.PREFILL_SHARE} "
          f"no_rate {a.no_measured_rate}: short TTFT p50 {short[len(short) // 2]:.2f} s p90 "
          f"{short[int(0.9 * len(short))]:.2f} s | decode step {1e3 * mid[0]:.2f} ms, B {1e3 * mid[1]:.2f} ms | "
          f"prefill tokens per step (most frequent): {caps.most_common(4)} of {sum(caps.values())}")


if __name__ == "__main__":
    main()
