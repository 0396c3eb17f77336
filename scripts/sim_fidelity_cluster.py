#!/usr/bin/env python3
"""Simulator fidelity for the PD cluster, per length class (issue 34 item 4).

    python scripts/bench_cluster_fidelity.py --out /tmp/fid        # the whole bar: runs this last
    python scripts/sim_fidelity_cluster.py --calibrate-from /tmp/fid/seed0 \
        --bench-dir /tmp/fid/seed1 /tmp/fid/seed2 /tmp/fid/seed3 --profile /tmp/fid/profile.json [--cores 2]

``sim_fidelity.py`` checks one colocated instance; this checks a whole cluster behind our router:
for each ``bench_cluster`` setup run with our router, the simulator replays the same requests
(bench_serving's per-request send times, prompt and output lengths from ``--output-details``)
through the same shape (prefill roles, prefill and decode policies, dual queues, routing policy,
chunk size, page size, per-class TTFT SLOs and the TPOT SLO, all read from bench_cluster's own
setup table), with a cost profile measured on this machine's engine (``--make-profile`` runs the
profiler, as sim_fidelity.py does). ``--calibrate-from`` fits, on other runs of the same
cluster (several: each fitted, the fits averaged; ``--leave-one-out``: each run predicted from
the fits of the others), per-instance step factors and a TTFT overhead
(sglang_pd/sim/calibration.py: three engines share the cores the profile had to itself) and
prints the fit run's per-term diagnosis;
it refuses to predict the run it was fitted on. Per predicted run it prints, per class (short /
long at bench_cluster's threshold), the engine's and the simulator's TTFT p50/p90, TPOT p50/p90
and TTFT attainment with each percentile's relative error, and the machine's drift from the fit
run; then, over the runs, the bar's table (per class: mean |error| <= 5%, none above 10%).

What the simulator does not model (so what a gap can come from): the frontends and router
(tokenizing, HTTP, the router's /get_load polling delay: the simulated router sees its exact
counts), the bootstrap handshake, and the KV transfer's real speed (``--link-gb-s``; loopback
UCX here). SGLang's router (``sglang-*`` setups) is not ours: those setups are skipped.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from bench_cluster_setups import TIME_BUDGET_MS, cluster_setups  # a sibling script (scripts/ is on the path)
from sglang_pd.bench.metrics import SloSpec
from sglang_pd.bench.report import summary_fields
from sglang_pd.bench.ttft_stages import compare_table, from_tracks, join, read_lines
from sglang_pd.sim.calibration import (
    Calibration,
    apply,
    fit_factors,
    measured_busy,
    median_tpot_s,
    ttft_overhead,
)
from sglang_pd.sim.cli import add_common, cluster_spec, cost_of
from sglang_pd.sim.cluster import Cluster
from sglang_pd.sim.cluster_spec import SimResult
from sglang_pd.sim.report import metrics
from sglang_pd.sim.workload import Arrival, Workload

# prefill server flags that the simulator's CLI takes under the same name and meaning
_SAME_PREFILL = ("--prefill-policy", "--prefill-queues", "--prefill-time-budget-ms")
# SmolLM2-135M: 30 layers x 3 KV heads x 64 dims x (K, V) x 4 bytes (float32 on CPU)
SMOLLM2_KV_BYTES_PER_TOKEN = 30 * 3 * 64 * 2 * 4


def _flag_pairs(flags: tuple[str, ...]) -> dict[str, str]:
    return {flags[i]: flags[i + 1] for i in range(len(flags) - 1) if flags[i].startswith("--")}


def sim_argv(setup_name: str, cfg: dict, a: argparse.Namespace) -> list[str] | None:
    """The simulator's flags for one bench_cluster setup (None: not expressible)."""
    s = cluster_setups(cfg.get("edf_concurrency", 4), cfg.get("prefills", 2),
                       cfg.get("time_budget_ms", TIME_BUDGET_MS))[setup_name]
    if s.router != "ours":
        return None
    prefill = [_flag_pairs(f) for f in s.prefill]
    argv = ["--prefill", str(len(prefill)), "--decode", "1",
            "--prefill-role", ",".join(p.get("--prefill-role", "both") for p in prefill)]
    for flag, value in ((f, prefill[0].get(f)) for f in _SAME_PREFILL):  # every prefill alike
        if value:
            argv += [flag, value]
    decode = _flag_pairs(s.decode)
    argv += ["--decode-policy", decode.get("--decode-policy", "continuous")]
    if "--decode-reserve-quantile" in decode:  # (a PolicyConfig flag: the simulator takes it as is)
        argv += ["--decode-reserve-quantile", decode["--decode-reserve-quantile"]]
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


