#!/usr/bin/env python3
"""Simulator fidelity for the PD cluster, per length class (issue 34 item 4).

    python scripts/bench_cluster.py --setups ours --log-dir /tmp/bc ...   # the engine's side
    python scripts/sim_fidelity_cluster.py --bench-dir /tmp/bc --profile /tmp/cpu_profile.json \
        [--make-profile] [--setups ours]

``sim_fidelity.py`` checks one colocated instance; this checks a whole cluster behind our router:
for each ``bench_cluster`` setup run with our router, the simulator replays the same requests
(bench_serving's per-request send times, prompt and output lengths from ``--output-details``)
through the same shape (prefill roles, prefill and decode policies, dual queues, routing policy,
chunk size, page size, per-class TTFT SLOs and the TPOT SLO, all read from bench_cluster's own
setup table), with a cost profile measured on this machine's engine (``--make-profile`` runs the
profiler, as sim_fidelity.py does). It prints, per class (short / long at bench_cluster's
threshold), the engine's and the simulator's TTFT p50/p90, TPOT p50/p90 and TTFT attainment,
with the relative error of each percentile and the attainment gap in points. The issue's bar
(mean absolute error <= 5%, none above 10%, over three seeds on a quiet machine) needs
bench_cluster run three times with ``--seed``; each run is one ``--bench-dir``.

What the simulator does not model (so what a gap can come from): the frontends and router
(tokenizing, HTTP, the router's /get_load polling delay: the simulated router sees its exact
counts), the bootstrap handshake, and the KV transfer's real speed (``--link-gb-s``; loopback
UCX here). SGLang's router (``sglang-*`` setups) is not ours: those setups are skipped.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench_cluster import _setups  # a sibling script (scripts/ is on the path)
from sglang_pd.bench.metrics import SloSpec
from sglang_pd.sim.cli import add_common, cluster_spec, cost_of
from sglang_pd.sim.cluster import Cluster
from sglang_pd.sim.report import metrics
from sglang_pd.sim.workload import Arrival, Workload

# prefill server flags that the simulator's CLI takes under the same name and meaning
_SAME_PREFILL = ("--prefill-policy", "--prefill-queues")
# SmolLM2-135M: 30 layers x 3 KV heads x 64 dims x (K, V) x 4 bytes (float32 on CPU)
SMOLLM2_KV_BYTES_PER_TOKEN = 30 * 3 * 64 * 2 * 4


def _flag_pairs(flags: tuple[str, ...]) -> dict[str, str]:
    return {flags[i]: flags[i + 1] for i in range(len(flags) - 1) if flags[i].startswith("--")}


def sim_argv(setup_name: str, cfg: dict, a: argparse.Namespace) -> list[str] | None:
    """The simulator's flags for one bench_cluster setup (None: not expressible)."""
    s = _setups(cfg.get("edf_concurrency", 4))[setup_name]
    if s.router != "ours":
        return None
    prefill = [_flag_pairs(f) for f in s.prefill]
    argv = ["--prefill", str(len(prefill)), "--decode", "1",
            "--prefill-role", ",".join(p.get("--prefill-role", "both") for p in prefill)]
    for flag, value in ((f, prefill[0].get(f)) for f in _SAME_PREFILL):  # every prefill alike
        if value:
            argv += [flag, value]
    argv += ["--decode-policy", _flag_pairs(s.decode).get("--decode-policy", "continuous")]
    router = _flag_pairs(s.router_flags)
    argv += ["--router-prefill", router.get("--prefill-policy", "length_aware"),
             "--router-decode", router.get("--decode-policy", "power_of_two"),
             "--pool-controller", router.get("--pool-controller", "on")]
    if "--queue-order" in router or "--conditional-disagg" in router:
        return None  # the simulated router has no pending queue nor local prefills
    argv += ["--page-size", "16", "--chunked-prefill-size", str(cfg["chunk"]),
             "--short-prefill-threshold", str(cfg["short_threshold"]),
             "--slo-ttft-ms", str(cfg["slo_ttft_short_ms"]), "--slo-ttft-ms-long", str(cfg["slo_ttft_long_ms"]),
             "--slo-tpot-ms", str(cfg["slo_tpot_ms"]), "--profile", a.profile, "--seed", str(cfg["seed"]),
             "--kv-capacity-tokens", str(a.kv_capacity_tokens), "--kv-bytes-per-token", str(a.kv_bytes_per_token),
             "--link-gb-s", str(a.link_gb_s), "--link-latency-ms", str(a.link_latency_ms), "--no-progress"]
    return argv


def simulate(argv: list[str], rec: dict, slo: SloSpec) -> dict:
    """The simulator's per-class summary of the engine run ``rec`` (bench_serving's details)."""
    p = argparse.ArgumentParser()
    add_common(p)
    sa = p.parse_args(argv)
    t0 = min(rec["start_times"])
    arrivals = sorted((Arrival(s - t0, i, max(o, 1)) for s, i, o in
                       zip(rec["start_times"], rec["input_lens"], rec["output_lens"])), key=lambda x: x.arrival_s)
    res = Cluster(cluster_spec(sa), cost_of(sa)).run(Workload(arrivals))
    _, m = metrics(res, slo, slo.long_threshold)
    from sglang_pd.bench.report import summary_fields

    return {c: summary_fields(v) for c, v in m.by_class.items()}


