#!/usr/bin/env python3
"""Drive the engine's real Scheduler (fcfs + continuous) with length-only requests and a
counting KV allocator, without torch: the simulator's path. Prints the wall time and the
scheduler's cost per step; --json writes the figures (the unit test reads them).

  python scripts/bench_scheduler.py --requests 10000
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from sglang_pd.core.page_allocator import CountingAllocator
from sglang_pd.core.scheduler import Scheduler
from sglang_pd.core.step import ForwardMode
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.registry import create_decode_policy, create_prefill_policy
from sglang_pd.sim.request import SimReq


def run(num_requests: int, num_pages: int, seed: int, prefill: str, decode: str) -> dict:
    rng = random.Random(seed)
    cfg = PolicyConfig(page_size=16, chunked_prefill_size=2048, max_prefill_tokens=8192,
                       max_running_requests=256)
    sched = Scheduler(CountingAllocator(num_pages), cfg, create_prefill_policy(prefill, cfg),
                      create_decode_policy(decode, cfg))
    # long-tailed prompts (most short, a few long), short outputs; arrivals 0.2 ms apart
    reqs = [SimReq(str(i), i * 0.0002, min(int(rng.lognormvariate(5.5, 1.2)) + 1, 16000),
                   rng.randint(1, 64)) for i in range(num_requests)]
    now, nxt, steps, finished, aborted = 0.0, 0, 0, 0, 0
    t0 = time.perf_counter()
    while finished + aborted < num_requests:
        while nxt < num_requests and reqs[nxt].arrival <= now:
            sched.add(reqs[nxt])
            nxt += 1
        step = sched.schedule(now)
        if step is None:
            for req, _ in sched.unblock(now):
                sched.remove(req)
                aborted += 1
            now = max(now, reqs[nxt].arrival) if nxt < num_requests and not sched.has_work else now + 0.001
            continue
        steps += 1
        sampled = sched.after_extend(step.prefill_plan)
        sched.after_decode(step.decode_reqs)
        sampled += step.decode_reqs
        for r in sampled:
            r.n_generated += 1
            if r.done:
                sched.remove(r)
                finished += 1
        now += 0.001 + 1e-6 * step.shape.num_tokens  # a toy step time; only the order matters
        if step.mode is ForwardMode.DECODE and steps % 5000 == 0:
            print(f"  {finished}/{num_requests} finished after {steps} steps", flush=True)
    wall = time.perf_counter() - t0
    sched.check_integrity()
    return {"requests": num_requests, "finished": finished, "aborted": aborted, "steps": steps,
            "retractions": sched.num_retractions, "wall_s": wall, "us_per_step": wall / steps * 1e6,
            "free_pages": sched.allocator.num_free, "usable_pages": sched.allocator.num_usable,
            "torch_imported": "torch" in sys.modules}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--num-pages", type=int, default=2048, help="KV pages of 16 tokens")
    ap.add_argument("--prefill-policy", default="fcfs")
    ap.add_argument("--decode-policy", default="continuous")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    out = run(args.requests, args.num_pages, args.seed, args.prefill_policy, args.decode_policy)
    print(f"{out['requests']} requests ({out['finished']} finished, {out['aborted']} aborted) in "
          f"{out['steps']} steps, {out['retractions']} retractions: {out['wall_s']:.2f} s wall, "
          f"{out['us_per_step']:.1f} us per step; free pages {out['free_pages']}/{out['usable_pages']}; "
          f"torch imported: {out['torch_imported']}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