def replay(argv: list[str], rec: dict, cal: Calibration | None = None) -> tuple[SimResult, list[int]]:
    """The simulator's run of the engine run ``rec``'s requests (bench_serving's details), each
    instance's steps scaled by ``cal``; also, per simulated track, the index of its request in
    ``rec`` (tracks follow send times)."""
    p = argparse.ArgumentParser()
    add_common(p)
    sa = p.parse_args(argv)
    t0 = min(rec["start_times"])
    order = sorted(range(len(rec["start_times"])), key=lambda k: rec["start_times"][k])
    arrivals = [Arrival(rec["start_times"][k] - t0, rec["input_lens"][k], max(rec["output_lens"][k], 1))
                for k in order]
    cluster = Cluster(cluster_spec(sa), cost_of(sa))
    res = apply(cluster, cal).run(Workload(arrivals)) if cal else cluster.run(Workload(arrivals))
    if cal and cal.ttft_overhead_s:  # paid before the request reaches an engine: its whole timeline shifts
        for t in res.tracks:
            t.first_token = None if t.first_token is None else t.first_token + cal.ttft_overhead_s
            t.finish = None if t.finish is None else t.finish + cal.ttft_overhead_s
    return res, [order[t.index] for t in res.tracks]


def by_class(res: SimResult, slo: SloSpec) -> dict:
    _, m = metrics(res, slo, slo.long_threshold)
    return {c: summary_fields(v) for c, v in m.by_class.items()}


def simulate(argv: list[str], rec: dict, slo: SloSpec, cal: Calibration | None = None) -> dict:
    """The simulator's per-class summary of the engine run ``rec`` (bench_serving's details)."""
    return by_class(replay(argv, rec, cal)[0], slo)


def run_tpots(rec: dict) -> list[float]:
    """TPOT (s) of the completed requests of 2+ tokens in bench_serving's details."""
    return [(e - t) / (o - 1) for e, t, o in zip(rec.get("e2e_latencies", []), rec["ttfts"], rec["output_lens"])
            if o > 1 and t and t > 0 and e > t]


def calibrate(argv: list[str], rec: dict, steps: dict, source: str = "", cores: float | None = None,
              decode_from: str = "steps", shared: str = "all") -> Calibration:
    """Step factors and the TTFT overhead from one engine run (sglang_pd/sim/calibration.py);
    ``cores``: the instances (``shared``: all, or the prefill ones) share that many cores (None:
    each has its own); ``decode_from``:
    the decode factor matches the run's median TPOT ("tpot") or its engine's step seconds ("steps")."""
    tpots = run_tpots(rec)
    cal, res = fit_factors(lambda c: replay(argv, rec, c)[0], measured_busy(steps), cores=cores, shared=shared,
                           tpot_s=statistics.median(tpots) if tpots and decode_from == "tpot" else None)
    res, idx = replay(argv, rec, cal)
    real = [rec["ttfts"][k] if rec["ttfts"][k] and rec["ttfts"][k] > 0 else None for k in idx]
    sim = [None if t.first_token is None else t.first_token - t.arrival for t in res.tracks]
    cal.ttft_overhead_s = ttft_overhead(real, sim)
    cal.source = source
    return cal


ROWS = (("TTFT p50", "median_ttft_ms"), ("TTFT p90", "p90_ttft_ms"), ("TPOT p50", "median_tpot_ms"),
        ("TPOT p90", "p90_tpot_ms"))
