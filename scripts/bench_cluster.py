#!/usr/bin/env python3
"""The whole PD cluster against today's baselines (issue 34 item 2): one command, one table.

  python scripts/bench_cluster.py [--out docs/bench] [--setups sglang-pd,ours,...] [--quick]

For each setup, in turn, on this machine: start 2 prefill servers (``--prefills 1``: one) and
1 decode server (``sglang_pd.launch_server``, SmolLM2-135M shape with ``--load-format dummy``, one thread
each), a router in front (SGLang's ``sglang_router`` or ours), replay the same workload through
it with ``sglang_pd.bench_serving`` (same requests at the same times), stop everything and scan
the logs for tracebacks. Setups (``--list`` prints them):

  (a) sglang-pd         SGLang PD as people run it: SGLang's router, fcfs prefill, continuous decode
  (b) sglang-spf        the same with SGLang's shortest-prefill-first (PR #40024; policy sglang-spf)
      vllm-threshold    the same with vLLM's --long-prefill-token-threshold (policy vllm-threshold)
      dynamo-edf        our router with an EDF pending queue (Dynamo's) over fcfs / continuous
  (c) ours              our router (length_aware) over a short-role and a long-role prefill
                        (dual queues, kairos+), slack+ decode
  (d) ours-no-pools     ours with both prefill instances of role "both" (no length pools)
      ours-no-dual      ours with single prefill queues (kairos+ alone)
      ours-no-kairos    ours with dual queues over fcfs (no kairos+)
      ours-no-slack     ours with continuous decode (no slack+)
      ours+reserve      ours with slack+ keeping the decode table's p90 overrun in reserve
                        (--decode-reserve-quantile 0.9)
      ours+budget       ours with long chunks sized to end within 700 ms (--time-budget-ms)
      ours+controller   ours with the pool controller on (an addition: it moves instances)
      ours+spill        ours with length_aware_spill routing (item 0: idle short instances take longs)
      ours+cond         ours with --conditional-disagg on (item 3: a short prompt is prefilled on the
                        decode server while its prefill is loaded; scripts/bench_conditional_disagg.py
                        isolates that case)

The workload: the first requests of a public trace (``--trace``, default azure-conv), prompt
lengths times ``--length-scale`` (a CPU handles ~1/8 of an A100's prompt sizes in similar
time), outputs clamped to ``--max-output-len``, arrival times rescaled to ``--rate`` req/s.
Per-class TTFT SLOs (short = at most ``--short-threshold`` tokens) and one TPOT SLO, sent per
request. Writes OUT/bench_cluster.{json,md,png}. ``--quick``: the tiny model, a few requests and
two setups, a CI smoke (scripts/ and the bench package only; no figures worth quoting).
No CUDA graphs on CPU: the short-prefill graph buckets of the short pool show nothing here.
How long: each setup starts its servers (~35 s on 2 cores), replays the workload's span
(--num-prompts / --rate: 80 at 1.5 req/s is ~53 s) and drains; ~1-2 min a setup, ~15-25 min
for all sixteen at the defaults. Setups run one after another, so a busy machine can shift a
whole row: --rounds N runs them N times in alternating order (after an unmeasured --prime
cluster) and summarises each setup's mean and range. --decode-log: one line
per decode decision in the decode server's log (engine/decode_log.py). --request-log: one line
per request per engine (engine/request_log.py), each run's TTFT split into stages per class.
Pinned (``--pin-cores``, default on; utils/pinning.py): once the cluster is up, the two
prefill engines share the first core, and the decode engine runs on the other beside the light
processes (the servers' frontends, the router, the bench client), as a PD cluster gives decode
its own device. Unpinned, decode and prefill engines took turns on both cores, so every extra
decode step (a smaller batch under slack+) took prefill time, which it does not on PD hardware,
and every run moved with whatever else woke up. (All three engines on one core, tried first,
was worse: decode's continuous small steps took a third of the prefill core, and both stacks
were past their knee at 1.0 req/s.) ``--pin-layout split``: prefill0 (ours: the short role) alone
on the first core, as on its own device, and the long prefill beside decode on the other;
``--pin-layout priority``: as shared, with prefill1's engine at nice +10 in every setup, so
prefill0 (ours: the short role) takes the core whenever it has work.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench_cluster_report import plot, rounds_spread, rounds_summary, table
from bench_cluster_setups import TIME_BUDGET_MS, Setup, cluster_setups
from sglang_pd.bench.datasets import rate_offering
from sglang_pd.bench.host_usage import group_usage, metric_samples, process_cpu_s
from sglang_pd.bench.ttft_stages import join, read_lines, summarise
from sglang_pd.utils.pinning import engine_pids, lower_priority, pin_engines, restore_self
from sglang_pd.utils.server_procs import free_port, popen_own_group, stop, wait_healthy

REPO = Path(__file__).resolve().parents[1]
STATS_LAG_S = 1.5  # engines push their step samples every second (engine_process.py)
PRIORITY_NICE = 10  # --pin-layout priority: prefill1's engine yields the shared core to prefill0's
@dataclass
class Run:
    setup: str
    ok: bool = False
    problem: str = ""
    wall_s: float = 0.0
    load_avg_1m: float = 0.0
    pinned: str = ""  # what --pin-cores did (utils/pinning.py), "" when off
    round: int = 1  # --rounds: which pass over the setups
    cpu_s: dict[str, float] = field(default_factory=dict)  # CPU seconds during the replay, per process
    num_requests: int = 0
    completed: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    by_class: dict[str, dict[str, float | int | None]] = field(default_factory=dict)
    overall: dict[str, float | int | None] = field(default_factory=dict)
    tracebacks: list[str] = field(default_factory=list)
    # --request-log: per class, each TTFT stage's (p50, p90) in ms (bench/ttft_stages.py)
    timeline: dict[str, dict[str, tuple[float, float]]] = field(default_factory=dict)


KEYS = ("num_requests", "completed", "median_ttft_ms", "p90_ttft_ms", "median_tpot_ms", "p90_tpot_ms",
        "ttft_attainment", "tpot_attainment", "slo_attainment", "goodput_rps")


def write_workload(args: argparse.Namespace, path: Path) -> dict[str, float]:
    """The trace's first ``--num-prompts`` requests, scaled to the CPU, as Mooncake-format JSON
    lines (the bench loads it like any trace). Returns what was made of it; with
    ``--prompt-tokens-per-s`` it also sets ``args.rate`` to the rate that offers it."""
    sys.path.insert(0, str(REPO / "python"))
    from sglang_pd.bench.traces import load_trace

    recs = load_trace(args.trace, limit=args.trace_skip + args.num_prompts)[args.trace_skip:]
    if not recs:
        raise SystemExit(f"{args.trace}: nothing left after --trace-skip {args.trace_skip}")
    t0 = recs[0].arrival_s or 0.0  # a skipped window starts at its own first arrival
    span = ((recs[-1].arrival_s or 0.0) - t0) or 1.0
    lengths = [max(1, min(args.max_input_len, round(r.input_len * args.length_scale))) for r in recs]
    if args.prompt_tokens_per_s:  # --rate is set from it (main prints and plots args.rate); n per span
        args.rate = rate_offering(args.prompt_tokens_per_s, lengths, len(recs))
    stretch = (len(recs) / span) / args.rate  # trace rate -> --rate
    with open(path, "w") as f:
        for r, inp in zip(recs, lengths):
            f.write(json.dumps({"timestamp": 1e3 * ((r.arrival_s or 0.0) - t0) * stretch, "input_length": inp,
                                "output_length": max(1, min(r.output_len, args.max_output_len))}) + "\n")
    n_long = sum(n > args.short_threshold for n in lengths)
    return {"requests": len(recs), "long_fraction": n_long / len(recs), "span_s": span * stretch,
            "rate": args.rate, "prompt_tokens_per_s": sum(lengths) / (span * stretch)}


def _popen(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    with open(log, "w") as logf:  # the child keeps its own handle
        return popen_own_group(cmd, logf, env)  # own group: SIGTERM reaches the engine


def start_cluster(s: Setup, args: argparse.Namespace, model: Path, log_dir: Path,
                  env: dict[str, str], procs: list[tuple[str, subprocess.Popen]],
                  urls: list[str]) -> str:
    """Servers and router up (appended to ``procs`` as they start, the servers' URLs to
    ``urls`` in the same order); returns the router's URL."""
    common = ["--model-path", str(model), "--load-format", "dummy", "--skip-tokenizer-init",
              "--page-size", "16", "--chunked-prefill-size", str(args.chunk),
              "--short-prefill-threshold", str(args.short_threshold),
              "--slo-ttft-ms", str(args.slo_ttft_short_ms), "--slo-tpot-ms", str(args.slo_tpot_ms),
              "--random-seed", str(args.seed), *(("--log-requests",) if args.request_log else ())]
    py = [sys.executable, "-m", "sglang_pd.launch_server", *common]
    prefills: list[str] = []
    for i, flags in enumerate(s.prefill):
        port, boot = free_port(), free_port()
        procs.append((f"prefill{i}", _popen([*py, *flags, "--mode", "prefill", "--port", str(port),
                                             "--disaggregation-bootstrap-port", str(boot)],
                                            log_dir / f"{s.name}_prefill{i}.log", env)))
        prefills += ["--prefill", f"http://127.0.0.1:{port}", str(boot)]
        urls.append(f"http://127.0.0.1:{port}")
    port = free_port()
    log = ("--log-level", "debug") if args.decode_log else ()  # engine/decode_log.py lines
    procs.append(("decode", _popen([*py, *s.decode, *log, "--mode", "decode", "--port", str(port)],
                                   log_dir / f"{s.name}_decode.log", env)))
    urls.append(f"http://127.0.0.1:{port}")
    workers = [*prefills, "--decode", f"http://127.0.0.1:{port}"]
    for (name, proc), url in zip(procs, urls):
        if not wait_healthy(url, proc, args.startup_timeout):
            raise RuntimeError(f"{name} not healthy in {args.startup_timeout:.0f} s (rc={proc.poll()})")
    rport = free_port()
    if s.router == "sglang":
        router = [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation", *workers]
    else:
        router = [sys.executable, "-m", "sglang_pd_router", "--pd-disaggregation", *workers,
                  "--short-prefill-threshold", str(args.short_threshold), "--log-level", "warning",
                  "--slo-ttft-ms", str(args.slo_ttft_short_ms), str(args.slo_ttft_long_ms),
                  "--slo-tpot-ms", str(args.slo_tpot_ms), *s.router_flags]
    procs.append(("router", _popen([*router, "--host", "127.0.0.1", "--port", str(rport)],
                                   log_dir / f"{s.name}_router.log", env)))
    url = f"http://127.0.0.1:{rport}"
    if not wait_healthy(url, procs[-1][1], args.startup_timeout):
        raise RuntimeError(f"router not healthy (rc={procs[-1][1].poll()})")
    return url


def cpu_seconds(procs: list[tuple[str, subprocess.Popen]]) -> dict[str, float]:
    """CPU seconds so far of each server's and the router's process group (each started in its
    own), and of each server's engine alone: the rest of a group is its frontend. Read before and
    after the replay, their difference says who took the cores (an engine's neighbours)."""
    out = {}
    for name, proc in procs:
        out[name] = group_usage(proc.pid)[0]
        for engine in engine_pids(proc.pid) if name != "router" else ():
            out[f"{name} engine"] = process_cpu_s(engine)
    return out


def parse_step_metrics(text: str) -> dict[str, dict[str, float]]:
    """Per step mode (extend | decode | mixed): the engine's step count and seconds summed,
    from a server's /metrics text (``sglang:engine_step_seconds``, frontend/metrics.py)."""
    out: dict[str, dict[str, float]] = {}
    for suffix, key in (("_count", "steps"), ("_sum", "seconds")):
        for labels, value in metric_samples(text, f"sglang:engine_step_seconds{suffix}"):
            if "mode" in labels:
                out.setdefault(labels["mode"], {"steps": 0.0, "seconds": 0.0})[key] += value
    return out


def scrape_steps(names: list[str], urls: list[str]) -> dict[str, dict[str, dict[str, float]]]:
    """Every server's engine steps so far (each pushes its step samples at most a second late)."""
    import urllib.request

    time.sleep(STATS_LAG_S)
    out = {}
    for name, url in zip(names, urls):
        try:
            with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
                out[name] = parse_step_metrics(r.read().decode())
        except OSError as e:
            print(f"  /metrics of {name}: {e}", file=sys.stderr)
    return out


def run_setup(s: Setup, args: argparse.Namespace, model: Path, workload: Path, log_dir: Path) -> Run:
    run = Run(s.name, load_avg_1m=os.getloadavg()[0])
    own_cores = os.sched_getaffinity(0)
    env = dict(os.environ, OMP_NUM_THREADS="1", UCX_NET_DEVICES=os.environ.get("UCX_NET_DEVICES", "lo"),
               NIXL_LOG_LEVEL="WARN",
               PYTHONPATH=f"{REPO / 'python'}:{REPO / 'router'}:{os.environ.get('PYTHONPATH', '')}")
    procs: list[tuple[str, subprocess.Popen]] = []
    urls: list[str] = []
    jsonl = log_dir / f"{s.name}.jsonl"
    jsonl.unlink(missing_ok=True)
    t0 = time.monotonic()
    try:
        url = start_cluster(s, args, model, log_dir, env, procs, urls)
        print(f"  [{s.name}] cluster up in {time.monotonic() - t0:.1f} s", flush=True)
        if args.pin_cores:  # the layout's own-core engines on the first core; the rest on the others
            alone = pinned_alone(args.pin_layout)
            run.pinned = pin_engines([p.pid for n, p in procs if n in alone],
                                     [p.pid for n, p in procs if n == "router"],
                                     rest_servers=[p.pid for n, p in procs if n not in alone and n != "router"])
            if args.pin_layout == "priority":  # every setup alike: prefill0 first on the shared core
                run.pinned += "; prefill1's " + lower_priority([p.pid for n, p in procs if n == "prefill1"],
                                                                PRIORITY_NICE)
            print(f"  [{s.name}] pinned: {run.pinned}", flush=True)
        bench = [sys.executable, "-m", "sglang_pd.bench_serving", "--base-url", url, "--backend", "sglang",
                 "--dataset-name", "trace", "--dataset-path", str(workload),
                 "--num-prompts", str(args.num_prompts), "--seed", str(args.seed),
                 "--slo-ttft-ms", str(args.slo_ttft_short_ms), "--slo-ttft-ms-long", str(args.slo_ttft_long_ms),
                 "--slo-tpot-ms", str(args.slo_tpot_ms), "--long-threshold", str(args.short_threshold + 1),
                 "--request-timeout", str(args.request_timeout), "--warmup-requests", "1",
                 "--disable-tqdm", "--output-details",  # per request: sim_fidelity_cluster.py replays them
                 "--output-file", str(jsonl)]
        cpu0 = cpu_seconds(procs)
        res = subprocess.run(bench, env=env, capture_output=True, text=True, timeout=args.bench_timeout,
                             check=False)
        run.cpu_s = {k: round(v - cpu0.get(k, 0.0), 2) for k, v in cpu_seconds(procs).items()}
        (log_dir / f"{s.name}_bench.out").write_text(res.stdout + res.stderr)
        if res.returncode != 0 or not jsonl.exists():
            raise RuntimeError(f"bench_serving rc={res.returncode}: {res.stderr.strip()[-300:]}")
        steps = log_dir / f"{s.name}_steps.json"  # sim_fidelity_cluster.py calibrates from these
        steps.write_text(json.dumps(scrape_steps([n for n, _ in procs], urls), indent=1) + "\n")
        rec = json.loads(jsonl.read_text().splitlines()[-1])
        run.num_requests, run.completed = rec["num_requests"], rec["completed"]
        run.errors = rec.get("errors") or {}
        run.overall = {k: rec.get(k) for k in KEYS}
        run.by_class = {c: {k: v.get(k) for k in KEYS} for c, v in rec.get("by_class", {}).items()}
        run.ok = run.completed == run.num_requests
        if not run.ok:
            run.problem = f"{run.num_requests - run.completed} failed: {run.errors}"
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        run.problem = str(e)
    finally:
        for _, proc in reversed(procs):
            stop(proc)
        restore_self(own_cores)  # the next setup's servers start on every core again
        run.wall_s = time.monotonic() - t0
    for log in sorted(log_dir.glob(f"{s.name}_*.log")):
        text = log.read_text(errors="replace")
        run.tracebacks += [f"{log.name}: {b[:400]}" for b in text.split("Traceback (most recent call last):")[1:]]
    if args.request_log:  # engine/request_log.py lines of this run's servers, joined by room
        run.timeline = summarise(join(read_lines(sorted(log_dir.glob(f"{s.name}_*.log"))), args.short_threshold))
    if run.tracebacks:
        run.ok = False
        run.problem = (run.problem + "; " if run.problem else "") + f"{len(run.tracebacks)} traceback(s)"
    return run


def run_measured(s: Setup, args: argparse.Namespace, model: Path, workload: Path, log_dir: Path) -> Run:
    """:func:`run_setup`, started once more if its cluster never came up (a server's or the
    router's /health never answered: nothing was measured, so the row would only say that);
    a run that failed while measuring is kept as it is."""
    r = run_setup(s, args, model, workload, log_dir)
    if not r.ok and "not healthy" in r.problem:
        print(f"  [{s.name}] {r.problem}; starting it again", flush=True)
        r = run_setup(s, args, model, workload, log_dir)
    return r


def pinned_alone(layout: str) -> tuple[str, ...]:
    """The servers whose engines get the first core under ``--pin-layout``: "shared" and
    "priority" both prefill engines (decode beside the light processes on the other core;
    "priority" then lowers prefill1's engine to nice PRIORITY_NICE), "split" prefill0 alone
    (ours: the short-role instance, as on its own device; the long prefill and the decode share
    the other core with the light processes)."""
    return ("prefill0",) if layout == "split" else ("prefill0", "prefill1")


def round_plan(names: list[str], rounds: int) -> list[tuple[int, str]]:
    """(round, setup) in run order: every other round reversed, so each setup runs early and
    late (a,b / b,a / a,b ...) and a drift of the host's speed falls on all of them alike."""
    return [(k, n) for k in range(1, rounds + 1) for n in (names if k % 2 else names[::-1])]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="directory for bench_cluster.{json,md,png} (default: --log-dir)")
    ap.add_argument("--setups", default=None, help="comma-separated (default: all; --quick: sglang-pd,ours)")
    ap.add_argument("--list", action="store_true", help="print the setups and exit")
    ap.add_argument("--quick", action="store_true", help="CI smoke: tiny model, 10 requests, 2 setups")
    ap.add_argument("--trace", default="azure-conv", help="data/traces short name or file")
    ap.add_argument("--num-prompts", type=int, default=80)
    ap.add_argument("--trace-skip", type=int, default=0,
                    help="start after this many trace requests (another window of the same trace)")
    ap.add_argument("--rate", type=float, default=1.5, help="mean arrival rate (req/s) the trace is rescaled to")
    ap.add_argument("--prompt-tokens-per-s", type=float, default=None,
                    help="instead of --rate: the rate at which the window offers this many prompt tokens a second "
                         "(after --length-scale), so windows of different prompt lengths load the prefill alike "
                         "(the first 80 requests at 2.5 req/s offer ~222)")
    ap.add_argument("--length-scale", type=float, default=0.125, help="prompt lengths times this")
    ap.add_argument("--max-input-len", type=int, default=3072)
    ap.add_argument("--max-output-len", type=int, default=16)
    ap.add_argument("--short-threshold", type=int, default=256, help="prompts <= this are short")
    ap.add_argument("--slo-ttft-short-ms", type=float, default=1000.0)
    ap.add_argument("--slo-ttft-long-ms", type=float, default=5000.0)
    ap.add_argument("--slo-tpot-ms", type=float, default=250.0)
    ap.add_argument("--chunk", type=int, default=512, help="--chunked-prefill-size of every server")
    ap.add_argument("--time-budget-ms", type=float, default=TIME_BUDGET_MS,
                    help="ours+budget: the prefill servers' --prefill-time-budget-ms")
    ap.add_argument("--edf-concurrency", type=int, default=4, help="dynamo-edf: requests in flight")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--model-dir", default=None, help="default: make_dummy_config smollm2-135m (--quick: tiny)")
    ap.add_argument("--pin-cores", action=argparse.BooleanOptionalAction, default=True,
                    help="the prefill engines on the first core; the decode engine, frontends, router and "
                         "the bench client on the others (utils/pinning.py)")
    ap.add_argument("--prefills", type=int, choices=(1, 2), default=2,
                    help="prefill servers per setup: 2 (the issue's cluster; on 2 cores they share one) or 1 "
                         "(each engine a core of its own: prefill alone on the first, decode on the other; ours "
                         "keeps dual queues + kairos+ on one instance of role both; bench_cluster_setups.py)")
    ap.add_argument("--pin-layout", choices=("shared", "split", "priority"), default="shared",
                    help="with --pin-cores: shared = both prefill engines on the first core; split = prefill0 "
                         "(ours: the short role) alone there, prefill1 and decode on the other; priority = as "
                         "shared, prefill1's engine at nice +10 in every setup (prefill0 runs whenever it has "
                         "work, as on its own device; prefill1 gets the rest)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="pass over the setups N times, every other pass in reverse order (a,b,b,a,...): "
                         "each setup early and late; a summary gives each setup's mean and range")
    ap.add_argument("--prime", action=argparse.BooleanOptionalAction, default=None,
                    help="first run the first setup once, unmeasured (default: on, off with --quick): the "
                         "first cluster of an invocation ran slower on this host (docs/bench_cluster.md)")
    ap.add_argument("--decode-log", action="store_true",
                    help="decode server at --log-level debug: one line per decode decision in its log")
    ap.add_argument("--request-log", action="store_true",
                    help="servers with --log-requests: one line per request per engine with its stages; "
                         "each run's TTFT split per class (bench/ttft_stages.py) goes in the JSON")
    ap.add_argument("--log-dir", default=str(Path(tempfile.gettempdir()) / "bench_cluster"))
    ap.add_argument("--startup-timeout", type=float, default=120.0)
    ap.add_argument("--request-timeout", type=float, default=300.0)
    ap.add_argument("--bench-timeout", type=float, default=600.0)
    return ap


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(f"signal {signum}")  # runs the finally blocks: the servers are stopped


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.prefills == 1 and args.pin_layout != "shared":
        ap.error("--prefills 1: the one prefill engine has the first core to itself; --pin-layout is moot")
    setups = cluster_setups(args.edf_concurrency, args.prefills, args.time_budget_ms)
    if args.list:
        for s in setups.values():
            print(f"{s.name:<16} {s.what}")
        return 0
    if args.quick:
        # the first 14 requests of azure-conv at x0.25: a few long prompts among the shorts
        args.num_prompts, args.rate, args.max_output_len, args.length_scale = 14, 6.0, 4, 0.25
        args.setups = args.setups or "sglang-pd,ours"
        args.model_dir = args.model_dir or str(REPO / "models" / "tiny-llama")
    names = [n.strip() for n in (args.setups or ",".join(setups)).split(",") if n.strip()]
    unknown = [n for n in names if n not in setups]
    if unknown or not names:
        ap.error(f"unknown setups {unknown}; known: {', '.join(setups)}")
    if (args.rate <= 0 or args.num_prompts < 1 or args.length_scale <= 0 or args.rounds < 1
            or (args.prompt_tokens_per_s is not None and args.prompt_tokens_per_s <= 0)):
        ap.error("--rate, --num-prompts, --length-scale, --rounds and --prompt-tokens-per-s must be positive")
    if args.pin_layout != "shared" and not args.pin_cores:
        ap.error(f"--pin-layout {args.pin_layout} needs --pin-cores")
    args.prime = not args.quick if args.prime is None else args.prime
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    model = Path(args.model_dir) if args.model_dir else log_dir / "smollm2-135m"
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    if args.quick and not (model / "config.json").exists():
        subprocess.run([sys.executable, "-m", "sglang_pd.tools.make_tiny_model", str(model), "--arch", "llama"],
                       check=True, env=env)
    elif not (model / "config.json").exists():
        subprocess.run([sys.executable, "-m", "sglang_pd.tools.make_dummy_config", "smollm2-135m", str(model)],
                       check=True, env=env)
    workload = log_dir / "workload.jsonl"
    wl = write_workload(args, workload)
    load0 = os.getloadavg()
    print(f"{len(names)} setups; {wl['requests']} requests of {args.trace} (lengths x{args.length_scale}, "
          f"{100 * wl['long_fraction']:.0f}% long), {args.rate:.3g} req/s ({wl['prompt_tokens_per_s']:.0f} prompt "
          f"tokens/s) over {wl['span_s']:.0f} s; SLOs TTFT "
          f"{args.slo_ttft_short_ms:.0f}/{args.slo_ttft_long_ms:.0f} ms, TPOT {args.slo_tpot_ms:.0f} ms; "
          f"logs in {log_dir}; load {load0[0]:.2f}", flush=True)
    if args.prime:  # unmeasured: what a first cluster pays falls here (its row is printed, not kept)
        print(f"[prime] {names[0]} (not measured)", flush=True)
        (log_dir / "prime").mkdir(exist_ok=True)
        r = run_setup(setups[names[0]], args, model, workload, log_dir / "prime")
        print(f"  {table([r]).splitlines()[-1]}", flush=True)
    runs: list[Run] = []
    plan = round_plan(names, args.rounds)
    for i, (k, name) in enumerate(plan):
        print(f"[{i + 1}/{len(plan)}] {name}{f' (round {k})' if args.rounds > 1 else ''}: {setups[name].what}",
              flush=True)
        rdir = log_dir / f"round{k}" if args.rounds > 1 else log_dir
        rdir.mkdir(exist_ok=True)
        r = run_measured(setups[name], args, model, workload, rdir)
        r.round = k
        runs.append(r)
        cpu = f"; CPU s during the replay: {', '.join(f'{k} {v:.1f}' for k, v in r.cpu_s.items())}" if r.cpu_s else ""
        print(f"  [{name}] {'ok' if r.ok else 'PROBLEM: ' + r.problem} in {r.wall_s:.0f} s{cpu}\n"
              f"  {table([r], runs[0]).splitlines()[-1]}", flush=True)  # the row now: a cut-short run still tells
    md = table(runs)
    if args.rounds > 1:
        md += "\n\n" + rounds_summary(runs) + "\n\nRun-to-run spread (mean abs deviation from the setup's mean):\n\n" \
            + rounds_spread(runs)
    print("\n" + md)
    out = Path(args.out) if args.out else log_dir
    out.mkdir(parents=True, exist_ok=True)
    meta = {"host": platform.node(), "cpus": os.cpu_count(), "load_avg_start": load0,
            "load_avg_end": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "workload": wl, "argv": sys.argv[1:]}
    config = {k: v for k, v in vars(args).items() if k not in ("out", "log_dir", "list")}
    (out / "bench_cluster.json").write_text(json.dumps(
        {"config": config, "meta": meta, "runs": [asdict(r) for r in runs]}, indent=1) + "\n")
    (out / "bench_cluster.md").write_text(
        f"# Whole cluster vs baselines (scripts/bench_cluster.py)\n\n`python scripts/bench_cluster.py "
        f"{' '.join(sys.argv[1:])}`, {meta['date']}, {meta['cpus']} CPUs, load {load0[0]:.2f}.\n\n{md}\n")
    if plot(runs, args, out / "bench_cluster.png"):
        print(f"wrote {out}/bench_cluster.{{json,md,png}}")
    for r in runs:
        for tb in r.tracebacks:
            print(f"\n[{r.setup}] {tb}", file=sys.stderr)
    return 0 if all(r.ok for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
