#!/usr/bin/env python3
"""Prefill policies on the real CPU engine (issue 20's last bar): one colocated server per
policy, the same Poisson length-mix workload against each, short/long TTFT and SLO attainment.

  python scripts/bench_prefill_policies.py --out docs/bench [--policies fcfs,kairos+,dual]
      [--rate 0.7] [--slo-ttft-ms 3000] [--num-prompts 50] [--length-mix 64:16:0.45,...]

Per policy: start ``sglang_pd.launch_server`` (SmolLM2-135M shape, ``--load-format dummy``) on
a free port, wait for /health, run ``sglang_pd.bench_serving --dataset-name mix`` with the same
seed (so the same prompts at the same arrival times), stop the server (SIGTERM, wait) and scan
its log for tracebacks. Policy names are the server's ``--prefill-policy`` values, plus
``dual`` (``--prefill-queues dual`` over fcfs, short batches by AWD) or ``dual+POLICY``.

The server gets the same ``--slo-ttft-ms`` as its default SLO; bench_serving also sends it per
request. ``--slo-ttft-ms-long`` gives prompts of at least ``--long-threshold`` tokens their own
TTFT SLO (sent per request and judged per class); without it one SLO holds for both classes, and
a long prompt whose prefill alone exceeds it misses under every policy.

Writes OUT/prefill_policies.json (config, per-policy rows, ratios vs fcfs), .md (the table) and
.png (short p90 TTFT and per-class attainment per policy). Server logs and the raw JSONL go to
--log-dir. No CUDA graphs on CPU: ``dual`` shows queue separation alone.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sglang_pd.utils.server_procs import free_port, popen_own_group, stop, wait_healthy

REPO = Path(__file__).resolve().parents[1]
DEFAULT_POLICIES = "fcfs,kairos,kairos+,lars,edf,dual"
DEFAULT_MIX = "64:4:0.45,200:4:0.45,3072:4:0.1"


@dataclass
class PolicyRun:
    """One policy's figures (TTFT in ms, attainment in 0..1, None when not measured)."""

    policy: str
    server_args: list[str]
    ok: bool = False
    problem: str = ""  # why the run failed or is suspect (startup, bench error, traceback)
    wall_s: float = 0.0
    num_requests: int = 0
    completed: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    short_p50_ms: float | None = None
    short_p90_ms: float | None = None
    long_p50_ms: float | None = None
    long_p90_ms: float | None = None
    att_overall: float | None = None
    att_short: float | None = None
    att_long: float | None = None
    n_short: int = 0
    n_long: int = 0
    tpot_p50_ms: float | None = None
    # the server's own pure decode steps (sglang:engine_step_seconds{mode="decode"} mean) and
    # their mean batch: TPOT / this = how far prefill stretches decoding (issue 28's bar: <= 3)
    decode_step_ms: float | None = None
    decode_batch: float | None = None
    load_avg_1m: float = 0.0  # at the policy's start: the machine may be shared
    log_file: str = ""
    tracebacks: list[str] = field(default_factory=list)


def policy_server_args(name: str, short_threshold: int) -> list[str]:
    """``dual`` / ``dual+POLICY`` = dual queues over fcfs / POLICY; else a --prefill-policy."""
    if name == "dual" or name.startswith("dual+"):
        base = name.partition("+")[2] or "fcfs"
        return ["--prefill-policy", base, "--prefill-queues", "dual",
                "--short-prefill-threshold", str(short_threshold)]
    return ["--prefill-policy", name]


def tracebacks_in(log: Path) -> list[str]:
    """Each 'Traceback' block of the log (up to its first unindented line after the header)."""
    text = log.read_text(errors="replace") if log.exists() else ""
    blocks = []
    for m in re.finditer(r"Traceback \(most recent call last\):\n((?:[ \t].*\n)*)(.*)", text):
        blocks.append(m.group(0).rstrip())
    return blocks


def fill_from_record(run: PolicyRun, rec: dict) -> None:
    run.num_requests, run.completed = rec["num_requests"], rec["completed"]
    run.errors = rec.get("errors") or {}
    run.att_overall = rec.get("ttft_attainment")
    by = rec.get("by_class", {})
    short, long_ = by.get("short", {}), by.get("long", {})
    run.n_short, run.n_long = short.get("num_requests", 0), long_.get("num_requests", 0)
    if short.get("completed"):
        run.short_p50_ms, run.short_p90_ms = short["median_ttft_ms"], short["p90_ttft_ms"]
    if long_.get("completed"):
        run.long_p50_ms, run.long_p90_ms = long_["median_ttft_ms"], long_["p90_ttft_ms"]
    run.att_short, run.att_long = short.get("ttft_attainment"), long_.get("ttft_attainment")
    run.tpot_p50_ms = rec.get("median_tpot_ms")


