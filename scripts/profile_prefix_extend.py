"""Engine step time of prefills over a cached prefix vs plain prefills of the same new tokens
(issue 30: does a prefix hit save the engine's stepping?).

One colocated server (SmolLM2-135M shape, dummy weights, CPU, float32) and three kinds of
groups of ``--concurrency`` prompts sent together, one output token each, ``--requests``
groups of each kind, interleaved:
  full:   fresh prompts of N tokens (nothing cached);
  prefix: prompts whose first P tokens are the full phase's prompts' first P (cached), then
          N - P new tokens;
  new:    fresh prompts of N - P tokens (what the prefix phase computes, with no prefix).
Per phase: the engine's stepping seconds (``sglang:engine_step_seconds`` sum), steps, cached
tokens (``meta_info``), and the client's wall time. With the cache working, prefix ~ new.

    flock /tmp/cpu.lock python scripts/profile_prefix_extend.py --tokens 232 --prefix 72
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from sglang_pd.utils.server_procs import free_port, popen_own_group, stop, wait_healthy

VOCAB = 49152
STEP_SUM = re.compile(r'^sglang:engine_step_seconds_(sum|count)\{[^}]*mode="(\w+)"[^}]*\} (\S+)$', re.M)


def step_totals(url: str) -> tuple[float, float]:
    """(stepping seconds, steps) over every mode so far."""
    secs = steps = 0.0
    for kind, _mode, value in STEP_SUM.findall(httpx.get(url + "/metrics", timeout=30).text):
        if kind == "sum":
            secs += float(value)
        else:
            steps += float(value)
    return secs, steps


async def phase(url: str, prompts: list[list[int]], concurrency: int) -> int:
    gate = asyncio.Semaphore(concurrency)

    async def send(client: httpx.AsyncClient, ids: list[int]) -> int:
        async with gate:
            body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
            r = await client.post(url + "/generate", json=body)
            r.raise_for_status()
            return int(r.json()["meta_info"].get("cached_tokens", 0))

    async with httpx.AsyncClient(timeout=900) as client:
        return sum(await asyncio.gather(*(send(client, ids) for ids in prompts)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=232, help="N: prompt tokens")
    p.add_argument("--prefix", type=int, default=72, help="P: cached leading tokens (whole pages)")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--page-size", type=int, default=8)
    p.add_argument("--rounds", type=int, default=1, help="repeat the whole interleaved series")
    p.add_argument("--server-arg", action="append", default=[], help="extra server flag (repeatable)")
    a = p.parse_args()
    rng = random.Random(0)

    def fresh(n: int) -> list[int]:
        return [rng.randrange(1, VOCAB) for _ in range(n)]

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(Path(tmp) / "smollm2")
        subprocess.run([sys.executable, "-m", "sglang_pd.tools.make_dummy_config", "smollm2-135m", model_dir],
                       check=True, capture_output=True)
        port = free_port()
        cmd = [sys.executable, "-m", "sglang_pd.launch_server", "--model-path", model_dir, "--load-format",
               "dummy", "--skip-tokenizer-init", "--host", "127.0.0.1", "--port", str(port), "--mode",
               "colocated", "--page-size", str(a.page_size), "--max-total-tokens", "65536",
               "--chunked-prefill-size", "512", "--max-running-requests", "64", "--dtype", "float32",
               *a.server_arg]
        log = open(Path(tmp) / "server.log", "wb")
        proc = popen_own_group(cmd, log)
        url = f"http://127.0.0.1:{port}"
        try:
            if not wait_healthy(url, proc, 300):
                raise SystemExit("server did not start:\n" + Path(tmp, "server.log").read_text()[-3000:])
            asyncio.run(phase(url, [fresh(a.tokens) for _ in range(4)], a.concurrency))  # warm the kernels
            print(f"N={a.tokens} P={a.prefix} requests={a.requests} concurrency={a.concurrency}")
            # interleaved request by request (full_i, prefix_i, new_i, full_i+1, ...): the machine's
            # drift falls on the three kinds alike
            totals: dict[str, list[float]] = {k: [0.0, 0.0, 0.0, 0.0] for k in ("full", "prefix", "new")}
            for _round in range(a.rounds):
                for _ in range(a.requests):
                    full = [fresh(a.tokens) for _ in range(a.concurrency)]
                    kinds = {"full": full,
                             "prefix": [f[: a.prefix] + fresh(a.tokens - a.prefix) for f in full],
                             "new": [fresh(a.tokens - a.prefix) for _ in range(a.concurrency)]}
                    for name, batch in kinds.items():
                        s0, n0 = step_totals(url)
                        t = time.monotonic()
                        cached = asyncio.run(phase(url, batch, a.concurrency))
                        wall = time.monotonic() - t
                        s1, n1 = step_totals(url)
                        tot = totals[name]
                        tot[0] += s1 - s0
                        tot[1] += n1 - n0
                        tot[2] += wall
                        tot[3] += cached
            groups = a.rounds * a.requests
            for name, (secs, steps, wall_s, hit) in totals.items():
                print(f"{name:6s}: stepping {secs / groups:6.3f} s per group of {a.concurrency} "
                      f"({int(steps)} steps), wall {wall_s / groups:6.3f} s, "
                      f"cached {hit / (groups * a.concurrency):6.1f} tokens/request")
            print(f"prefix/new stepping {totals['prefix'][0] / totals['new'][0]:.2f}, "
                  f"prefix/full {totals['prefix'][0] / totals['full'][0]:.2f}, "
                  f"new/full {totals['new'][0] / totals['full'][0]:.2f}")
        finally:
            stop(proc)
            log.close()


if __name__ == "__main__":
    main()
