#!/usr/bin/env python3
"""Decision time of each prefill policy: one ``schedule(waiting, now, budget)`` call over 100,
1,000 and 10,000 waiting length-only requests (issue 20's bar: < 100 us at 1,000). Prints
min/p50/p99 in microseconds per policy, queue length and queue kind (on a shared, loaded machine
the min is the cost itself, the p50 adds the waits for a core); --json writes the figures.

  python scripts/bench_prefill_decision.py [--sizes 100,1000,10000] [--json out.json]

Queue kinds: ``columns`` is the Scheduler's own ``WaitingQueue`` (filled through
``Scheduler.add``, as the engine and the simulator fill it: the policies read its numpy
columns); ``list`` is the same requests as a plain list (the policies read every request's
properties, the path tests and outside callers take). Every registry policy runs alone and
inside dual queues (``dual(name)``, ``--prefill-queues dual``).

Queue: arrivals 1 ms apart up to now, long-tailed prompt lengths (most short, a few long), TTFT
SLOs of 1, 2 and 8 s and some none, a few partly prefilled. The budget is the default
PolicyConfig's (16,384 tokens, 2,048-token chunks) with a KV counter that admits everything;
policy state is not reset between calls (as in the engine), the budget is new each call.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from pathlib import Path
from collections.abc import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from sglang_pd.core.page_allocator import CountingAllocator
from sglang_pd.core.scheduler import Scheduler
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.decode.continuous import ContinuousDecodePolicy
from sglang_pd.scheduling.registry import PREFILL_POLICIES, create_prefill_policy
from sglang_pd.scheduling.types import PrefillBudget
from sglang_pd.sim.request import SimReq


class AdmitAll:
    def can_admit(self, req: object, new_tokens: int) -> bool:
        return True

    def admit(self, req: object, new_tokens: int) -> None:
        pass

    def admit_run(self, reqs: list, new_tokens: list) -> int:
        return len(reqs)


def make_queue(n: int, seed: int) -> tuple[list[SimReq], float]:
    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        prompt = min(int(rng.lognormvariate(5.5, 1.2)) + 1, 32000)
        r = SimReq(str(i), i * 1e-3, prompt, 16, slo_ttft_s=rng.choice((1.0, 2.0, 8.0, None)))
        if prompt > 2048 and rng.random() < 0.05:
            r.kv_len = 2048  # a partly prefilled one
        reqs.append(r)
    return reqs, n * 1e-3


def as_scheduler_queue(reqs: list[SimReq], cfg: PolicyConfig) -> Sequence[SimReq]:
    """The requests in a real Scheduler's waiting queue, added as the engine adds them."""
    sched = Scheduler(CountingAllocator(1 << 30), cfg, create_prefill_policy("fcfs", cfg), ContinuousDecodePolicy(cfg))
    for r in reqs:
        sched.add(r)
    return sched.waiting


def measure(policy_name: str, n: int, repeats: int, seed: int, kind: str) -> dict:
    dual = policy_name.startswith("dual(")
    cfg = PolicyConfig(prefill_queues="dual" if dual else "single")
    policy = create_prefill_policy(policy_name[5:-1] if dual else policy_name, cfg)
    reqs, now = make_queue(n, seed)
    waiting: Sequence[SimReq] = as_scheduler_queue(reqs, cfg) if kind == "columns" else reqs
    times = []
    gc.disable()
    try:
        for _ in range(repeats):
            budget = PrefillBudget(cfg.max_prefill_tokens, cfg.chunked_prefill_size,
                                   cfg.max_running_requests, AdmitAll())
            t0 = time.perf_counter()
            plan = policy.schedule(waiting, now, budget)
            times.append(time.perf_counter() - t0)
    finally:
        gc.enable()
    times.sort()
    us = [t * 1e6 for t in times]
    return {"policy": policy_name, "waiting": n, "queue": kind, "repeats": repeats, "min_us": us[0],
            "p50_us": us[len(us) // 2],
            "p99_us": us[min(len(us) - 1, int(len(us) * 0.99))], "granted": len(plan),
            "plan": [(r.rid, k) for r, k in plan]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100,1000,10000", help="waiting queue lengths, comma-separated")
    ap.add_argument("--policies", default=",".join([*PREFILL_POLICIES, *(f"dual({p})" for p in PREFILL_POLICIES)]),
                    help="comma-separated; dual(name) = name inside dual queues")
    ap.add_argument("--queues", default="columns,list", help="queue kinds, comma-separated: columns, list")
    ap.add_argument("--repeats", type=int, default=200, help="calls per (policy, size); /10 at 10,000")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    kinds = args.queues.split(",")
    rows = []
    print(f"{'policy':>14} {'waiting':>8} {'queue':>8} {'min (us)':>10} {'p50 (us)':>10} {'p99 (us)':>10} "
          f"{'granted':>8}")
    for name in args.policies.split(","):
        for n in sizes:
            plans = []
            for kind in kinds:
                row = measure(name, n, max(args.repeats // 10, 10) if n >= 10_000 else args.repeats,
                              args.seed, kind)
                plans.append(row.pop("plan"))
                rows.append(row)
                print(f"{name:>14} {n:>8} {kind:>8} {row['min_us']:>10.1f} {row['p50_us']:>10.1f} {row['p99_us']:>10.1f} "
                      f"{row['granted']:>8}", flush=True)
            if any(p != plans[0] for p in plans):  # the equivalence the unit test checks, here too
                sys.exit(f"{name} at {n}: the queue kinds gave different plans")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