CLASSES = ("short", "long")
BAR_MEAN_PCT, BAR_MAX_PCT = 5.0, 10.0  # issue 34 item 4, per class


def compare(real: dict, sim: dict) -> tuple[list[str], dict[tuple[str, str], float]]:
    """Table rows (markdown) and the signed relative error (%) of each class's percentiles."""
    lines, errors = [], {}
    for cls in CLASSES:
        r, s = real.get(cls) or {}, sim.get(cls) or {}
        for label, key in ROWS:
            rv, sv = r.get(key), s.get(key)
            if not rv or sv is None:
                continue
            err = 100 * (sv - rv) / rv
            errors[(cls, label)] = err
            lines.append(f"| {cls} | {label} (ms) | {rv:.0f} | {sv:.0f} | {err:+.1f}% |")
        ra, sa = r.get("ttft_attainment"), s.get("ttft_attainment")
        if ra is not None and sa is not None:
            lines.append(f"| {cls} | TTFT attainment (%) | {100 * ra:.1f} | {100 * sa:.1f} | "
                         f"{100 * (sa - ra):+.1f} pts |")
    return lines, errors


def fidelity_table(runs: list[dict[tuple[str, str], float]]) -> tuple[str, dict[str, bool]]:
    """Over the predicted runs (each ``compare``'s errors): per class and metric each run's error
    and the mean |error|; per class the mean and max |error| over its metrics and runs against
    the bar (mean <= 5%, none above 10%). Returns the markdown and, per class, the bar met."""
    lines = ["| class | metric | " + " | ".join(f"run {i + 1}" for i in range(len(runs))) + " | mean abs |",
             "|---|---|" + "---|" * (len(runs) + 1)]
    met: dict[str, bool] = {}
    for cls in CLASSES:
        every: list[float] = []
        for label, _ in ROWS:
            errs = [r.get((cls, label)) for r in runs]
            known = [abs(e) for e in errs if e is not None]
            if not known:
                continue
            every += known
            cells = " | ".join("-" if e is None else f"{e:+.1f}%" for e in errs)
            lines.append(f"| {cls} | {label} | {cells} | {sum(known) / len(known):.1f}% |")
        if every:
            mean, worst = sum(every) / len(every), max(every)
            met[cls] = mean <= BAR_MEAN_PCT and worst <= BAR_MAX_PCT
            lines.append(f"| **{cls}** | **all** | {len(every)} errors: mean abs {mean:.1f}%, max {worst:.1f}% "
                         + "| " * max(len(runs) - 1, 0) + f"| {'met' if met[cls] else 'NOT met'} |")
    return "\n".join(lines), met


def run_dirs(bench: Path) -> list[Path]:
    """The runs of one bench_cluster invocation: its ``roundK`` dirs (``--rounds``: the same
    requests at the same times, K = 1..N), else the dir itself."""
    rounds = sorted(bench.glob("round[0-9]*"), key=lambda d: int(d.name[5:]))
    return rounds or [bench]


def mean_by_class(summaries: list[dict]) -> dict:
    """Per class, each figure's mean over runs of the same requests (``by_class`` summaries):
    what one run's percentile strays around (docs/bench_cluster.md, "the engine against itself")."""
    out: dict[str, dict[str, float]] = {}
    for cls in CLASSES:
        for key in [k for _, k in ROWS] + ["ttft_attainment"]:
            vals = [s[cls][key] for s in summaries if (s.get(cls) or {}).get(key) is not None]
            if vals:
                out.setdefault(cls, {})[key] = sum(vals) / len(vals)
    return out


def load_run(bench: Path, name: str) -> dict | None:
    """bench_serving's record of ``name`` in a bench_cluster log dir (None: missing or no details)."""
    path = bench / f"{name}.jsonl"
    if not path.exists():
        return None
    rec = json.loads(path.read_text().splitlines()[-1])
    return rec if "start_times" in rec else None


