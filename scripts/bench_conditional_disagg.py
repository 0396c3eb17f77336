#!/usr/bin/env python3
"""Conditional disaggregation's bar (issue 34 item 3): short prompts' TTFT while the prefill is
loaded, through a prefill (``--conditional-disagg off``) and prefilled on decode (``on``).

  python scripts/bench_conditional_disagg.py [--quick] [--rounds 2]

One prefill server (fcfs) and one decode server (continuous), SmolLM2-135M shape with dummy
weights (``--quick``: the tiny model), one thread each, and two of our routers in front of the
same servers, one per setting. Each round, through each router in turn (alternating which goes
first): ``--num-long`` long prompts at once load the prefill, then ``--num-short`` short prompts,
one every ``--short-gap-s``, streamed; a short's TTFT is its first byte. The same prompts go
through both routers, so their greedy outputs are compared too (equal expected). Prints a
table (short TTFT p50/p90, long TTFT p50, how many shorts were prefilled on decode) and writes
OUT/bench_conditional_disagg.json. Same machine, same servers, one run: read the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from sglang_pd.utils.server_procs import free_port, popen_own_group, stop, wait_healthy

REPO = Path(__file__).resolve().parents[1]


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def _prompt(n: int, salt: int) -> list[int]:
    return [3 + (j * 7919 + salt * 104729) % 6000 for j in range(n)]  # within the tiny model's vocab


async def _ttft(client: httpx.AsyncClient, url: str, ids: list[int], max_new: int
                ) -> tuple[float, float, list[int]]:
    """TTFT, TPOT (s) and the output ids of one streamed request."""
    body = {"input_ids": ids, "stream": True,
            "sampling_params": {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}}
    t0 = time.monotonic()
    first, last, t_last = None, None, t0
    async with client.stream("POST", url + "/generate", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                t_last = time.monotonic()
                first = first or t_last
                last = json.loads(line[5:])
    assert first is not None and last is not None, "no token came back"
    n = len(last["output_ids"])
    return first - t0, (t_last - first) / (n - 1) if n > 1 else 0.0, last["output_ids"]


async def one_round(url: str, args: argparse.Namespace, salt: int) -> dict:
    async with httpx.AsyncClient(timeout=args.request_timeout) as client:
        longs = [asyncio.create_task(_ttft(client, url, _prompt(args.long_len, salt * 100 + i), 4))
                 for i in range(args.num_long)]
        await asyncio.sleep(args.short_gap_s)  # the longs are queued on the prefill by now
        shorts = []
        for i in range(args.num_short):
            shorts.append(asyncio.create_task(
                _ttft(client, url, _prompt(args.short_len, salt * 100 + 50 + i), args.max_new)))
            await asyncio.sleep(args.short_gap_s)
        s, ln = await asyncio.gather(*shorts), await asyncio.gather(*longs)
    return {"short_ttft_s": [t for t, _, _ in s], "long_ttft_s": [t for t, _, _ in ln],
            "short_tpot_s": [p for _, p, _ in s], "short_outputs": [o for _, _, o in s]}


def _local_count(router_url: str) -> float:
    text = httpx.get(router_url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("sglang_pd_router_routed_requests_total{") and 'prefill="local"' in line)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the tiny model, 1 round (a smoke)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--num-long", type=int, default=3)
    ap.add_argument("--long-len", type=int, default=1536)
    ap.add_argument("--num-short", type=int, default=8)
    ap.add_argument("--short-len", type=int, default=64)
    ap.add_argument("--short-gap-s", type=float, default=0.25)
    ap.add_argument("--max-new", type=int, default=8)
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--model-dir", default=None)
    ap.add_argument("--log-dir", default=str(Path(tempfile.gettempdir()) / "bench_conditional_disagg"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--request-timeout", type=float, default=300.0)
    args = ap.parse_args(argv)
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", UCX_NET_DEVICES=os.environ.get("UCX_NET_DEVICES", "lo"),
               NIXL_LOG_LEVEL="WARN",
               PYTHONPATH=f"{REPO / 'python'}:{REPO / 'router'}:{os.environ.get('PYTHONPATH', '')}")
    if args.quick:
        args.rounds, args.model_dir = 1, args.model_dir or str(log_dir / "tiny")
    model = Path(args.model_dir) if args.model_dir else log_dir / "smollm2-135m"
    if not (model / "config.json").exists():
        tool = (["sglang_pd.tools.make_tiny_model", str(model), "--arch", "llama"] if args.quick
                else ["sglang_pd.tools.make_dummy_config", "smollm2-135m", str(model)])
        subprocess.run([sys.executable, "-m", *tool], check=True, env=env)
    common = [sys.executable, "-m", "sglang_pd.launch_server", "--model-path", str(model),
              "--load-format", "dummy", "--skip-tokenizer-init", "--page-size", "16",
              "--chunked-prefill-size", str(args.chunk), "--random-seed", "1",
              "--disable-radix-cache"]  # the same prompts go through both routers: no cache hits
    procs: list[subprocess.Popen] = []

    def popen(cmd: list[str], name: str) -> subprocess.Popen:
        with open(log_dir / f"{name}.log", "w") as f:
            procs.append(popen_own_group(cmd, f, env))
        return procs[-1]

    try:
        pport, boot, dport = free_port(), free_port(), free_port()
        p = popen([*common, "--mode", "prefill", "--prefill-policy", "fcfs", "--port", str(pport),
                   "--disaggregation-bootstrap-port", str(boot)], "prefill")
        d = popen([*common, "--mode", "decode", "--decode-policy", "continuous", "--port", str(dport)], "decode")
        for proc, port in ((p, pport), (d, dport)):
            if not wait_healthy(f"http://127.0.0.1:{port}", proc, 180):
                raise RuntimeError(f"server on {port} not healthy; logs in {log_dir}")
        routers = {}
        for setting in ("off", "on"):
            rport = free_port()
            rp = popen([sys.executable, "-m", "sglang_pd_router", "--pd-disaggregation",
                       "--prefill", f"http://127.0.0.1:{pport}", str(boot), "--decode", f"http://127.0.0.1:{dport}",
                       "--pool-controller", "off", "--log-level", "warning", "--port", str(rport),
                       "--conditional-disagg", setting], f"router_{setting}")
            routers[setting] = f"http://127.0.0.1:{rport}"
            if not wait_healthy(routers[setting], rp, 60):
                raise RuntimeError(f"router {setting} not healthy")
        res: dict[str, dict[str, list]] = {s: {"short_ttft_s": [], "long_ttft_s": [], "short_tpot_s": [], "short_outputs": []}
                                           for s in routers}
        for rnd in range(args.rounds):
            for setting in (("off", "on") if rnd % 2 == 0 else ("on", "off")):
                out = asyncio.run(one_round(routers[setting], args, salt=rnd))
                for k, v in out.items():
                    res[setting][k] += v
        local = {s: _local_count(u) for s, u in routers.items()}
    finally:
        for proc in reversed(procs):
            stop(proc)
    equal = res["on"]["short_outputs"] == res["off"]["short_outputs"]
    rows = []
    for s in ("off", "on"):
        st, lt = [1e3 * x for x in res[s]["short_ttft_s"]], [1e3 * x for x in res[s]["long_ttft_s"]]
        rows.append({"conditional_disagg": s, "short_ttft_p50_ms": statistics.median(st),
                     "short_ttft_p90_ms": _pct(st, 0.9), "long_ttft_p50_ms": statistics.median(lt),
                     "short_tpot_p50_ms": 1e3 * statistics.median(res[s]["short_tpot_s"]),
                     "shorts": len(st), "prefilled_on_decode": int(local[s])})
    print(f"{args.rounds} round(s): {args.num_long} x {args.long_len}-token prompts load the prefill, then "
          f"{args.num_short} x {args.short_len}-token prompts every {args.short_gap_s} s; model {model.name}; "
          f"load {os.getloadavg()[0]:.2f}")
    print("| --conditional-disagg | short TTFT p50 (ms) | short TTFT p90 (ms) | long TTFT p50 (ms) "
          "| short TPOT p50 (ms) | shorts on decode |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['conditional_disagg']} | {r['short_ttft_p50_ms']:.0f} | {r['short_ttft_p90_ms']:.0f} | "
              f"{r['long_ttft_p50_ms']:.0f} | {r['short_tpot_p50_ms']:.1f} | {r['prefilled_on_decode']}/{r['shorts']} |")
    ratio = rows[1]["short_ttft_p50_ms"] / rows[0]["short_ttft_p50_ms"]
    print(f"short TTFT p50 on/off: {ratio:.2f}; short outputs equal across the two paths: {equal}")
    out_dir = Path(args.out) if args.out else log_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench_conditional_disagg.json").write_text(json.dumps(
        {"argv": sys.argv[1:], "rows": rows, "outputs_equal": equal}, indent=1) + "\n")
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