ROWS = (("TTFT p50", "median_ttft_ms"), ("TTFT p90", "p90_ttft_ms"), ("TPOT p50", "median_tpot_ms"),
        ("TPOT p90", "p90_tpot_ms"))


def compare(real: dict, sim: dict) -> tuple[list[str], list[float]]:
    """Table rows (markdown) and the relative errors (%) of the percentiles."""
    lines, errors = [], []
    for cls in ("short", "long"):
        r, s = real.get(cls) or {}, sim.get(cls) or {}
        for label, key in ROWS:
            rv, sv = r.get(key), s.get(key)
            if not rv or sv is None:
                continue
            err = 100 * (sv - rv) / rv
            errors.append(abs(err))
            lines.append(f"| {cls} | {label} (ms) | {rv:.0f} | {sv:.0f} | {err:+.1f}% |")
        ra, sa = r.get("ttft_attainment"), s.get("ttft_attainment")
        if ra is not None and sa is not None:
            lines.append(f"| {cls} | TTFT attainment (%) | {100 * ra:.1f} | {100 * sa:.1f} | "
                         f"{100 * (sa - ra):+.1f} pts |")
    return lines, errors


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench-dir", required=True, help="bench_cluster's --log-dir (SETUP.jsonl with details)")
    ap.add_argument("--config", default=None, help="bench_cluster.json (default: BENCH_DIR/bench_cluster.json)")
    ap.add_argument("--setups", default="ours")
    ap.add_argument("--profile", required=True, help="cost profile JSON measured on this machine's engine")
    ap.add_argument("--make-profile", action="store_true", help="measure it first (the profiler, minutes)")
    ap.add_argument("--model-path", default=None, help="for --make-profile (default: BENCH_DIR/smollm2-135m)")
    ap.add_argument("--profile-repeats", type=int, default=3)
    ap.add_argument("--kv-capacity-tokens", type=int, default=262144)
    ap.add_argument("--kv-bytes-per-token", type=float, default=SMOLLM2_KV_BYTES_PER_TOKEN)
    ap.add_argument("--link-gb-s", type=float, default=2.0, help="loopback UCX, roughly")
    ap.add_argument("--link-latency-ms", type=float, default=1.0)
    a = ap.parse_args(argv)
    bench = Path(a.bench_dir)
    cfg = json.loads(Path(a.config or bench / "bench_cluster.json").read_text())["config"]
    if a.make_profile:
        import subprocess

        model = a.model_path or str(bench / "smollm2-135m")
        subprocess.run([sys.executable, "-m", "sglang_pd.tools.profile_cost_model", "--model-path", model,
                        "--load-format", "dummy", "--out", a.profile, "--page-size", "16",
                        "--prefill-new-tokens", "16,32,64,128,256,512",
                        "--prefill-context-tokens", f"0,512,1536,{cfg['max_input_len']}",
                        "--prefill-batch-sizes", "1,2,4", "--prefill-batch-new-tokens", "64,256,512",
                        "--decode-batch-sizes", "1,2,4,8,16", "--decode-context-tokens", "128,512,2048,4096",
                        "--repeats", str(a.profile_repeats), "--notes", "scripts/sim_fidelity_cluster.py"],
                       check=True)
    slo = SloSpec(cfg["slo_ttft_short_ms"], cfg["slo_tpot_ms"], cfg["slo_ttft_long_ms"], cfg["short_threshold"] + 1)
    all_errors: list[float] = []
    print("| class | metric | engine | simulator | error |\n|---|---|---|---|---|")
    for name in [n.strip() for n in a.setups.split(",") if n.strip()]:
        flags = sim_argv(name, cfg, a)
        path = bench / f"{name}.jsonl"
        if flags is None or not path.exists():
            print(f"| {name} | skipped ({'not our router' if flags is None else 'no ' + path.name}) | | | |")
            continue
        rec = json.loads(path.read_text().splitlines()[-1])
        if "start_times" not in rec:
            print(f"| {name} | skipped (run bench_cluster with per-request details) | | | |")
            continue
        real = rec.get("by_class") or {}
        lines, errors = compare(real, simulate(flags, rec, slo))
        all_errors += errors
        print(f"| **{name}** | {sum(r['num_requests'] for r in real.values())} requests | | | |")
        print("\n".join(lines))
    if all_errors:
        mean = sum(all_errors) / len(all_errors)
        print(f"\npercentile errors: mean |error| {mean:.1f}%, max {max(all_errors):.1f}% "
              f"(bar: mean <= 5%, none above 10%, over three seeds on a quiet machine)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
