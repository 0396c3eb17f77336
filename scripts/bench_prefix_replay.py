"""Mooncake conversation replay, prefix cache on vs off on the same server build (issue 30 bar).

The first ``--num-requests`` of Mooncake's conversation trace, scaled to a CPU: each 512-token
``hash_id`` block becomes ``--block-tokens`` tokens (one fixed random block per id: equal ids,
equal tokens, so prefixes hit exactly where the trace says) and the engine's page is one block;
outputs are capped at ``--max-output``; arrivals keep the trace's shape, rescaled to ``--qps``.
One colocated server (SmolLM2-135M shape, dummy weights) runs the replay twice: with its radix
cache, then with ``--disable-radix-cache``. Per run: the engine's hit rate (/get_load
``cache_hit_rate``: cached / admitted prompt tokens) and TTFT p50/p90 (streamed first token).
The simulator predicts the hit rate of the same requests over the same hash_ids (512-token
blocks, capacity = the engine pool in blocks): its cache model alone, and the whole simulator
(``sim_hit_rates`` says how they differ).

    flock /tmp/cpu.lock python scripts/bench_prefix_replay.py --num-requests 200 --qps 1.0
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_procs import free_port, stop, wait_healthy

from sglang_pd.bench.traces import load_mooncake_jsonl

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "data/traces/mooncake/conversation_trace.jsonl"
MOONCAKE_BLOCK = 512
VOCAB = 49152  # SmolLM2's vocabulary


def build_requests(a: argparse.Namespace) -> list[tuple[float, list[int], int]]:
    """(arrival s, prompt ids, max new tokens) per request, arrivals rescaled to ``a.qps``."""
    recs = load_mooncake_jsonl(a.trace, a.num_requests)
    t0 = recs[0].arrival_s
    span = max(recs[-1].arrival_s - t0, 1e-9)
    scale = (len(recs) - 1) / a.qps / span  # mean rate a.qps, the trace's gaps kept in shape
    out = []
    for r in recs:
        n = max(-(-r.input_len * a.block_tokens // MOONCAKE_BLOCK), 1)
        ids: list[int] = []
        for h in r.hash_ids:
            ids += np.random.default_rng(h).integers(10, VOCAB, size=a.block_tokens).tolist()
        if len(ids) < n:  # past the last block: fresh tokens
            ids += np.random.default_rng(10**9 + len(out)).integers(10, VOCAB, size=n - len(ids)).tolist()
        out.append(((r.arrival_s - t0) * scale, ids[:n], max(1, min(r.output_len, a.max_output))))
    return out


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


async def replay(url: str, reqs: list[tuple[float, list[int], int]]) -> list[tuple[float, int, int]]:
    async with httpx.AsyncClient(timeout=900, limits=httpx.Limits(max_connections=len(reqs) + 8)) as client:
        t0 = time.monotonic() + 0.5
        return await asyncio.gather(*(one(client, url, at, t0, ids, new) for at, ids, new in reqs))


def run_server(a: argparse.Namespace, model_dir: str, cache: bool, reqs, log_dir: Path) -> dict:
    port = free_port()
    cmd = [sys.executable, "-m", "sglang_pd.launch_server", "--model-path", model_dir, "--load-format", "dummy",
           "--skip-tokenizer-init", "--host", "127.0.0.1", "--port", str(port), "--mode", "colocated",
           "--page-size", str(a.block_tokens), "--max-total-tokens", str(a.max_total_tokens),
           "--chunked-prefill-size", "512", "--max-running-requests", "64", "--dtype", "float32"]
    if not cache:
        cmd.append("--disable-radix-cache")
    log = open(log_dir / f"server_{'on' if cache else 'off'}.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        if not wait_healthy(url, proc, 300):
            raise SystemExit(f"server did not start; see {log.name}")
        t = time.monotonic()
        res = asyncio.run(replay(url, reqs))
        wall = time.monotonic() - t
        load = httpx.get(url + "/get_load", timeout=30).json()
        load = load[0] if isinstance(load, list) else load
    finally:
        stop(proc)
        log.close()
    ttft = np.array([r[0] for r in res])
    return {"cache": cache, "hit_rate": float(load.get("cache_hit_rate", 0.0)),
            "hit_rate_meta": sum(r[1] for r in res) / sum(r[2] for r in res),
            "ttft_p50_s": float(np.percentile(ttft, 50)), "ttft_p90_s": float(np.percentile(ttft, 90)),
            "wall_s": wall}


def sim_hit_rates(a: argparse.Namespace) -> tuple[float, float]:
    """The simulator's predicted hit rate, two ways, both with a cache holding as many 512-token
    blocks as the engine pool holds pages: (1) its prefix-cache model (sim/prefix_cache.py, the
    engine's RadixCache over hash_ids) fed the requests in arrival order, each prefill done
    before the next lookup (what the engine sees when it admits in arrival order, since it
    looks a hit up again until admission); (2) the whole simulator (``python -m sglang_pd.sim
    run``, one colocated instance), which looks a hit up once, at arrival: requests that arrive
    together (the trace has many equal timestamps) miss what the others will cache."""
    from sglang_pd.sim.prefix_cache import PrefixCache

    cap = a.max_total_tokens // a.block_tokens * MOONCAKE_BLOCK
    model = PrefixCache(cap)
    for r in load_mooncake_jsonl(a.trace, a.num_requests):
        model.match(r.hash_ids, r.input_len)
        model.insert(r.hash_ids)
    out = subprocess.run([sys.executable, "-m", "sglang_pd.sim", "run", "--trace", str(a.trace), "--limit",
                          str(a.num_requests), "--colocated", "1", "--prefill", "0", "--decode", "0",
                          "--prefix-cache-tokens", str(cap), "--kv-capacity-tokens", str(cap)],
                         capture_output=True, text=True, timeout=600)
    m = re.search(r"prefix hits ([0-9.]+)%", out.stdout)
    if m is None:
        raise SystemExit(f"simulator gave no hit rate:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return model.hit_rate, float(m.group(1)) / 100


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", type=Path, default=TRACE)
    p.add_argument("--num-requests", type=int, default=200)
    p.add_argument("--qps", type=float, default=1.0, help="mean arrival rate after rescaling (req/s)")
    p.add_argument("--block-tokens", type=int, default=16, help="tokens per Mooncake block (512 in the trace)")
    p.add_argument("--max-output", type=int, default=4, help="output tokens cap per request")
    p.add_argument("--max-total-tokens", type=int, default=65536, help="engine KV pool (tokens)")
    p.add_argument("--off-first", action="store_true", help="run the cache-off server first")
    p.add_argument("--out", type=Path, default=None, help="JSON file for the results")
    a = p.parse_args()
    reqs = build_requests(a)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(Path(tmp) / "smollm2")
        subprocess.run([sys.executable, "-m", "sglang_pd.tools.make_dummy_config", "smollm2-135m", model_dir],
                       check=True, capture_output=True)
        log_dir = Path(tempfile.mkdtemp(prefix="prefix_replay_"))
        order = (False, True) if a.off_first else (True, False)  # alternate to see machine drift
        runs = sorted((run_server(a, model_dir, c, reqs, log_dir) for c in order), key=lambda r: not r["cache"])
    sim, sim_full = sim_hit_rates(a)
    on, off = runs
    prompt_toks = sum(len(r[1]) for r in reqs)
    print(f"Mooncake conversation trace, first {len(reqs)} requests, {a.block_tokens} tokens per block "
          f"({prompt_toks} prompt tokens), <= {a.max_output} output tokens, {a.qps:g} req/s; "
          f"SmolLM2-135M shape, dummy weights, float32, CPU; server logs in {log_dir}")
    print(f"{'cache':>6} {'hit rate':>9} {'TTFT p50 s':>11} {'TTFT p90 s':>11} {'wall s':>7}")
    for r in runs:
        print(f"{'on' if r['cache'] else 'off':>6} {r['hit_rate']:>9.1%} {r['ttft_p50_s']:>11.3f} "
              f"{r['ttft_p90_s']:>11.3f} {r['wall_s']:>7.1f}")
    print(f"TTFT p50 off/on: {off['ttft_p50_s'] / on['ttft_p50_s']:.2f}x, p90 off/on: "
          f"{off['ttft_p90_s'] / on['ttft_p90_s']:.2f}x")
    print(f"hit rate: engine {on['hit_rate']:.1%} (per-request meta_info {on['hit_rate_meta']:.1%}); "
          f"simulator's cache model {sim:.1%} ({100 * (sim - on['hit_rate']):+.1f} points); whole simulator "
          f"(lookup at arrival only) {sim_full:.1%} ({100 * (sim_full - on['hit_rate']):+.1f} points)")
    if a.out:
        a.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "runs": runs,
                                     "sim_hit_rate": sim, "sim_full_hit_rate": sim_full}, indent=1))


if __name__ == "__main__":
    main()
