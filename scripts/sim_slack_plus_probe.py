#!/usr/bin/env python3
"""Which part of slack+'s wave-3 fixes (858ec92) costs the Kairos scenario its E2E attainment.

One window of the Kairos scenario (scripts/sim_scenarios.py kairos: Mooncake, MiniMax-M2.5 TP4
H200, 1P+1D, TTFT SLO 8 s, TPOT SLO 50 ms) with slack+ as it is, or with one of its two fixes
taken out again, as what-ifs (the fixes are the issue's bars; these runs only measure them):
  --variant norecover  a behind request with a feasible pace is best effort again (served at
                       least every other step) instead of decoding every step until on pace
  --variant nokept     packing no longer keeps every chosen request's met deadline
  --variant both       both taken out
Prints E2E / TTFT / TPOT attainment and, with --stats, how many decisions had recovering
requests. Each run takes ~25 s.

  python scripts/sim_slack_plus_probe.py [--window 3] [--qps 2.0] [--variant head] [--stats]
"""

from __future__ import annotations

import argparse
import collections
import inspect
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from sglang_pd.bench.metrics import SloSpec
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.decode import slack_plus
from sglang_pd.sim.cluster import Cluster, ClusterSpec
from sglang_pd.sim.profiles import build_cost
from sglang_pd.sim.report import metrics
from sglang_pd.sim.workload import from_trace

EDITS = {  # the lines of SlackPlusDecodePolicy.choose each what-if replaces
    "norecover": [("recover = [b and t_all <= self.tpot_s(r) and c - d <= RECOVER_LATENESS * self.tpot_s(r)",
                   "recover = [False and c - d"), ("for b, r, c, d in zip(behind, running, solo, due)]",
                                                   "for c, d in zip(solo, due)]")],
    "nokept": [("kept = min((due[i] for i in range(n) if chosen[i] and due[i] >= t_cur), default=math.inf)",
                "kept = math.inf"), ("kept = min(kept, due[i])", "pass")],
    "stats": [("    if count == n:\n", "    STATS[sum(recover)] += 1\n    if count == n:\n")],
}


def patch(edits: list[tuple[str, str]], stats: collections.Counter[int]) -> None:
    src = textwrap.dedent(inspect.getsource(slack_plus.SlackPlusDecodePolicy.choose))
    for old, new in edits:
        if old not in src:
            sys.exit(f"slack+ changed: {old!r} not found")
        src = src.replace(old, new)
    ns = dict(vars(slack_plus), STATS=stats)
    exec(src, ns)
    slack_plus.SlackPlusDecodePolicy.choose = ns["choose"]  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--window", type=int, default=3)
    ap.add_argument("--qps", type=float, default=2.0)
    ap.add_argument("--variant", choices=("head", "norecover", "nokept", "both"), default="head")
    ap.add_argument("--stats", action="store_true", help="count decisions by recovering requests")
    a = ap.parse_args()
    edits: list[tuple[str, str]] = {"head": [], "both": EDITS["norecover"] + EDITS["nokept"],
                                     "norecover": EDITS["norecover"], "nokept": EDITS["nokept"]}[a.variant]
    stats: collections.Counter[int] = collections.Counter()
    if a.stats:
        edits = edits + EDITS["stats"]
    if edits:
        patch(edits, stats)
    cfg = PolicyConfig(slo_ttft_ms=8000, slo_tpot_ms=50, chunked_prefill_size=16384, max_prefill_tokens=16384)
    spec = ClusterSpec(1, 1, prefill_policy="kairos+", decode_policy="slack+", cfg=cfg, prefix_cache_tokens=8_000_000,
                       link_gb_s=100.0, router_prefill="round_robin", router_decode="round_robin")
    wl = from_trace("mooncake", window=1000, window_index=a.window, qps=a.qps)
    o = metrics(Cluster(spec, build_cost("minimax-m2.5@h200x4")).run(wl), SloSpec(8000.0, 50.0))[1].overall
    print(f"kairos+/slack+ window {a.window} qps {a.qps} {a.variant}: E2E {100 * (o.slo_attainment or 0):.1f}% "
          f"TTFT {100 * (o.ttft_attainment or 0):.1f}% TPOT {100 * (o.tpot_attainment or 0):.1f}%")
    if a.stats:
        total = sum(stats.values())
        some = total - stats[0]
        print(f"decisions reaching the packing: {total}, with recovering requests: {some}; by how many: "
              f"{sorted(stats.items())[:16]}")


if __name__ == "__main__":
    main()