def decode_steps_from_metrics(url: str) -> tuple[float | None, float | None]:
    """Mean pure-decode step (ms) and mean decode batch from the server's /metrics histograms."""
    import urllib.request
    try:
        text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    except OSError:
        return None, None
    vals: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r'sglang:engine_step_(seconds|batch_size)_(sum|count)\{[^}]*mode="decode"[^}]*\} (\S+)', line)
        if m:
            vals[f"{m.group(1)}_{m.group(2)}"] = vals.get(f"{m.group(1)}_{m.group(2)}", 0.0) + float(m.group(3))
    n = vals.get("seconds_count", 0.0)
    if not n:
        return None, None
    return 1e3 * vals["seconds_sum"] / n, vals.get("batch_size_sum", 0.0) / max(vals.get("batch_size_count", n), 1.0)


def run_policy(name: str, args: argparse.Namespace, model_dir: Path, log_dir: Path) -> PolicyRun:
    run = PolicyRun(name, policy_server_args(name, args.short_threshold), load_avg_1m=os.getloadavg()[0])
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    safe = name.replace("+", "_plus")
    log = log_dir / f"server_{safe}.log"
    jsonl = log_dir / f"bench_{safe}.jsonl"
    jsonl.unlink(missing_ok=True)
    run.log_file = str(log)
    server = [sys.executable, "-m", "sglang_pd.launch_server", "--model-path", str(model_dir),
              "--load-format", "dummy", "--skip-tokenizer-init", "--port", str(port),
              "--slo-ttft-ms", str(args.slo_ttft_ms),
              "--chunked-prefill-size", str(args.chunked_prefill_size),
              "--random-seed", str(args.seed), *run.server_args, *args.server_extra.split()]
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'python'}:{os.environ.get('PYTHONPATH', '')}")
    t0 = time.monotonic()
    with open(log, "w") as logf:
        proc = popen_own_group(server, logf, env)  # own group: SIGTERM reaches the engine
        try:
            if not wait_healthy(url, proc, args.startup_timeout):
                run.problem = f"server not healthy in {args.startup_timeout:.0f} s (rc={proc.poll()})"
                return run
            print(f"  [{name}] server up in {time.monotonic() - t0:.1f} s on :{port}", flush=True)
            bench = [sys.executable, "-m", "sglang_pd.bench_serving", "--base-url", url,
                     "--dataset-name", "mix", "--length-mix", args.length_mix,
                     "--num-prompts", str(args.num_prompts), "--request-rate", str(args.rate),
                     "--seed", str(args.seed), "--slo-ttft-ms", str(args.slo_ttft_ms),
                     *(["--slo-ttft-ms-long", str(args.slo_ttft_ms_long)] if args.slo_ttft_ms_long else []),
                     "--long-threshold", str(args.long_threshold),
                     "--request-timeout", str(args.request_timeout),
                     "--warmup-requests", "1", "--disable-tqdm", "--output-details",
                     "--output-file", str(jsonl)]  # per-request lists stay in the raw JSONL
            res = subprocess.run(bench, env=env, capture_output=True, text=True,
                                 timeout=args.bench_timeout)
            (log_dir / f"bench_{safe}.out").write_text(res.stdout + res.stderr)
            if res.returncode != 0 or not jsonl.exists():
                run.problem = f"bench_serving rc={res.returncode}: {res.stderr.strip()[-300:]}"
            else:
                fill_from_record(run, json.loads(jsonl.read_text().splitlines()[-1]))
                run.decode_step_ms, run.decode_batch = decode_steps_from_metrics(url)
                run.ok = run.completed == run.num_requests
                if not run.ok:
                    run.problem = f"{run.num_requests - run.completed} failed: {run.errors}"
        except subprocess.TimeoutExpired:
            run.problem = f"bench_serving ran past {args.bench_timeout} s"
        finally:
            stop(proc)
            run.wall_s = time.monotonic() - t0
    run.tracebacks = tracebacks_in(log)
    if run.tracebacks:
        run.ok = False
        run.problem = (run.problem + "; " if run.problem else "") + \
            f"{len(run.tracebacks)} traceback(s) in {log}"
    return run


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}"


def comparisons(runs: list[PolicyRun]) -> dict[str, dict[str, float | None]]:
    """Per policy vs fcfs: short p90 TTFT fcfs/policy (>1 = better), attainment deltas (points)."""
    base = next((r for r in runs if r.policy == "fcfs" and r.short_p90_ms), None)
    out: dict[str, dict[str, float | None]] = {}
    for r in runs:
        if base is None:
            out[r.policy] = {"short_p90_speedup": None, "long_att_delta_pts": None,
                             "short_att_delta_pts": None}
            continue
        sp = base.short_p90_ms / r.short_p90_ms if r.short_p90_ms else None
        dl = (100 * (r.att_long - base.att_long)
              if r.att_long is not None and base.att_long is not None else None)
        ds = (100 * (r.att_short - base.att_short)
              if r.att_short is not None and base.att_short is not None else None)
        out[r.policy] = {"short_p90_speedup": sp, "long_att_delta_pts": dl, "short_att_delta_pts": ds}
    return out


