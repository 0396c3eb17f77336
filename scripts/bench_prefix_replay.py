"""Mooncake conversation replay, prefix cache on vs off on the same server build (issue 30 bar).

Mooncake's conversation trace scaled to a CPU: each 512-token ``hash_id`` block becomes
``--block-tokens`` tokens (one fixed random block per id: equal ids, equal tokens, so prefixes
hit exactly where the trace says) and the engine's page is one block; outputs are capped at
``--max-output``. The trace's first ``--warm-requests`` prompts are prefilled first (one output
token, ``--warm-concurrency`` at a time, untimed): the trace's first requests share almost
nothing, its follow-up turns resend histories sent earlier, so a window measured after a
warm-up is the representative one. Then the next ``--num-requests`` are measured, arrivals
keeping the trace's shape rescaled to ``--qps``. One colocated server (SmolLM2-135M shape,
dummy weights) runs all this twice, with its radix cache and with ``--disable-radix-cache``:
the same requests, the warm-up included. Per run: the window's hit rate (meta_info
``cached_tokens`` / prompt tokens), TTFT p50/p90 (streamed first token), and the engine's
stepping seconds (/metrics ``sglang:engine_step_seconds``) over the window's wall time (busy) and over its
arrival span (load: above 1 the queue grows over the window). Before the runs: the window's
ceiling (share of its prompt tokens in leading blocks an earlier request sent) and the
simulator's predicted hit rate for the same warmed window (``sim_hit_rates``).

Method: on this host the first server of an invocation ran ~10% slower at the same work (its
warm-up too; docs/prefix_cache.md, session 8), which near the knee moved TTFT p50 as much as
the cache did. So an unmeasured priming server runs first (``--prime-requests``), each side runs
once early and once late (``on,off,off,on``; ``--order`` for any other), and TTFT percentiles
pool a side's runs. Each run also reports where the CPU went over the window (server, client,
other processes: ``sglang_pd.bench.host_usage``) and the engine's stepping seconds.

    flock /tmp/cpu.lock python scripts/bench_prefix_replay.py --warm-requests 300 \
        --num-requests 150 --block-tokens 4 --max-output 1 --qps 3.0 [--off-first]

A window deep in the trace (where its hit rate has settled): ``--warm-requests 3000
--warm-shared-only`` prefills only the prefixes the window shares with requests 1-3000, and
``--prompt-tokens-per-s 351`` offers the window's prompt tokens at the rate qps 3.0 offers the
window 301-450's, whatever the window's length.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from sglang_pd.bench.datasets import rate_offering
from sglang_pd.bench.host_usage import metric_sum, snapshot
from sglang_pd.bench.traces import TraceRecord, load_mooncake_jsonl
from sglang_pd.core.load_signals import BUSY_WINDOW_S
from sglang_pd.sim.prefix_cache import shared_prefixes
from sglang_pd.utils.server_procs import free_port, popen_own_group, stop, wait_healthy

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "data/traces/mooncake/conversation_trace.jsonl"
MOONCAKE_BLOCK = 512
VOCAB = 49152  # SmolLM2's vocabulary


Request = tuple[float, list[int], int]  # (arrival s, prompt ids, max new tokens)


def load_window(a: argparse.Namespace) -> tuple[list[TraceRecord], list[TraceRecord]]:
    """The trace's first ``a.warm_requests`` records (the warm-up) and the ``a.num_requests``
    after them (the measured window)."""
    recs = load_mooncake_jsonl(a.trace, a.warm_requests + a.num_requests)
    if len(recs) < a.warm_requests + a.num_requests:
        raise SystemExit(f"{a.trace} has only {len(recs)} requests")
    return recs[: a.warm_requests], recs[a.warm_requests:]


def prompt_ids(rec: TraceRecord, block_tokens: int, index: int) -> list[int]:
    """One fixed random block of ``block_tokens`` per hash_id (equal ids, equal tokens), cut to
    the prompt's scaled length; past the last block, tokens fresh to request ``index``."""
    n = max(-(-rec.input_len * block_tokens // MOONCAKE_BLOCK), 1)
    ids: list[int] = []
    for h in rec.hash_ids:
        ids += np.random.default_rng(h).integers(10, VOCAB, size=block_tokens).tolist()
    if len(ids) < n:
        ids += np.random.default_rng(10**9 + index).integers(10, VOCAB, size=n - len(ids)).tolist()
    return ids[:n]


def warm_hash_ids(a: argparse.Namespace, warm_recs: list[TraceRecord],
                  recs: list[TraceRecord]) -> list[tuple[int, int]]:
    """(warm index, blocks) per warm-up prompt: every prompt whole, or with
    ``--warm-shared-only`` only the prefixes the window shares (``shared_prefixes``; with
    ``--warm-bounded`` only those the engine's pool would still hold after the whole warm-up)."""
    if not a.warm_shared_only:
        return [(i, len(r.hash_ids)) for i, r in enumerate(warm_recs)]
    cap = a.max_total_tokens // a.block_tokens * MOONCAKE_BLOCK if a.warm_bounded else None
    return shared_prefixes([r.hash_ids for r in warm_recs], [r.hash_ids for r in recs], cap)


def build_requests(a: argparse.Namespace) -> tuple[list[list[int]], list[Request]]:
    """The warm-up's prompts, and the measured window's requests with arrivals (from 0)
    rescaled to a mean of ``a.qps`` (or to ``a.prompt_tokens_per_s`` offered), the trace's
    gaps kept in shape."""
    warm_recs, recs = load_window(a)
    warm = []
    for i, blocks in warm_hash_ids(a, warm_recs, recs):
        ids = prompt_ids(warm_recs[i], a.block_tokens, i)
        # a shared prefix is whole blocks (the tokens past a prompt's last id are its own)
        warm.append(ids[: blocks * a.block_tokens] if a.warm_shared_only else ids)
    window = [prompt_ids(r, a.block_tokens, a.warm_requests + i) for i, r in enumerate(recs)]
    if a.prompt_tokens_per_s:
        a.qps = rate_offering(a.prompt_tokens_per_s, list(map(len, window)), len(recs) - 1)  # qps: gaps per span
    times = [r.arrival_s or 0.0 for r in recs]
    scale = (len(recs) - 1) / a.qps / max(times[-1] - times[0], 1e-9)
    out = [((t - times[0]) * scale, ids, max(1, min(r.output_len, a.max_output)))
           for t, r, ids in zip(times, recs, window)]
    return warm, out


async def one(client: httpx.AsyncClient, url: str, at: float, t0: float, ids: list[int],
              new: int) -> tuple[float, int, int]:
    """(TTFT s, cached tokens, prompt tokens) of one streamed /generate."""
    await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
    start = time.monotonic()
    body = {"input_ids": ids, "stream": True,
            "sampling_params": {"max_new_tokens": new, "temperature": 0, "ignore_eos": True}}
    first, cached = None, 0
    async with client.stream("POST", url + "/generate", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            if first is None:
                first = time.monotonic() - start
            cached = json.loads(line[5:])["meta_info"].get("cached_tokens", cached)
    assert first is not None, "no token streamed"
    return first, cached, len(ids)


async def warm_up(url: str, prompts: list[list[int]], concurrency: int) -> None:
    """Prefill each warm-up prompt (one output token), at most ``concurrency`` at a time, in
    trace order: untimed, the same work for the cache-on and cache-off servers."""
    gate = asyncio.Semaphore(concurrency)

    async def send(client: httpx.AsyncClient, ids: list[int]) -> None:
        async with gate:
            body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
            (await client.post(url + "/generate", json=body)).raise_for_status()

    async with httpx.AsyncClient(timeout=900) as client:
        await asyncio.gather(*(send(client, ids) for ids in prompts))


async def busy_seconds(url: str, client: httpx.AsyncClient, stop_at: asyncio.Event) -> tuple[float, float]:
    """Seconds the engine spent stepping until ``stop_at`` is set, and the longest /get_load
    answer (what the sum may have missed): /get_load's busy_fraction covers the last
    ``BUSY_WINDOW_S``, so one sample per window adds up without overlap (the last, partial
    window pro rata)."""
    slowest = 0.0

    async def busy() -> float:
        nonlocal slowest
        t = time.monotonic()
        load = (await client.get(url + "/get_load", timeout=30)).json()
        slowest = max(slowest, time.monotonic() - t)
        return float((load[0] if isinstance(load, list) else load).get("busy_fraction", 0.0)) * BUSY_WINDOW_S

    total, last = 0.0, time.monotonic()
    while True:
        try:
            await asyncio.wait_for(stop_at.wait(), BUSY_WINDOW_S - (time.monotonic() - last))
        except asyncio.TimeoutError:
            total, last = total + await busy(), time.monotonic()
            continue
        return total + await busy() * min(1.0, (time.monotonic() - last) / BUSY_WINDOW_S), slowest


async def replay(url: str, reqs: list[Request]) -> tuple[list[tuple[float, int, int]], tuple[float, float]]:
    """The measured window: per request (TTFT, cached, prompt tokens); the engine's busy s and
    the slowest load poll."""
    # no kept-alive connections: the trace's gaps outlast uvicorn's 5-s keep-alive, and a pooled
    # connection the server is closing just then fails the request (httpx.ReadError, seen once)
    limits = httpx.Limits(max_connections=len(reqs) + 8, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=900, limits=limits) as client:
        done = asyncio.Event()
        meter = asyncio.create_task(busy_seconds(url, client, done))
        t0 = time.monotonic() + 0.5
        res = await asyncio.gather(*(one(client, url, at, t0, ids, new) for at, ids, new in reqs))
        done.set()
        return list(res), await meter


def run_server(a: argparse.Namespace, model_dir: str, cache: bool, warm: list[list[int]], reqs: list[Request],
               log_dir: Path) -> dict:
    """One server: start, warm-up, then the window measured (none when ``reqs`` is empty: a
    priming run, only its warm-up's time and usage returned)."""
    port = free_port()
    cmd = [sys.executable, "-m", "sglang_pd.launch_server", "--model-path", model_dir, "--load-format", "dummy",
           "--skip-tokenizer-init", "--host", "127.0.0.1", "--port", str(port), "--mode", "colocated",
           "--page-size", str(a.block_tokens), "--max-total-tokens", str(a.max_total_tokens),
           "--chunked-prefill-size", "512", "--max-running-requests", "64", "--dtype", "float32",
           "--prefill-policy", a.prefill_policy]
    if not cache:
        cmd.append("--disable-radix-cache")
    log = open(log_dir / f"server{len(list(log_dir.iterdir()))}_{'on' if cache else 'off'}.log", "wb")
    proc = popen_own_group(cmd, log)
    boot = snapshot(proc.pid)
    url = f"http://127.0.0.1:{port}"
    try:
        if not wait_healthy(url, proc, 300):
            raise SystemExit(f"server did not start; see {log.name}")
        u0 = snapshot(proc.pid)
        usage_start = u0.since(boot)
        t = time.monotonic()
        asyncio.run(warm_up(url, warm, a.warm_concurrency))
        warm_s, t = time.monotonic() - t, time.monotonic()
        u1, steps0 = snapshot(proc.pid), step_seconds(url)
        if not reqs:
            return {"cache": cache, "warm_s": warm_s, "usage_start": usage_start, "usage_warm": u1.since(u0)}
        res, (busy, slowest_poll) = asyncio.run(replay(url, reqs))
        wall = time.monotonic() - t
        u2, steps1 = snapshot(proc.pid), step_seconds(url)
        load = httpx.get(url + "/get_load", timeout=30).json()
        load = load[0] if isinstance(load, list) else load
    finally:
        stop(proc)
        log.close()
    ttft = np.array([r[0] for r in res])
    span = max(reqs[-1][0] - reqs[0][0], 1e-9)
    return {"cache": cache, "hit_rate": sum(r[1] for r in res) / sum(r[2] for r in res),
            "hit_rate_with_warm": float(load.get("cache_hit_rate", 0.0)),
            "ttft_p50_s": float(np.percentile(ttft, 50)), "ttft_p90_s": float(np.percentile(ttft, 90)),
            # busy and load from the engine's own step seconds (/metrics): the /get_load polls
            # (busy_s) lose seconds whenever a poll answers late
            "wall_s": wall, "warm_s": warm_s, "busy_s": busy, "busy_share": (steps1 - steps0) / wall,
            "load": (steps1 - steps0) / span, "slowest_load_poll_s": slowest_poll, "step_s": steps1 - steps0,
            "usage_start": usage_start, "usage_warm": u1.since(u0), "usage_window": u2.since(u1), "ttft_s": ttft.round(3).tolist()}


def step_seconds(url: str) -> float:
    """The engine's stepping seconds so far (every step's wall time, /metrics)."""
    return metric_sum(httpx.get(url + "/metrics", timeout=30).text, "sglang:engine_step_seconds_sum")


def sim_hit_rates(a: argparse.Namespace) -> tuple[float, float, float | None]:
    """The window's hit-rate ceiling and the simulator's predicted hit rate, the cache holding as
    many 512-token blocks as the engine pool holds pages, both after the warm-up's prompts:
    (1) the ceiling: an unbounded cache (``replay_hit_rate``); (2) the simulator's prefix-cache
    model (sim/prefix_cache.py, the engine's RadixCache over hash_ids) fed the requests in arrival
    order, each prefill done before the next lookup (what the engine sees when it admits in
    arrival order, since it looks a hit up again until admission); (3) the whole simulator
    (``python -m sglang_pd.sim run``, one colocated instance, its cache warmed by the warm-up's
    records through ``--window``), which looks a hit up once, at arrival: requests that arrive
    together (the trace has many equal timestamps) miss what the others will cache. (3) is None
    when the window is longer than a non-empty warm-up (``--window`` cannot express it)."""
    from sglang_pd.sim.prefix_cache import replay_hit_rate

    cap = a.max_total_tokens // a.block_tokens * MOONCAKE_BLOCK
    warm_recs, recs = load_window(a)
    warm = [warm_recs[i].hash_ids[:k] for i, k in warm_hash_ids(a, warm_recs, recs)]
    window = [(r.hash_ids, r.input_len) for r in recs]
    ceiling, model = replay_hit_rate(warm, window), replay_hit_rate(warm, window, cap)
    if a.warm_requests and a.num_requests > a.warm_requests:
        return ceiling, model, None
    sel = ["--window", str(a.warm_requests), "--window-index", "1"] if a.warm_requests else []
    out = subprocess.run([sys.executable, "-m", "sglang_pd.sim", "run", "--trace", str(a.trace), *sel, "--limit",
                          str(a.num_requests), "--colocated", "1", "--prefill", "0", "--decode", "0",
                          "--prefix-cache-tokens", str(cap), "--kv-capacity-tokens", str(cap)],
                         capture_output=True, text=True, timeout=600)
    m = re.search(r"prefix hits ([0-9.]+)%", out.stdout)
    if m is None:
        raise SystemExit(f"simulator gave no hit rate:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return ceiling, model, float(m.group(1)) / 100


def parse_order(spec: str | None, off_first: bool) -> list[bool]:
    """The servers to run, in order, as cache on (True) / off (False): ``--order`` is a comma
    list of on/off; without it ``on,off,off,on`` (with ``--off-first`` ``off,on,on,off``): each
    side once early and once late, so that a drift of the machine's speed over the run falls on
    both sides alike."""
    if spec is None:
        return [False, True, True, False] if off_first else [True, False, False, True]
    names = [x.strip() for x in spec.split(",")]
    if not names or any(n not in ("on", "off") for n in names):
        raise SystemExit(f"--order takes a comma list of on/off, not {spec!r}")
    return [n == "on" for n in names]


def pooled(runs: list[dict]) -> tuple[float, float] | None:
    """TTFT p50 and p90 over every request of ``runs`` together (None without runs)."""
    if not runs:
        return None
    ttft = np.concatenate([np.asarray(r["ttft_s"], dtype=float) for r in runs])
    return float(np.percentile(ttft, 50)), float(np.percentile(ttft, 90))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", type=Path, default=TRACE)
    p.add_argument("--warm-requests", type=int, default=300,
                   help="replay the trace's first N prompts first (prefill only, untimed) to warm the cache")
    p.add_argument("--warm-shared-only", action="store_true",
                   help="warm up with only the prefixes the window shares with those prompts (the same "
                        "ceiling, a fraction of the work: for a window deep in the trace)")
    p.add_argument("--warm-bounded", action="store_true",
                   help="with --warm-shared-only: only the shared prefixes an LRU cache of --max-total-tokens "
                        "still holds after the whole warm-up (what the engine's pool would keep)")
    p.add_argument("--warm-concurrency", type=int, default=8, help="warm-up requests in flight at most")
    p.add_argument("--num-requests", type=int, default=150, help="measured window: the requests after the warm-up")
    p.add_argument("--qps", type=float, default=2.4, help="mean arrival rate after rescaling (req/s)")
    p.add_argument("--prompt-tokens-per-s", type=float, default=None,
                   help="set --qps so that the window offers this many prompt tokens per s (equal load "
                        "across windows of different lengths)")
    p.add_argument("--block-tokens", type=int, default=4, help="tokens per Mooncake block (512 in the trace)")
    p.add_argument("--max-output", type=int, default=4, help="output tokens cap per request")
    p.add_argument("--max-total-tokens", type=int, default=65536, help="engine KV pool (tokens)")
    p.add_argument("--off-first", action="store_true", help="order off,on,on,off instead of on,off,off,on")
    p.add_argument("--order", default=None, help="servers in order, a comma list of on/off (overrides --off-first)")
    p.add_argument("--prime-requests", type=int, default=None,
                   help="first run an unmeasured server through this many warm-up prompts (default: all of "
                        "--warm-requests; 0: no priming run)")
    p.add_argument("--prefill-policy", default="fcfs",
                   help="both servers' --prefill-policy (a policy that reads cached_len, e.g. sjf, ranks a "
                        "request with a hit by what it still has to compute)")
    p.add_argument("--out", type=Path, default=None, help="JSON file for the results")
    a = p.parse_args()
    if a.warm_requests < 0 or a.num_requests < 2 or a.warm_concurrency < 1 or a.qps <= 0:
        p.error("need --warm-requests >= 0, --num-requests >= 2, --warm-concurrency >= 1, --qps > 0")
    if a.warm_bounded and not a.warm_shared_only:
        p.error("--warm-bounded goes with --warm-shared-only")
    if a.prime_requests is not None and not 0 <= a.prime_requests <= a.warm_requests:
        p.error("need 0 <= --prime-requests <= --warm-requests")
    warm, reqs = build_requests(a)
    a.prime_requests = len(warm) if a.prime_requests is None else min(a.prime_requests, len(warm))
    ceiling, sim, sim_full = sim_hit_rates(a)
    shared = f", only the {len(warm)} prefixes the window shares" if a.warm_shared_only else ""
    shared += f" that a {a.max_total_tokens}-token pool keeps" if a.warm_shared_only and a.warm_bounded else ""
    print(f"Mooncake conversation trace: warm-up = requests 1-{a.warm_requests}{shared} (prefill only, untimed), "
          f"window = the next {len(reqs)} at {a.qps:g} req/s ({sum(len(r[1]) for r in reqs)} prompt tokens); "
          f"{a.block_tokens} tokens per block, <= {a.max_output} output tokens; SmolLM2-135M shape, dummy "
          f"weights, float32, CPU")
    print(f"window's ceiling: {ceiling:.1%} of its prompt tokens lie in leading blocks an earlier request sent")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(Path(tmp) / "smollm2")
        subprocess.run([sys.executable, "-m", "sglang_pd.tools.make_dummy_config", "smollm2-135m", model_dir],
                       check=True, capture_output=True)
        log_dir = Path(tempfile.mkdtemp(prefix="prefix_replay_"))
        order = parse_order(a.order, a.off_first)
        if a.prime_requests:
            # a first server runs slower on this host (see docs/prefix_cache.md): spend that on
            # a run nobody measures
            prime = run_server(a, model_dir, order[0], warm[:a.prime_requests], [], log_dir)
            print(f"  primed: a cache-{'on' if order[0] else 'off'} server, {a.prime_requests} warm-up "
                  f"prompts in {prime['warm_s']:.1f} s, server CPU {prime['usage_warm']['server_cpu_s']:.1f} s "
                  f"(not measured)", flush=True)
        runs = []
        for c in order:
            runs.append(run_server(a, model_dir, c, warm, reqs, log_dir))
            r = runs[-1]
            print(f"  done: cache {'on' if c else 'off'}, TTFT p50 {r['ttft_p50_s']:.3f} s, warm-up {r['warm_s']:.1f} s "
                  f"(server CPU {r['usage_warm']['server_cpu_s']:.1f} s), usage over the window "
                  f"{json.dumps({k: round(v, 1) for k, v in r['usage_window'].items()})}", flush=True)
    print(f"server logs in {log_dir}; busy = engine stepping s / window wall, load = stepping s / arrival span")
    print(f"{'cache':>6} {'hit rate':>9} {'TTFT p50 s':>11} {'TTFT p90 s':>11} {'wall s':>7} {'busy':>5} "
          f"{'load':>5} {'warm-up s':>9} {'step s':>7} {'srv cpu':>7} {'cli cpu':>7} {'other':>6} {'majflt':>6}")
    for r in runs:
        u = r["usage_window"]
        print(f"{'on' if r['cache'] else 'off':>6} {r['hit_rate']:>9.1%} {r['ttft_p50_s']:>11.3f} "
              f"{r['ttft_p90_s']:>11.3f} {r['wall_s']:>7.1f} {r['busy_share']:>5.2f} {r['load']:>5.2f} "
              f"{r['warm_s']:>9.1f} {r['step_s']:>7.1f} {u['server_cpu_s']:>7.1f} {u['client_cpu_s']:>7.1f} "
              f"{u['other_cpu_s']:>6.1f} {u['server_major_faults']:>6.0f}")
    on = pooled([r for r in runs if r["cache"]])
    off = pooled([r for r in runs if not r["cache"]])
    if on and off:
        print(f"TTFT p50 off/on: {off[0] / on[0]:.2f}x, p90 off/on: {off[1] / on[1]:.2f}x"
              f" (each side's runs pooled)")
    hit = next((r for r in runs if r["cache"]), runs[0])
    full = "n/a (window longer than the warm-up)" if sim_full is None else \
        f"{sim_full:.1%} ({100 * (sim_full - hit['hit_rate']):+.1f} points)"
    if sim_full is not None and a.warm_shared_only and not a.warm_bounded:
        full += " (every earlier request through the bounded pool, not the shared-only warm-up the engine had)"
    print(f"window hit rate: engine {hit['hit_rate']:.1%} (meta_info cached_tokens; with the warm-up "
          f"{hit['hit_rate_with_warm']:.1%}); simulator's cache model {sim:.1%} ({100 * (sim - hit['hit_rate']):+.1f} "
          f"points); whole simulator (lookup at arrival only) {full}")
    if a.out:
        a.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "runs": runs,
                                     "ceiling": ceiling, "sim_hit_rate": sim, "sim_full_hit_rate": sim_full},
                                    indent=1))


if __name__ == "__main__":
    main()
