#!/usr/bin/env python3
"""Per-step log of the Medha scenario's colocated instance (issue 28, session 5): for every step
its mode, simulated time, running/waiting counts and the prefill grants (``L``: a Medha-SWE long
prompt, ``s``: a ShareGPT one, as index@context+tokens), plus TTFT/TPOT quantiles and how many
prefill steps held only long prompts while short ones waited. Works on older trees too (run it
with that tree's package first on PYTHONPATH).

  python scripts/sim_medha_trace.py --policy edf --qps 0.25 --requests 400 --out /tmp/edf.log
"""
import argparse
import collections
from dataclasses import replace
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.sim import instance as inst
from sglang_pd.sim.cluster import Cluster
try:
    from sglang_pd.sim.cluster_spec import ClusterSpec
except ImportError:
    from sglang_pd.sim.cluster import ClusterSpec
from sglang_pd.sim.profiles import build_cost
from sglang_pd.sim.workload import synthetic

ap = argparse.ArgumentParser()
ap.add_argument("--policy", default="edf")
ap.add_argument("--requests", type=int, default=150)
ap.add_argument("--qps", type=float, default=0.25)
ap.add_argument("--out", default=None)
ap.add_argument("--slo-tpot-ms", type=float, default=None)
a = ap.parse_args()
log = open(a.out, "w") if a.out else None
stats: collections.Counter[str] = collections.Counter()
orig = inst.Instance.start_step
def start_step(self, now):
    end, ab = orig(self, now)
    st = self.step
    if st is not None:
        mode = st.mode.name
        pre = [(r, n) for r, n in st.plan if not (mode != "EXTEND" and n == 1 and r.prefill_remaining == 0 and r in st.decode_reqs)] if mode != "DECODE" else []
        stats[mode] += 1
        stats[mode + "_s"] += self.step_s
        nlong = sum(1 for r, n in pre if r.track.source == "medha-swe")
        nshort = len(pre) - nlong
        stats["short_tok"] += sum(n for r, n in pre if r.track.source != "medha-swe")
        stats["long_tok"] += sum(n for r, n in pre if r.track.source == "medha-swe")
        if mode != "DECODE":
            stats["pf_steps_with_long"] += nlong > 0
            stats["pf_steps_long_only_shorts_waiting"] += (nlong > 0 and nshort == 0 and any(w.track.source != "medha-swe" for w in self.sched.waiting))
        if log:
            desc = " ".join(f"{'L' if r.track.source=='medha-swe' else 's'}{r.track.index}@{r.kv_len}+{n}" for r, n in pre)
            w = len(self.sched.waiting)
            ws = sum(1 for x in self.sched.waiting if x.track.source != "medha-swe")
            print(f"{now:10.3f} {mode:6s} {1e3*self.step_s:8.2f}ms run={len(self.sched.running)} wait={w}(s{ws}) | {desc}", file=log)
    return end, ab
inst.Instance.start_step = start_step  # type: ignore[method-assign]
cfg = PolicyConfig(slo_ttft_ms=2000.0, chunked_prefill_size=4096, max_prefill_tokens=8192, slo_tpot_ms=a.slo_tpot_ms)
wl = synthetic([("sharegpt-lengths", 0.95), ("medha-swe", 0.05)], a.requests, qps=a.qps, seed=5)
wl.arrivals = [replace(x, slo_ttft_s=60.0) if x.source == "medha-swe" else x for x in wl.arrivals]
res = Cluster(ClusterSpec(num_colocated=1, prefill_policy=a.policy, cfg=cfg), build_cost("llama-3-8b@h100x8")).run(wl)
short = sorted(t.first_token - t.arrival for t in res.tracks if t.source != "medha-swe" and t.first_token is not None)
lt = sorted(t.first_token - t.arrival for t in res.tracks if t.source == "medha-swe" and t.first_token is not None)
tp = sorted((t.finish - t.first_token) / max(t.output_len - 1, 1) for t in res.tracks if t.finish is not None and t.first_token is not None and t.output_len > 1)
def q(xs: list[float], p: float) -> float:
    return xs[min(int(p * len(xs)), len(xs) - 1)] if xs else float('nan')

print(f"{a.policy} qps {a.qps} n {a.requests}: short p50/p90 {q(short,.5):.2f}/{q(short,.9):.2f} s long p50/p90 {q(lt,.5):.1f}/{q(lt,.9):.1f} s "
      f"TPOT p50/p90 {1e3*q(tp,.5):.1f}/{1e3*q(tp,.9):.1f} ms | {dict(stats)}")