def table(runs: list[PolicyRun], cmp: dict[str, dict[str, float | None]]) -> str:
    head = ("| policy | ok | done | short p50 / p90 TTFT (ms) | long p50 / p90 TTFT (ms) "
            "| att all / short / long (%) | short p90 fcfs/x | long att delta (pts) "
            "| p50 TPOT (ms) | decode step (ms) @ batch | TPOT / step | load 1m |")
    rows = [head, "|" + "---|" * 12]
    for r in runs:
        c = cmp[r.policy]
        sp = "-" if c["short_p90_speedup"] is None else f"{c['short_p90_speedup']:.2f}x"
        dl = "-" if c["long_att_delta_pts"] is None else f"{c['long_att_delta_pts']:+.1f}"
        rows.append(
            f"| {r.policy} | {'yes' if r.ok else 'NO'} | {r.completed}/{r.num_requests} "
            f"| {_ms(r.short_p50_ms)} / {_ms(r.short_p90_ms)} | {_ms(r.long_p50_ms)} / "
            f"{_ms(r.long_p90_ms)} | {_pct(r.att_overall)} / {_pct(r.att_short)} / "
            f"{_pct(r.att_long)} | {sp} | {dl} | {_ms(r.tpot_p50_ms)} "
            f"| {'-' if r.decode_step_ms is None else f'{r.decode_step_ms:.1f} @ {r.decode_batch:.1f}'} "
            f"| {'-' if not (r.tpot_p50_ms and r.decode_step_ms) else f'{r.tpot_p50_ms / r.decode_step_ms:.2f}'} "
            f"| {r.load_avg_1m:.1f} |")
    return "\n".join(rows)


def plot(runs: list[PolicyRun], args: argparse.Namespace, path: Path) -> bool:
    try:
        from matplotlib.figure import Figure

        from sglang_pd.bench.plots import grouped_bars, save_figure
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return False
    names = [r.policy for r in runs]
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    a1, a2 = fig.subplots(1, 2)
    grouped_bars(a1, names, [("short p90", [(r.short_p90_ms or 0) / 1e3 for r in runs])])
    a1.plot(range(len(runs)), [(r.short_p50_ms or 0) / 1e3 for r in runs], "ko", label="short p50")
    a1.axhline(args.slo_ttft_ms / 1e3, color="tab:red", ls="--", label="TTFT SLO")
    a1.set_ylabel("TTFT (s)")
    a1.set_title("short-prompt TTFT")
    grouped_bars(a2, names, [(label, [100 * (getattr(r, attr) or 0) for r in runs])
                             for label, attr in (("all", "att_overall"), ("short", "att_short"),
                                                 ("long", "att_long"))])
    a2.set_ylim(0, 105)
    a2.set_ylabel("TTFT SLO attainment (%)")
    a2.set_title("attainment per class")
    for ax in (a1, a2):
        ax.legend(fontsize=8)
    fig.suptitle(f"prefill policies, CPU engine, SmolLM2-135M shape (dummy weights): "
                 f"{args.rate} req/s, SLO {args.slo_ttft_ms:.0f} ms, mix {args.length_mix}",
                 fontsize=9)
    save_figure(fig, path)
    return True


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(f"signal {signum}")  # runs the finally blocks: the server is stopped


