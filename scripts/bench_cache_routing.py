"""Cache-aware routing vs ``length_aware`` alone, two prefill instances (issue 30 bar).

    flock /tmp/cpu.lock python scripts/bench_cache_routing.py [--conversations 8 --turns 4]

One cluster (2 prefill servers of role ``both`` + 1 decode server, SmolLM2-135M shape with dummy
weights, radix cache on, as servers start by default) stays up; our router is started in front of
it once per policy (``--prefill-policy length_aware``, then ``cache_aware``: length_aware's pools
and queue cost with the expected prefix hit taken out, policies/cache_aware.py), with every cache
flushed before each run. The workload is a synthetic multi-turn chat replay, identical for both
runs: ``--conversations`` conversations, staggered by ``--stagger`` s, each of ``--turns`` turns
sent closed loop (a turn goes out ``--think`` s after the previous answer). A turn's prompt is
the whole history: a system prompt shared by all conversations, then per turn a user message
and an assistant reply (fixed random tokens per conversation and turn, so both runs send the
same ids, and a turn's prompt extends the previous one: a hit where the history is cached).

Per run: the hit rate over both prefills (``sglang:cached_tokens_total`` /
``sglang:prompt_tokens_total`` deltas of their /metrics), requests per prefill, TTFT p50/p90 of
short and long prompts (the router's class boundary, ``--short-threshold``), errors. ``--quick``
is a smoke (2 layers, 2 conversations of 2 turns); ``--out`` writes the JSON result.

Decode steering (``--decodes 2 --decode-reuse``, runs named ``PREFILL/DECODE`` in ``--order``,
e.g. ``cache_aware/power_of_two,cache_aware/cache_aware``): the decodes keep finished requests'
KV (``--disaggregation-decode-enable-radix-cache``) and each run also reports the KV bytes the
prefills sent and the bytes decode-side reuse spared them (their /get_load counters).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from sglang_pd.utils.server_procs import free_port, popen_own_group, stop, wait_healthy

REPO = Path(__file__).resolve().parents[1]
VOCAB = 49152  # SmolLM2's vocabulary
POLICIES = ("length_aware", "cache_aware")


def _toks(seed: tuple[int, ...], lo: int, hi: int, vocab: int) -> list[int]:
    rng = np.random.default_rng(list(seed))
    return rng.integers(10, vocab, size=int(rng.integers(lo, hi + 1))).tolist()


def build_conversations(a: argparse.Namespace) -> list[list[list[int]]]:
    """Per conversation, the prompt of each turn (each extends the one before)."""
    system = _toks((a.seed, 0), a.system_tokens, a.system_tokens, a.vocab)
    convs = []
    for c in range(a.conversations):
        history, turns = list(system), []
        for t in range(a.turns):
            lo, hi = (a.first_user_min, a.first_user_max) if t == 0 else (a.user_min, a.user_max)
            history += _toks((a.seed, 1, c, t), lo, hi, a.vocab)
            turns.append(list(history))
            history += _toks((a.seed, 2, c, t), a.max_new_tokens, a.max_new_tokens, a.vocab)  # the reply
        convs.append(turns)
    return convs


async def one_turn(client: httpx.AsyncClient, url: str, ids: list[int], new: int) -> float:
    """TTFT (s) of one streamed /generate through the router."""
    start = time.monotonic()
    body = {"input_ids": ids, "stream": True,
            "sampling_params": {"max_new_tokens": new, "temperature": 0, "ignore_eos": True}}
    first = None
    async with client.stream("POST", url + "/generate", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            if '"error"' in line:
                raise RuntimeError(line[:200])
            if first is None:
                first = time.monotonic() - start
    if first is None:
        raise RuntimeError("no token streamed")
    return first


async def conversation(client: httpx.AsyncClient, url: str, turns: list[list[int]], delay: float,
                       a: argparse.Namespace, out: list[tuple[int, float | None, str]]) -> None:
    await asyncio.sleep(delay)
    for ids in turns:
        try:
            out.append((len(ids), await one_turn(client, url, ids, a.max_new_tokens), ""))
        except (httpx.HTTPError, RuntimeError) as e:
            out.append((len(ids), None, f"{type(e).__name__}: {e}"[:200]))
        await asyncio.sleep(a.think)


async def replay(url: str, convs: list[list[list[int]]], a: argparse.Namespace) -> list:
    out: list[tuple[int, float | None, str]] = []
    async with httpx.AsyncClient(timeout=a.request_timeout) as client:
        await asyncio.gather(*(conversation(client, url, t, i * a.stagger, a, out)
                               for i, t in enumerate(convs)))
    return out


METRIC = re.compile(r'^(sglang:(?:cached_tokens|prompt_tokens|num_requests)_total)\{[^}]*\} ([0-9.e+]+)$',
                    re.M)


def counters(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=30).text
    return {m.group(1).split(":")[1].removesuffix("_total"): float(m.group(2)) for m in METRIC.finditer(text)}


def pct(xs: list[float], q: float) -> float | None:
    return float(np.percentile(xs, q)) if xs else None


def transfer_bytes(url: str) -> tuple[float, float]:
    """(KV bytes sent, bytes decode-side reuse spared) by a prefill so far."""
    load = httpx.get(url + "/get_load", timeout=30).json()
    load = load[0] if isinstance(load, list) else load
    return float(load.get("kv_transfer_bytes_total", 0)), float(load.get("kv_transfer_skipped_bytes_total", 0))


def run_policy(run: str, a: argparse.Namespace, prefills: list[tuple[str, int]], decodes: list[str],
               convs: list[list[list[int]]], env: dict[str, str], log_dir: Path) -> dict:
    policy, _, decode_policy = run.partition("/")
    for u in [p for p, _ in prefills] + decodes:
        httpx.post(u + "/flush_cache", timeout=30)
    before = [counters(u) for u, _ in prefills]
    before_d = [counters(u) for u in decodes]
    xfer0 = [transfer_bytes(u) for u, _ in prefills]
    port = free_port()
    cmd = [sys.executable, "-m", "sglang_pd_router", "--pd-disaggregation",
           "--host", "127.0.0.1", "--port", str(port), "--prefill-policy", policy,
           "--short-prefill-threshold", str(a.short_threshold), "--pool-controller", "off",
           "--log-level", "warning"]
    for u, boot in prefills:
        cmd += ["--prefill", u, str(boot)]
    for u in decodes:
        cmd += ["--decode", u]
    if decode_policy:
        cmd += ["--decode-policy", decode_policy]
    name = run.replace("/", "+")
    with open(log_dir / f"router_{name}.log", "w") as log:
        router = popen_own_group(cmd, log, env)
    url = f"http://127.0.0.1:{port}"
    try:
        if not wait_healthy(url, router, a.startup_timeout):
            raise SystemExit(f"router ({run}) did not start; see {log_dir}/router_{name}.log")
        t = time.monotonic()
        res = asyncio.run(replay(url, convs, a))
        wall = time.monotonic() - t
    finally:
        stop(router)
    after = [counters(u) for u, _ in prefills]
    after_d = [counters(u) for u in decodes]
    xfer = [(s1 - s0, k1 - k0) for (s0, k0), (s1, k1) in zip(xfer0, (transfer_bytes(u) for u, _ in prefills))]
    d = [{k: after[i].get(k, 0.0) - before[i].get(k, 0.0) for k in after[i]} for i in range(len(prefills))]
    prompt = sum(x.get("prompt_tokens", 0.0) for x in d)
    cached = sum(x.get("cached_tokens", 0.0) for x in d)
    out: dict = {"policy": run, "hit_rate": cached / prompt if prompt else 0.0,
                 "cached_tokens": cached, "prompt_tokens": prompt, "wall_s": wall,
                 "requests_per_prefill": [int(x.get("num_requests", 0)) for x in d],
                 "requests_per_decode": [int(y.get("num_requests", 0) - x.get("num_requests", 0))
                                         for x, y in zip(before_d, after_d)],
                 "kv_bytes_sent": sum(x[0] for x in xfer), "kv_bytes_spared": sum(x[1] for x in xfer),
                 "requests": len(res), "errors": [e for _, _, e in res if e],
                 "samples": [(n, t) for n, t, _ in res if t is not None]}
    return with_classes(out, a.short_threshold)


def with_classes(out: dict, threshold: int) -> dict:
    """``out`` with short/long TTFT percentiles of its (prompt tokens, TTFT) samples."""
    for cls, keep in (("short", lambda n: n <= threshold), ("long", lambda n: n > threshold)):
        ttft = [t for n, t in out["samples"] if keep(n)]
        out[cls] = {"n": len(ttft), "ttft_p50_s": pct(ttft, 50), "ttft_p90_s": pct(ttft, 90)}
    return out


def pooled(runs: list[dict], threshold: int) -> list[dict]:
    """Per policy, the runs of it together: hit rate over all their prompt tokens, TTFT
    percentiles over all their requests (``--repeat``)."""
    out = []
    for name in dict.fromkeys(r["policy"] for r in runs):
        rs = [r for r in runs if r["policy"] == name]
        prompt, cached = sum(r["prompt_tokens"] for r in rs), sum(r["cached_tokens"] for r in rs)
        out.append(with_classes({
            "policy": name, "hit_rate": cached / prompt if prompt else 0.0, "cached_tokens": cached,
            "prompt_tokens": prompt, "wall_s": sum(r["wall_s"] for r in rs),
            "requests_per_prefill": [sum(x) for x in zip(*(r["requests_per_prefill"] for r in rs))],
            "requests_per_decode": [sum(x) for x in zip(*(r["requests_per_decode"] for r in rs))],
            "kv_bytes_sent": sum(r["kv_bytes_sent"] for r in rs),
            "kv_bytes_spared": sum(r["kv_bytes_spared"] for r in rs),
            "requests": sum(r["requests"] for r in rs), "errors": [e for r in rs for e in r["errors"]],
            "samples": [x for r in rs for x in r["samples"]]}, threshold))
    return out


def start_servers(a: argparse.Namespace, model: str, env: dict[str, str], log_dir: Path,
                  procs: list[subprocess.Popen]) -> tuple[list[tuple[str, int]], list[str]]:
    common = [sys.executable, "-m", "sglang_pd.launch_server", "--model-path", model, "--load-format", "dummy",
              "--skip-tokenizer-init", "--host", "127.0.0.1", "--page-size", "16",
              "--chunked-prefill-size", str(a.chunk), "--short-prefill-threshold", str(a.short_threshold),
              "--max-total-tokens", str(a.max_total_tokens), "--random-seed", "1"]
    prefills, urls = [], []
    for i in range(2):
        port, boot = free_port(), free_port()
        with open(log_dir / f"prefill{i}.log", "w") as log:
            procs.append(popen_own_group([*common, "--mode", "prefill", "--port", str(port),
                                           "--disaggregation-bootstrap-port", str(boot)], log, env))
        prefills.append((f"http://127.0.0.1:{port}", boot))
        urls.append(prefills[-1][0])
    reuse = ["--disaggregation-decode-enable-radix-cache"] if a.decode_reuse else []
    for i in range(a.decodes):
        port = free_port()
        with open(log_dir / f"decode{i}.log", "w") as log:
            procs.append(popen_own_group([*common, "--mode", "decode", "--port", str(port), *reuse], log, env))
        urls.append(f"http://127.0.0.1:{port}")
    for u, p in zip(urls, procs):
        if not wait_healthy(u, p, a.startup_timeout):
            raise SystemExit(f"{u} did not start (rc={p.poll()}); logs in {log_dir}")
    return prefills, urls[2:]


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--conversations", type=int, default=8)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--system-tokens", type=int, default=32, help="system prompt shared by all conversations")
    p.add_argument("--first-user-min", type=int, default=64)
    p.add_argument("--first-user-max", type=int, default=192)
    p.add_argument("--user-min", type=int, default=48, help="later turns' user message, tokens")
    p.add_argument("--user-max", type=int, default=160)
    p.add_argument("--max-new-tokens", type=int, default=8, help="reply length (the history adds as many)")
    p.add_argument("--stagger", type=float, default=0.4, help="s between conversation starts")
    p.add_argument("--think", type=float, default=0.3, help="s between an answer and the next turn")
    p.add_argument("--short-threshold", type=int, default=256, help="prompts of at most this many tokens are short")
    p.add_argument("--chunk", type=int, default=512, help="--chunked-prefill-size")
    p.add_argument("--max-total-tokens", type=int, default=65536)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--vocab", type=int, default=VOCAB)
    p.add_argument("--order", default=",".join(POLICIES),
                   help="runs in order: a prefill policy, or PREFILL/DECODE policies")
    p.add_argument("--repeat", type=int, default=1, help="run the order this many times (alternately reversed)")
    p.add_argument("--decodes", type=int, default=1, help="decode servers")
    p.add_argument("--decode-reuse", action="store_true",
                   help="decode servers keep finished requests' KV (decode-side reuse)")
    p.add_argument("--model-dir", default=None, help="default: make_dummy_config smollm2-135m (--quick: 2 layers)")
    p.add_argument("--startup-timeout", type=float, default=240.0)
    p.add_argument("--request-timeout", type=float, default=300.0)
    p.add_argument("--quick", action="store_true", help="smoke: 2 layers, 2 conversations x 2 turns")
    p.add_argument("--out", type=Path, default=None, help="JSON file for the result")
    a = p.parse_args(argv)
    if a.quick:
        a.conversations, a.turns, a.stagger, a.think, a.max_new_tokens = 2, 2, 0.0, 0.0, 2
    order = [x.strip() for x in a.order.split(",") if x.strip()]
    known = POLICIES + ("round_robin", "power_of_two", "length_aware_spill")
    if not order or any(x not in known for o in order for x in o.split("/", 1)) or a.decodes < 1 or a.repeat < 1:
        p.error(f"--order: PREFILL[/DECODE] policies of {known}; --decodes >= 1")
    env = dict(os.environ, OMP_NUM_THREADS="1", UCX_NET_DEVICES=os.environ.get("UCX_NET_DEVICES", "lo"),
               NIXL_LOG_LEVEL="WARN",
               PYTHONPATH=f"{REPO / 'python'}:{REPO / 'router'}:{os.environ.get('PYTHONPATH', '')}")
    log_dir = Path(tempfile.mkdtemp(prefix="cache_routing_"))
    model = a.model_dir
    if model is None:
        model = str(log_dir / "model")
        subprocess.run([sys.executable, "-m", "sglang_pd.tools.make_dummy_config", "smollm2-135m", model],
                       check=True, capture_output=True, env=env)
        if a.quick:  # the same shape with 2 layers: a smoke, not a measurement
            cfg = json.loads((Path(model) / "config.json").read_text())
            (Path(model) / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 2}))
    convs = build_conversations(a)
    procs: list[subprocess.Popen] = []
    try:
        prefills, decodes = start_servers(a, model, env, log_dir, procs)
        # --repeat: the order, then reversed, alternately (ABBA...): drift of a shared machine
        # falls on both policies alike
        seq = [x for i in range(a.repeat) for x in (order if i % 2 == 0 else order[::-1])]
        runs = [run_policy(run, a, prefills, decodes, convs, env, log_dir) for run in seq]
    finally:
        for proc in reversed(procs):
            stop(proc)
    n = sum(len(c) for c in convs)
    toks = sum(len(t) for c in convs for t in c)
    print(f"{a.conversations} conversations x {a.turns} turns ({n} requests, {toks} prompt tokens), "
          f"short <= {a.short_threshold} tokens; 2 prefill (role both) + {a.decodes} decode"
          f"{' (decode-side reuse on)' if a.decode_reuse else ''}, "
          f"SmolLM2-135M shape{' (2 layers)' if a.quick else ''}, dummy weights, CPU; logs in {log_dir}")
    pool = pooled(runs, a.short_threshold) if a.repeat > 1 else []
    w = max(13, *(len(r["policy"]) for r in runs)) + (9 if pool else 0)
    print(f"{'run':>{w}} {'hit rate':>9} {'per prefill':>12} {'short n':>7} {'p50 s':>7} {'p90 s':>7} "
          f"{'long n':>6} {'p50 s':>7} {'p90 s':>7} {'errors':>6} {'wall s':>7}")
    rows = [(r["policy"], r) for r in runs] + [(f"{r['policy']} (pooled)", r) for r in pool]
    for name, r in rows:
        s, lg = r["short"], r["long"]
        print(f"{name:>{w}} {r['hit_rate']:>9.1%} {r['requests_per_prefill']!s:>12} {s['n']:>7} "
              f"{fmt(s['ttft_p50_s']):>7} {fmt(s['ttft_p90_s']):>7} {lg['n']:>6} {fmt(lg['ttft_p50_s']):>7} "
              f"{fmt(lg['ttft_p90_s']):>7} {len(r['errors']):>6} {r['wall_s']:>7.1f}")
    if a.decodes > 1 or a.decode_reuse:
        for name, r in rows:
            sent, spared = r["kv_bytes_sent"], r["kv_bytes_spared"]
            print(f"{name:>{w}}: requests per decode {r['requests_per_decode']}, KV sent {sent / 1e6:.1f} MB, "
                  f"spared by decode reuse {spared / 1e6:.1f} MB ({spared / max(sent + spared, 1):.1%})")
    for r in runs:
        for e in r["errors"][:3]:
            print(f"  [{r['policy']}] {e}")
    if a.out:
        a.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "runs": runs, "pooled": pool}, indent=1))
    return 0 if all(not r["errors"] and r["requests"] == n for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
