#!/usr/bin/env python3
"""Issue 28's real-server bar: two 1,200-token prompts on a colocated server whose KV pool holds
1,600 tokens, the newer one with a 0.5 s TTFT SLO arriving during the older's prefill. Before
the progress rule (core/progress.py) edf, lars, lrs and kairos+ answered neither within 120 s.

Per prefill policy and queue mode: start ``sglang_pd.launch_server`` (SmolLM2-135M shape, dummy
weights, ``--page-size 16 --max-total-tokens 1600 --chunked-prefill-size 512
--max-prefill-tokens 1024``), send the older prompt, the newer ``--gap-s`` later, and print each
one's HTTP status and seconds to its answer. Exit status 1 if any answer is not 200.

  flock /tmp/cpu.lock python scripts/check_tight_pool.py [--policies edf,lars] [--queues single,dual]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
from sglang_pd.scheduling.registry import PREFILL_POLICIES  # noqa: E402
from sglang_pd.utils.server_procs import free_port, popen_own_group, stop, wait_healthy  # noqa: E402

POOL_FLAGS = ["--page-size", "16", "--max-total-tokens", "1600", "--chunked-prefill-size", "512",
              "--max-prefill-tokens", "1024"]


def ask(url: str, ids: list[int], slo_ms: float | None, timeout_s: float, out: dict, key: str) -> None:
    body: dict = {"input_ids": ids, "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}}
    if slo_ms is not None:
        body["slo"] = {"ttft_ms": slo_ms}
    t0 = time.monotonic()
    try:
        r = httpx.post(f"{url}/generate", json=body, timeout=timeout_s)
        out[key] = (r.status_code, time.monotonic() - t0)
    except httpx.HTTPError as exc:
        out[key] = (f"{type(exc).__name__}", time.monotonic() - t0)


def run_one(policy: str, queues: str, model_dir: Path, log_dir: Path, args: argparse.Namespace) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = log_dir / f"server_{policy.replace('+', '_plus')}_{queues}.log"
    cmd = [sys.executable, "-m", "sglang_pd.launch_server", "--model-path", str(model_dir), "--load-format",
           "dummy", "--skip-tokenizer-init", "--port", str(port), "--prefill-policy", policy,
           "--prefill-queues", queues, "--watchdog-timeout", "60", *POOL_FLAGS]
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'python'}:{os.environ.get('PYTHONPATH', '')}")
    out: dict = {}
    with open(log, "w") as logf:
        proc = popen_own_group(cmd, logf, env)
        try:
            if not wait_healthy(url, proc, 300):
                return {"older": ("no server", 0.0), "newer": ("no server", 0.0)}
            older = threading.Thread(target=ask, args=(url, [11 + i % 4000 for i in range(1200)], None,
                                                       args.timeout_s, out, "older"))
            newer = threading.Thread(target=ask, args=(url, [17 + i % 3000 for i in range(1200)], 500.0,
                                                       args.timeout_s, out, "newer"))
            older.start()
            time.sleep(args.gap_s)  # the newer arrives during the older's chunked prefill
            newer.start()
            older.join()
            newer.join()
        finally:
            stop(proc)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policies", default=",".join(sorted(PREFILL_POLICIES)))
    ap.add_argument("--queues", default="single,dual")
    ap.add_argument("--gap-s", type=float, default=0.15, help="seconds between the two requests")
    ap.add_argument("--timeout-s", type=float, default=120.0)
    args = ap.parse_args()
    log_dir = Path(tempfile.mkdtemp(prefix="tight_pool_"))
    model_dir = log_dir / "smollm2-135m"
    subprocess.run([sys.executable, "-m", "sglang_pd.tools.make_dummy_config", "smollm2-135m", str(model_dir)],
                   check=True, env=dict(os.environ, PYTHONPATH=str(REPO / "python")))
    bad = 0
    print(f"{'policy':10} {'queues':7} {'older':>14} {'newer':>14}   (status, seconds)", flush=True)
    for policy in args.policies.split(","):
        for queues in args.queues.split(","):
            res = run_one(policy, queues, model_dir, log_dir, args)
            o, n = res.get("older", ("-", 0.0)), res.get("newer", ("-", 0.0))
            bad += o[0] != 200 or n[0] != 200
            print(f"{policy:10} {queues:7} {o[0]!s:>6} {o[1]:6.2f} s {n[0]!s:>6} {n[1]:6.2f} s", flush=True)
    print(f"logs: {log_dir}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