def make_profile(a: argparse.Namespace, cfg: dict, bench: Path) -> None:
    """The profiler on this machine's engine (minutes), over the lengths bench_cluster sends."""
    model = a.model_path or str(bench / "smollm2-135m")
    subprocess.run([sys.executable, "-m", "sglang_pd.tools.profile_cost_model", "--model-path", model,
                    "--load-format", "dummy", "--out", a.profile, "--page-size", "16",
                    "--prefill-new-tokens", "16,32,64,128,256,512",
                    "--prefill-context-tokens", f"0,512,1536,{cfg['max_input_len']}",
                    "--prefill-batch-sizes", "1,2,4", "--prefill-batch-new-tokens", "64,256,512",
                    "--decode-batch-sizes", "1,2,4,8,16", "--decode-context-tokens", "128,512,2048,4096",
                    "--repeats", str(a.profile_repeats), "--notes", "scripts/sim_fidelity_cluster.py"],
                   check=True)


def diagnose(flags: list[str], rec: dict, cal: Calibration, slo: SloSpec) -> str:
    """Where the uncalibrated error comes from, on the fit run itself (in-sample, so a
    diagnosis, never the check): the profile alone, + the step factors (each engine's steps
    slowed by its neighbours on shared cores, and the queueing that follows), + the TTFT
    overhead (what no engine step holds). Signed errors per class and percentile."""
    real = rec.get("by_class") or {}
    stages = (("profile alone", None), ("+ step factors" + (f" on {cal.cores:g} shared cores" if cal.cores else ""),
                                         Calibration(cal.step_factor, cores=cal.cores, shared=cal.shared)),
              ("+ TTFT overhead", cal))
    errs = [compare(real, simulate(flags, rec, slo, c))[1] for _, c in stages]
    keys = [(c, label) for c in CLASSES for label, _ in ROWS if all((c, label) in e for e in errs)]
    lines = ["| fit run (in-sample) | " + " | ".join(f"{c} {lb}" for c, lb in keys) + " |",
             "|---|" + "---|" * len(keys)]
    lines += [f"| {name} | " + " | ".join(f"{e[k]:+.1f}%" for k in keys) + " |" for (name, _), e in zip(stages, errs)]
    return "\n".join(lines)


def drift(res: SimResult, rec: dict, steps: dict) -> str:
    """How far this run's machine was from the calibration run's: each engine's step seconds
    (the decode: the median TPOT) over the calibrated simulator's for the same requests. Read,
    never fitted: 1.00 everywhere is a machine as fast as at calibration; a run whose engines
    were 20% slower than at calibration cannot be predicted within 5% by any calibration."""
    busy, sim = measured_busy(steps), {i.name: i.busy_s for i in res.instances}
    ratio = {n: busy[n] / sim[n] for n in busy if n.startswith("p") and sim.get(n)}
    tpots = run_tpots(rec)
    sim_tpot = median_tpot_s(res)
    if tpots and sim_tpot:
        ratio["d0 (TPOT p50)"] = statistics.median(tpots) / sim_tpot
    return ("drift vs the calibration run (engine / calibrated simulator): "
            + ", ".join(f"{n} x{r:.2f}" for n, r in ratio.items()))


