"""The simulator's paper scenarios and its speed check (docs/simulator.md prints the figures).

    python scripts/sim_scenarios.py kairos [--out docs/sim] [--windows 3]
    python scripts/sim_scenarios.py medha
    python scripts/sim_scenarios.py pla
    python scripts/sim_scenarios.py speed  [--num-requests 100000]
    python scripts/sim_scenarios.py router [--router-parts mooncake,azure-conv,pla]

kairos: Mooncake conversation windows of 1000 requests (the paper's trace is private), prefix
hits modelled (per-prefill-instance cache over hash_ids, warm with the trace before the window),
the Kairos-calibrated MiniMax-M2.5 TP4 H200 instance, TTFT SLO 8 s, TPOT SLO 50 ms; QPS swept
across the knee for 1P+1D and 4P+4D; fcfs/continuous against kairos/slack, kairos+/slack+,
kairos+/continuous and the exact-cost reference kairos+/slack+@exact. Attainment is averaged
over the windows. Prints the table and the E2E gain at the knee; plots into OUT.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

from sglang_pd.bench.metrics import SloSpec
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.sim.cli import PolicyPair
from sglang_pd.sim.cluster import Cluster
from sglang_pd.sim.cluster_spec import ClusterSpec
from sglang_pd.sim.profiles import build_cost
from sglang_pd.sim.report import metrics, plot_policy_sweep
from sglang_pd.sim.workload import from_trace, synthetic

KAIROS_POLICIES = ("fcfs/continuous", "kairos/slack", "kairos+/slack+", "kairos+/continuous", "kairos+/slack+@exact")


def _avg(ms: list) -> object:
    """Mean of per-window overall attainments (a light stand-in with the fields the plots read)."""
    from types import SimpleNamespace

    def mean(f):
        vals = [f(m.overall) or 0.0 for m in ms]
        return sum(vals) / len(vals)

    o = SimpleNamespace(slo_attainment=mean(lambda o: o.slo_attainment), ttft_attainment=mean(lambda o: o.ttft_attainment),
                        tpot_attainment=mean(lambda o: o.tpot_attainment), goodput_rps=mean(lambda o: o.goodput_rps))
    return SimpleNamespace(overall=o)


def kairos(a: argparse.Namespace) -> None:
    slo = SloSpec(8000.0, 50.0)
    cfg = PolicyConfig(slo_ttft_ms=8000, slo_tpot_ms=50, chunked_prefill_size=16384, max_prefill_tokens=16384)
    clusters = {"1p1d": ((1, 1), a.qps_1p1d), "4p4d": ((4, 4), a.qps_4p4d)}
    for name, ((n_p, n_d), qps_list) in clusters.items():
        series: dict[str, list] = {p: [] for p in KAIROS_POLICIES}
        print(f"== Kairos scenario, {n_p}P+{n_d}D, Mooncake windows {a.first_window}..{a.first_window + a.windows - 1}")
        for qps in qps_list:
            wls = [from_trace("mooncake", window=1000, window_index=a.first_window + w, qps=qps) for w in range(a.windows)]
            for label in KAIROS_POLICIES:
                pair = PolicyPair.parse(label)
                spec = ClusterSpec(n_p, n_d, prefill_policy=pair.prefill, decode_policy=pair.decode, exact=pair.exact,
                                   cfg=cfg, prefix_cache_tokens=8_000_000, link_gb_s=100.0,
                                   router_prefill="round_robin", router_decode="round_robin")
                ms = []
                t0 = time.perf_counter()
                for wl in wls:
                    res = Cluster(spec, build_cost("minimax-m2.5@h200x4")).run(wl)
                    ms.append(metrics(res, slo)[1])
                m = _avg(ms)
                series[label].append(m)
                o = m.overall
                fails = sum(x.overall.failed for x in ms)
                print(f"qps {qps:5.2f} {label:<22} E2E {100 * o.slo_attainment:5.1f}%  TTFT {100 * o.ttft_attainment:5.1f}%  "
                      f"TPOT {100 * o.tpot_attainment:5.1f}%  failed {fails}  ({time.perf_counter() - t0:.1f} s)", flush=True)
        base = series["fcfs/continuous"]
        for label in KAIROS_POLICIES[1:]:
            gains = [(q, 100 * (m.overall.slo_attainment - b.overall.slo_attainment))
                     for q, m, b in zip(qps_list, series[label], base)]
            q_best, g_best = max(gains, key=lambda x: x[1])
            print(f"{name}: {label} vs fcfs/continuous, E2E gain: best {g_best:+.1f} points at qps {q_best:g}; all "
                  + ", ".join(f"{q:g}:{g:+.1f}" for q, g in gains))
        out = Path(a.out) / f"kairos_{name}"
        files = plot_policy_sweep(qps_list, series, out, f"Kairos scenario, Mooncake, MiniMax-M2.5 TP4 H200, {n_p}P+{n_d}D")
        print("wrote", *files)


def medha(a: argparse.Namespace) -> None:
    """Colocated Llama-3-8B (TP8 H100, so 800K-token prompts fit), ShareGPT + 5% Medha-SWE long;
    TTFT deadlines: 2 s for ShareGPT requests, 60 s for the long ones (Medha states none)."""
    slo_short_ms = 2000.0
    for mode in a.medha_colocated_decode:
        print(f"--colocated-decode {mode}", flush=True)
        cfg = PolicyConfig(slo_ttft_ms=slo_short_ms, chunked_prefill_size=4096, max_prefill_tokens=8192,
                           colocated_decode=mode)
        _medha_runs(a, cfg)


def _medha_runs(a: argparse.Namespace, cfg: PolicyConfig) -> None:
    for qps in a.qps_medha:
        wl = synthetic([("sharegpt-lengths", 0.95), ("medha-swe", 0.05)], a.medha_requests, qps=qps, seed=5)
        # deadlines (Medha states none): short 2 s; long ones 60 s (~3x a 393K prefill alone)
        wl.arrivals = [replace(x, slo_ttft_s=60.0) if x.source == "medha-swe" else x for x in wl.arrivals]
        for pol in a.medha_policies:
            spec = ClusterSpec(num_colocated=1, prefill_policy=pol, cfg=cfg)
            res = Cluster(spec, build_cost("llama-3-8b@h100x8")).run(wl)
            short = [t for t in res.tracks if t.source != "medha-swe" and t.first_token is not None]
            long = [t for t in res.tracks if t.source == "medha-swe"]
            ttft = sorted(t.first_token - t.arrival for t in short)
            done_long = [t for t in long if t.finish is not None and not t.error]
            lt = sorted(t.first_token - t.arrival for t in done_long)
            # decode TPOT per request (first token to last), over every finished request
            tpot = sorted((t.finish - t.first_token) / (t.output_len - 1) for t in res.tracks
                          if t.finish is not None and t.first_token is not None and t.output_len > 1 and not t.error)
            print(f"qps {qps:5.2f} {pol:<5} short TTFT p50 {ttft[len(ttft) // 2]:8.2f} s p90 {ttft[int(0.9 * len(ttft))]:8.2f} s"
                  f" | long done {len(done_long)}/{len(long)} TTFT p50 {lt[len(lt) // 2] if lt else float('nan'):8.1f} s"
                  f" p90 {lt[int(0.9 * len(lt))] if lt else float('nan'):8.1f} s"
                  f" | TPOT p50 {1e3 * tpot[len(tpot) // 2]:6.1f} ms p90 {1e3 * tpot[int(0.9 * len(tpot))]:6.1f} ms"
                  f" | {res.wall_s:.1f} s wall", flush=True)


def pla(a: argparse.Namespace) -> None:
    """PLA-like chat turns (``pla-chat``), TTFT SLO 0.4 s, closed loop at each concurrency,
    Llama-3-8B H100 PD. One prefill instance: single queue vs dual queues + AWD (fcfs inside);
    eight prefill instances: round_robin + single queues vs length_aware + dual queues on every
    instance, and with fixed roles (6 short, 2 long). Prints the TTFT SLO violation rate."""
    slo = SloSpec(400.0, None)
    setups = {
        "1P single": (1, ["both"], "single", "round_robin"),
        "1P dual+AWD": (1, ["both"], "dual", "round_robin"),
        "8P single rr": (8, ["both"] * 8, "single", "round_robin"),
        "8P dual length_aware": (8, ["both"] * 8, "dual", "length_aware"),
        "8P dual 6s/2l length_aware": (8, ["short"] * 6 + ["long"] * 2, "dual", "length_aware"),
    }
    for conc in a.pla_concurrency:
        for label, (n_p, roles, queues, router) in setups.items():
            c = conc * (n_p if n_p > 1 else 1)
            wl = synthetic([("pla-chat", 1.0)], a.pla_requests, concurrency=c, seed=11)
            cfg = PolicyConfig(slo_ttft_ms=400, prefill_queues=queues, short_prefill_threshold=256)
            spec = ClusterSpec(n_p, max(2, n_p // 2), prefill_roles=roles, cfg=cfg, router_prefill=router,
                               router_decode="round_robin")
            res = Cluster(spec, build_cost("llama-3-8b@h100")).run(wl)
            m = metrics(res, slo)[1].overall
            print(f"concurrency {c:4d} {label:<27} TTFT SLO violations {100 * (1 - (m.ttft_attainment or 0)):5.1f}%  "
                  f"TTFT p50/p90 {m.ttft.median:7.0f}/{m.ttft.p90:7.0f} ms  failed {m.failed}  ({res.wall_s:.1f} s wall)",
                  flush=True)


# router: per trace, the short/long threshold (prompt tokens) and the TTFT SLOs per class (s).
# Llama-3-8B H100 (analytic profile) prefills 8K tokens alone in 0.36 s, 1K in 0.05 s, 100K in 10.5 s.
ROUTER_TRACES = {
    # median prompt 6.9K, none under 512: 8192 makes 55% short; 1 s short = ~3x an 8K prefill
    # alone; 10 s long covers an isolated prefill up to ~97K tokens (> 99% of the trace)
    "mooncake": (8192, 1.0, 10.0),
    # median 1020: 1024 makes 51% short (20% of the tokens); 0.4 s short (PLA's SLO); long
    # prompts (<= 8K) alone take <= 0.36 s: 2 s
    "azure-conv": (1024, 0.4, 2.0),
}


def _router_setups(n_p: int, first_roles: list[str]) -> dict[str, tuple[list[str], str, str, bool]]:
    """label -> (prefill roles, prefill queues, prefill router, pool controller on)."""
    return {
        "power_of_two, single queue": (["both"] * n_p, "single", "power_of_two", False),
        "length_aware, dual, fixed roles": (first_roles, "dual", "length_aware", False),
        "length_aware, dual + controller": (first_roles, "dual", "length_aware", True),
    }


def _router_run(label: str, roles: list[str], queues: str, router: str, ctrl: bool, wl, n_p: int, n_d: int,
                threshold: int, slo_s: float, slo_long_s: float | None) -> None:
    from sglang_pd_router.controller import ControllerConfig
    from sglang_pd.sim.report import class_ttft

    cfg = PolicyConfig(slo_ttft_ms=slo_s * 1e3, prefill_queues=queues, short_prefill_threshold=threshold)
    controller = ControllerConfig(queue_ref_s_short=slo_s, queue_ref_s_long=slo_long_s or slo_s) if ctrl else None
    spec = ClusterSpec(n_p, n_d, prefill_roles=roles, cfg=cfg, router_prefill=router, router_decode="power_of_two",
                       slo_ttft_s_long=slo_long_s, pool_controller=controller)
    spec.routing.short_prefill_threshold = threshold
    res = Cluster(spec, build_cost("llama-3-8b@h100")).run(wl)
    by = class_ttft(res, slo_s)
    n = sum(v["n"] for v in by.values())
    viol = 100 * (1 - sum(v["attainment"] * v["n"] for v in by.values()) / n)
    parts = "  ".join(f"{c} {100 * (1 - v['attainment']):5.1f}% (p90 {v['ttft_p90_s']:6.2f} s)" for c, v in by.items())
    failed = sum(1 for t in res.tracks if t.error)
    moves = f"  moves {len(res.moves)}" if ctrl else ""
    print(f"  {label:<33} violations {viol:5.1f}%  {parts}  failed {failed}{moves}  ({res.wall_s:.1f} s wall)",
          flush=True)


def router(a: argparse.Namespace) -> None:
    """Issue 17's simulator bar: length_aware + the pool controller vs power_of_two, 4P+4D,
    Llama-3-8B H100, per-class TTFT SLOs, on Mooncake and Azure conversation windows (arrival
    times of the trace, rescaled to each QPS; no prefix cache); and PLA's 8-prefill case
    (pla-chat, closed loop, one TTFT SLO of 0.4 s for all, threshold 256 new tokens). Decode
    routing is power_of_two everywhere, so only the prefill side differs. Prints TTFT SLO
    violations overall and per class (each request against its class's SLO)."""
    parts = a.router_parts.split(",")
    for trace in ("mooncake", "azure-conv"):
        if trace not in parts:
            continue
        threshold, slo_s, slo_long_s = ROUTER_TRACES[trace]
        if trace == "azure-conv" and a.router_azure_threshold:
            threshold = a.router_azure_threshold
        qps_list = a.router_qps_mooncake if trace == "mooncake" else a.router_qps_azure
        print(f"== {trace}, 4P+4D, threshold {threshold} tokens, TTFT SLO short {slo_s:g} s / long {slo_long_s:g} s, "
              f"window {a.router_window_index} of {a.router_window} requests")
        for qps in qps_list:
            wl = from_trace(trace, window=a.router_window, window_index=a.router_window_index, qps=qps)
            print(f" qps {qps:g}")
            for label, (roles, queues, rt, ctrl) in _router_setups(4, ["short", "short", "long", "long"]).items():
                _router_run(label, roles, queues, rt, ctrl, wl, 4, 4, threshold, slo_s, slo_long_s)
    if "pla" in parts:
        print("== PLA: pla-chat, 8P+4D, TTFT SLO 0.4 s, threshold 256 new tokens, closed loop")
        setups = {"power_of_two, single queue": (["both"] * 8, "single", "power_of_two", False),
                  "length_aware, dual, no roles": (["both"] * 8, "dual", "length_aware", False),
                  "length_aware, dual 6s/2l + ctrl": (["short"] * 6 + ["long"] * 2, "dual", "length_aware", True),
                  "length_aware, dual 4s/4l + ctrl": (["short"] * 4 + ["long"] * 4, "dual", "length_aware", True)}
        for conc in a.router_pla_concurrency:
            wl = synthetic([("pla-chat", 1.0)], a.pla_requests, concurrency=conc, seed=11)
            print(f" concurrency {conc}")
            for label, (roles, queues, rt, ctrl) in setups.items():
                _router_run(label, roles, queues, rt, ctrl, wl, 8, 4, 256, 0.4, None)


def speed(a: argparse.Namespace) -> None:
    wl = synthetic([("sharegpt-lengths", 1.0)], a.num_requests, qps=a.qps, seed=1)
    spec = ClusterSpec(4, 4, cfg=PolicyConfig(slo_ttft_ms=2000, slo_tpot_ms=100))
    res = Cluster(spec, build_cost("llama-3-8b@h100")).run(wl)
    steps = sum(i.num_steps for i in res.instances)
    ok = sum(1 for t in res.tracks if not t.error)
    print(f"speed: {len(res.tracks)} requests ({ok} finished) through 4P+4D fcfs/continuous at {a.qps:g} req/s: "
          f"{res.sim_end_s:.0f} s simulated in {res.wall_s:.1f} s wall on one core ({res.num_events} events, {steps} steps)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenario", choices=("kairos", "medha", "pla", "speed", "router"))
    ap.add_argument("--out", default="docs/sim")
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--first-window", type=int, default=3)
    ap.add_argument("--qps-1p1d", type=lambda s: [float(x) for x in s.split(",")], default=[0.5, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5])
    ap.add_argument("--qps-4p4d", type=lambda s: [float(x) for x in s.split(",")], default=[2.0, 4.0, 5.0, 6.0, 7.0, 8.0, 10.0])
    ap.add_argument("--qps-medha", type=lambda s: [float(x) for x in s.split(",")], default=[0.25, 0.5])
    ap.add_argument("--medha-requests", type=int, default=400)
    ap.add_argument("--medha-policies", type=lambda s: s.split(","), default=["fcfs", "edf", "lrs", "lars"])
    ap.add_argument("--medha-colocated-decode", type=lambda s: s.split(","), default=["interleave"],
                    help="interleave,prefill-first: also run the old decode treatment (decodes starve)")
    ap.add_argument("--pla-concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[8, 16, 32, 64])
    ap.add_argument("--pla-requests", type=int, default=3000)
    floats = lambda s: [float(x) for x in s.split(",")]  # noqa: E731
    ap.add_argument("--router-parts", default="mooncake,azure-conv,pla")
    ap.add_argument("--router-window", type=int, default=2000, help="trace requests per run")
    ap.add_argument("--router-window-index", type=int, default=1)
    ap.add_argument("--router-azure-threshold", type=int, help="override azure-conv's 1024 (tokens)")
    ap.add_argument("--router-qps-mooncake", type=floats, default=[2.0, 3.0, 3.5, 4.0])
    ap.add_argument("--router-qps-azure", type=floats, default=[60.0, 70.0, 80.0, 90.0])
    ap.add_argument("--router-pla-concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[256, 512, 1024])
    ap.add_argument("--num-requests", type=int, default=100_000)
    ap.add_argument("--qps", type=float, default=30.0)
    a = ap.parse_args()
    {"kairos": kairos, "medha": medha, "pla": pla, "speed": speed, "router": router}[a.scenario](a)


if __name__ == "__main__":
    main()
