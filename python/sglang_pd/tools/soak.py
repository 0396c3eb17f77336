"""Soak test for a running server: many short requests at a fixed concurrency, a share of the
streaming clients hanging up early. Reports errors, KV pages before/after and the RSS growth of
the server's processes (the server's pid and its children, read from /proc).

  python -m sglang_pd.tools.soak --url http://127.0.0.1:30000 --pid SERVER_PID --requests 3000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def rss_mb(pids: list[int]) -> dict[int, float]:
    out = {}
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    out[p] = int(line.split()[1]) / 1024
        except OSError:
            pass
    return out


async def _load(session: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    async with session.get(base + "/get_load") as resp:
        body = await resp.json()
    return body[0] if isinstance(body, list) else body


async def _one(session: aiohttp.ClientSession, base: str, i: int, rng: random.Random,
               disconnect_share: float) -> str:
    stream = rng.random() < 0.5
    hang_up = stream and rng.random() < 2 * disconnect_share  # a third of all streams by default
    body = {"text": f"Request {i} about the sea and the {rng.choice(['moon', 'river', 'wind'])}",
            "stream": stream,
            "sampling_params": {"max_new_tokens": rng.randint(4, 24), "temperature": 0.7,
                                "ignore_eos": True}}
    try:
        async with session.post(base + "/generate", json=body,
                                timeout=aiohttp.ClientTimeout(total=300)) as resp:
            if resp.status != 200:
                return f"http {resp.status}"
            if not stream:
                await resp.read()
                return "ok"
            events = 0
            async for line in resp.content:
                if line.startswith(b"data:"):
                    events += 1
                    if hang_up and events >= 2:
                        return "hung up"  # leaving the block closes the connection mid-stream
            return "ok"
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        return f"client error {type(exc).__name__}"


async def run_soak(base: str, requests: int, concurrency: int, pid: int | None, seed: int = 0,
                   disconnect_share: float = 1 / 3) -> dict[str, Any]:
    rng = random.Random(seed)
    pids = process_tree(pid) if pid else []
    async with aiohttp.ClientSession() as session:
        load0 = await _load(session, base)
        rss0 = rss_mb(pids)
        sem = asyncio.Semaphore(concurrency)
        outcomes: dict[str, int] = {}
        t0 = time.monotonic()

        async def worker(i: int) -> None:
            async with sem:
                result = await _one(session, base, i, rng, disconnect_share)
            outcomes[result] = outcomes.get(result, 0) + 1
            done = sum(outcomes.values())
            if done % 250 == 0:
                print(f"  {done}/{requests} requests, {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)

        await asyncio.gather(*(worker(i) for i in range(requests)))
        wall = time.monotonic() - t0
        deadline = time.monotonic() + 30
        load1 = await _load(session, base)
        while load1["num_free_pages"] != load0["num_free_pages"] and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            load1 = await _load(session, base)
        rss1 = rss_mb(pids)
    return {"requests": requests, "concurrency": concurrency, "wall_s": wall, "outcomes": outcomes,
            "free_pages_before": load0["num_free_pages"], "free_pages_after": load1["num_free_pages"],
            "total_pages": load0["num_total_pages"],
            "rss_mb": {str(p): [round(rss0.get(p, 0), 1), round(rss1.get(p, 0), 1)] for p in pids}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--pid", type=int, help="the server's pid (RSS of it and its children)")
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    args = ap.parse_args()
    res = asyncio.run(run_soak(args.url.rstrip("/"), args.requests, args.concurrency, args.pid, args.seed))
    print(f"{res['requests']} requests at concurrency {res['concurrency']} in {res['wall_s']:.0f} s: "
          f"{res['outcomes']}; free pages {res['free_pages_before']} -> {res['free_pages_after']} of "
          f"{res['total_pages']}")
    for p, (before, after) in res["rss_mb"].items():
        print(f"  pid {p}: RSS {before:.0f} MB -> {after:.0f} MB ({after - before:+.0f} MB)")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    bad = {k: v for k, v in res["outcomes"].items() if k not in ("ok", "hung up")}
    sys.exit(0 if not bad and res["free_pages_after"] == res["free_pages_before"] else 1)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