def fit_on(srcs: list[Path], name: str, a: argparse.Namespace) -> tuple[Calibration, str]:
    """Setup ``name``'s calibration fitted on the bench_cluster runs in ``srcs`` (every round of
    every dir fitted, the fits averaged: ``Calibration.mean``) and what to print of it: the
    factors, per run where there are several, and the in-sample diagnosis on the first run."""
    fits, lines, first = [], [], None
    for src in srcs:
        cfg = _config(src)
        for d in run_dirs(src):
            flags, rec, steps = sim_argv(name, cfg, a), load_run(d, name), d / f"{name}_steps.json"
            if flags is None or rec is None or not steps.exists():
                sys.exit(f"{d}: no {name} run with per-request details and {steps.name} to calibrate on")
            fits.append(calibrate(flags, rec, json.loads(steps.read_text()), f"{d}/{name}", a.cores, a.decode_from,
                                  a.shared))
            first = first or (flags, rec, _slo(cfg))
            lines.append(f"  {d}: " + ", ".join(f"{k} x{v:.2f}" for k, v in fits[-1].step_factor.items())
                         + f", TTFT overhead {1e3 * fits[-1].ttft_overhead_s:.0f} ms")
    where = ", ".join(map(str, srcs)) + (f", mean of {len(fits)} runs" if len(fits) > 1 else "")
    cal = fits[0] if len(fits) == 1 else Calibration.mean(fits, f"{where} ({name})")
    assert first is not None
    flags0, rec0, slo0 = first
    head = (f"calibration ({name}, fitted on {where}): step factors "
            + ", ".join(f"{k} x{v:.2f}" for k, v in cal.step_factor.items())
            + f"; TTFT overhead {1e3 * cal.ttft_overhead_s:.0f} ms")
    return cal, "\n".join([head, *(lines if len(fits) > 1 else []), diagnose(flags0, rec0, cal, slo0)])


def _slo(cfg: dict) -> SloSpec:
    return SloSpec(cfg["slo_ttft_short_ms"], cfg["slo_tpot_ms"], cfg["slo_ttft_long_ms"], cfg["short_threshold"] + 1)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench-dir", required=True, nargs="+", help="bench_cluster --log-dir(s) of the runs to predict")
    ap.add_argument("--calibrate-from", default=None, nargs="+",
                    help="bench_cluster --log-dir(s) of other runs of the same cluster: fit the step factors and "
                         "TTFT overhead there (sglang_pd/sim/calibration.py; several runs or rounds: the fits "
                         "averaged), predict the --bench-dir runs")
    ap.add_argument("--leave-one-out", action="store_true",
                    help="instead of --calibrate-from: each --bench-dir run predicted with the fits of all the "
                         "others averaged (every run predicted, none by its own fit)")
    ap.add_argument("--calibration", default=None,
                    help="JSON of a fitted calibration: written with --calibrate-from, else read")
    ap.add_argument("--setups", default="ours")
    ap.add_argument("--decode-from", choices=("tpot", "steps"), default="steps",
                    help="with --calibrate-from: the decode factor matches the fit run's median TPOT (its loop's "
                         "work between steps included) or its engine's step seconds only")
    ap.add_argument("--cores", type=float, default=None,
                    help="with --calibrate-from: the simulated instances share this many cores (processor "
                         "sharing, sglang_pd/sim/calibration.py); default: each its own, the factors hold it all")
    ap.add_argument("--shared", choices=("all", "prefill"), default="all",
                    help="with --cores: who shares them: every instance, or only the prefill ones (bench_cluster's "
                         "pinned layout: prefill engines on one core, decode on the other)")
    ap.add_argument("--profile", required=True, help="cost profile JSON measured on this machine's engine")
    ap.add_argument("--make-profile", action="store_true", help="measure it first (the profiler, minutes)")
    ap.add_argument("--model-path", default=None, help="for --make-profile (default: BENCH_DIR/smollm2-135m)")
    ap.add_argument("--profile-repeats", type=int, default=3)
    ap.add_argument("--kv-capacity-tokens", type=int, default=262144)
    ap.add_argument("--kv-bytes-per-token", type=float, default=SMOLLM2_KV_BYTES_PER_TOKEN)
    ap.add_argument("--link-gb-s", type=float, default=2.0, help="loopback UCX, roughly")
    ap.add_argument("--link-latency-ms", type=float, default=1.0)
    return ap