def main() -> None:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="docs/bench", help="directory for prefill_policies.{json,md,png}")
    ap.add_argument("--policies", default=DEFAULT_POLICIES, help="comma-separated; dual, dual+POLICY")
    ap.add_argument("--rate", type=float, default=0.06, help="Poisson request rate (req/s)")
    ap.add_argument("--slo-ttft-ms", type=float, default=5000.0, help="server default and per request")
    ap.add_argument("--slo-ttft-ms-long", type=float, default=None,
                    help="TTFT SLO of prompts >= --long-threshold tokens (default: --slo-ttft-ms)")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--length-mix", default=DEFAULT_MIX, help="IN:OUT:WEIGHT,...")
    ap.add_argument("--long-threshold", type=int, default=1024, help="prompt tokens of class 'long'")
    ap.add_argument("--short-threshold", type=int, default=256, help="dual: --short-prefill-threshold")
    ap.add_argument("--chunked-prefill-size", type=int, default=512,
                    help="small chunks so a deadline policy can put shorts between a long's chunks")
    ap.add_argument("--seed", type=int, default=65, help="65: 2 long prompts in 16, shorts behind each")
    ap.add_argument("--model-dir", help="config dir (default: make_dummy_config smollm2-135m in a temp dir)")
    ap.add_argument("--server-extra", default="", help="more launch_server flags, space-separated")
    ap.add_argument("--log-dir", default=str(Path(tempfile.gettempdir()) / "bench_prefill_policies"))
    ap.add_argument("--startup-timeout", type=float, default=90.0)
    ap.add_argument("--request-timeout", type=float, default=300.0)
    ap.add_argument("--bench-timeout", type=float, default=400.0, help="seconds per bench_serving run")
    args = ap.parse_args()
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not policies:
        ap.error("--policies is empty")
    if args.rate <= 0 or args.num_prompts < 1 or args.slo_ttft_ms <= 0:
        ap.error("--rate, --num-prompts and --slo-ttft-ms must be positive")

    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    model_dir = Path(args.model_dir) if args.model_dir else log_dir / "smollm2-135m"
    if not (model_dir / "config.json").exists():
        subprocess.run([sys.executable, "-m", "sglang_pd.tools.make_dummy_config", "smollm2-135m",
                        str(model_dir)], check=True,
                       env=dict(os.environ, PYTHONPATH=str(REPO / "python")))
    load0 = os.getloadavg()
    print(f"{len(policies)} policies, {args.num_prompts} requests at {args.rate} req/s, "
          f"SLO {args.slo_ttft_ms:.0f} ms, mix {args.length_mix}; logs in {log_dir}; "
          f"load average {load0[0]:.2f}", flush=True)
    runs = []
    for name in policies:
        print(f"[{len(runs) + 1}/{len(policies)}] {name} ...", flush=True)
        r = run_policy(name, args, model_dir, log_dir)
        runs.append(r)
        print(f"  [{name}] {'ok' if r.ok else 'PROBLEM: ' + r.problem} in {r.wall_s:.0f} s: "
              f"short p50/p90 {_ms(r.short_p50_ms)}/{_ms(r.short_p90_ms)} ms, long p50/p90 "
              f"{_ms(r.long_p50_ms)}/{_ms(r.long_p90_ms)} ms, attainment all/short/long "
              f"{_pct(r.att_overall)}/{_pct(r.att_short)}/{_pct(r.att_long)} %, p50 TPOT "
              f"{_ms(r.tpot_p50_ms)} ms, decode step {_ms(r.decode_step_ms)} ms", flush=True)

    cmp = comparisons(runs)
    md = table(runs, cmp)
    print("\n" + md)
    load1 = os.getloadavg()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in vars(args).items() if k not in ("out", "log_dir")}
    meta = {"host": platform.node(), "cpus": os.cpu_count(), "load_avg_start": load0,
            "load_avg_end": load1, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    (out / "prefill_policies.json").write_text(json.dumps(
        {"config": config, "meta": meta, "runs": [asdict(r) for r in runs], "vs_fcfs": cmp},
        indent=1) + "\n")
    long_flag = f" --slo-ttft-ms-long {args.slo_ttft_ms_long:.0f}" if args.slo_ttft_ms_long else ""
    slo_note = (f"Long prompts have their own TTFT SLO ({args.slo_ttft_ms_long:.0f} ms)."
                if args.slo_ttft_ms_long else
                "One SLO for both classes: a long prompt whose prefill alone takes longer than the SLO "
                "misses it under every policy (compare long TTFT instead).")
    (out / "prefill_policies.md").write_text(
        f"# Prefill policies on the CPU engine\n\n"
        f"`python scripts/bench_prefill_policies.py --out {args.out} --policies {args.policies} "
        f"--rate {args.rate} --slo-ttft-ms {args.slo_ttft_ms:.0f}{long_flag} --num-prompts {args.num_prompts} "
        f"--length-mix {args.length_mix}` (seed {args.seed}, chunk {args.chunked_prefill_size}, "
        f"long >= {args.long_threshold} tokens), {meta['date']}, {meta['cpus']} CPUs, load "
        f"average {load0[0]:.2f} -> {load1[0]:.2f} (1-minute load at each policy's start in the last "
        f"column). TTFT attainment, over all requests sent; TTFT percentiles over completed ones. "
        f"{slo_note}\n\n{md}\n")
    if plot(runs, args, out / "prefill_policies.png"):
        print(f"wrote {out}/prefill_policies.{{json,md,png}}")
    for r in runs:
        for tb in r.tracebacks:
            print(f"\n[{r.policy}] traceback in {r.log_file}:\n{tb}", file=sys.stderr)


if __name__ == "__main__":
    main()