def _config(bench: Path) -> dict:
    return json.loads((bench / "bench_cluster.json").read_text())["config"]


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    benches = [Path(d) for d in a.bench_dir]
    srcs = [Path(d) for d in a.calibrate_from or []]
    if {s.resolve() for s in srcs} & {b.resolve() for b in benches}:
        sys.exit("--calibrate-from must be other runs than the --bench-dir ones: never fit and test on one run")
    if a.make_profile:
        make_profile(a, _config(benches[0]), benches[0])
    names = [n.strip() for n in a.setups.split(",") if n.strip()]
    cals: dict[str, Calibration] = {}
    if srcs:
        for name in names:
            cals[name], report = fit_on(srcs, name, a)
            print(report)
        if a.calibration:
            Path(a.calibration).write_text(json.dumps({n: c.to_json() for n, c in cals.items()}, indent=1) + "\n")
    elif a.calibration:
        cals = {n: Calibration.from_json(d) for n, d in json.loads(Path(a.calibration).read_text()).items()}
    own: dict[Path, dict[str, Calibration]] = {}
    if a.leave_one_out:  # each dir's own fit (its rounds averaged), then each predicted from the others'
        if len(benches) < 2 or srcs:
            sys.exit("--leave-one-out needs 2+ --bench-dir runs and no --calibrate-from")
        for bench in benches:
            own[bench] = {}
            for name in names:
                own[bench][name], report = fit_on([bench], name, a)
                print(report.splitlines()[0])
    errors: dict[str, list[dict[tuple[str, str], float]]] = {n: [] for n in names}
    for bench in benches:
        if own:
            cals = {n: Calibration.mean([own[o][n] for o in benches if o != bench], f"the {len(benches) - 1} other "
                                        "run(s) (leave one out)") for n in names}
        cfg = _config(bench)
        slo = _slo(cfg)
        print(f"\n{bench} (seed {cfg['seed']}, trace from request {cfg.get('trace_skip', 0)})\n"
              "| class | metric | engine | simulator | error |\n|---|---|---|---|---|")
        dirs = run_dirs(bench)
        stage_tables: list[str] = []
        for name in names:
            flags, recs = sim_argv(name, cfg, a), [load_run(d, name) for d in dirs]
            if flags is None or None in recs:
                why = "not expressible in the simulator" if flags is None else "no run with per-request details"
                print(f"| {name} | skipped ({why}) | | | |")
                continue
            cal = cals.get(name)
            sims = [replay(flags, rec, cal)[0] for rec in recs if rec]
            # several rounds: the engine's mean against the simulator's (its replays differ only by send jitter)
            real = mean_by_class([rec.get("by_class") or {} for rec in recs if rec])
            lines, errs = compare(real, mean_by_class([by_class(res, slo) for res in sims]))
            errors[name].append(errs)
            n = sum(r["num_requests"] for r in (recs[0] or {}).get("by_class", {}).values())
            print(f"| **{name}** | {n} requests" + (f", mean of {len(dirs)} rounds" if len(dirs) > 1 else "")
                  + " | | | |")
            print("\n".join(lines))
            # bench_cluster --request-log: the TTFT split per stage, engine beside simulator
            engine_tl = join(read_lines([p for d in dirs for p in sorted(d.glob(f"{name}_*.log"))]),
                             int(cfg.get("short_threshold", 256)))
            if engine_tl:
                shift = cal.ttft_overhead_s if cal else 0.0
                stage_tables.append(f"\n{name}: TTFT by stage, {len(engine_tl)} engine requests over "
                                    f"{len(dirs)} run(s)\n" + compare_table(
                                        engine_tl, [t for res in sims for t in from_tracks(res.tracks, shift)]))
            for d, res, rec in zip(dirs, sims, recs):
                if cal and rec and (d / f"{name}_steps.json").exists():
                    print(("" if len(dirs) == 1 else f"{d.name}: ")
                          + drift(res, rec, json.loads((d / f"{name}_steps.json").read_text())))
        print("\n".join(stage_tables))
    for name, runs in errors.items():
        if runs:
            md, met = fidelity_table(runs)
            how = f"calibrated on {cals[name].source}" if name in cals else "uncalibrated (profile alone)"
            print(f"\n{name}: {len(runs)} predicted run(s), {how}\n{md}\nbar (per class: mean abs <= "
                  f"{BAR_MEAN_PCT:.0f}%, none above {BAR_MAX_PCT:.0f}%): "
                  + ", ".join(f"{c} {'met' if ok else 'NOT met'}" for c, ok in met.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
