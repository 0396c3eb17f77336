#!/usr/bin/env python3
"""Prefill decision time, this tree against a git ref, interleaved (issue 28): on a shared, loaded
machine two runs of bench_prefill_decision.py minutes apart differ by 1.5-2x, so the two trees run
side by side instead: one worker process per tree (each imports its own tree's package and
bench_prefill_decision.py queue), asked in turn for short batches of ``schedule`` calls per policy
(which tree goes first alternates), both pinned to one core so they see the same contention.
Prints per policy p50 / p10 / least of each tree (microseconds, ``--waiting`` requests, 1,000 by
default, in the Scheduler's WaitingQueue) and new/base, and the plan sizes (they must match).

  python scripts/ab_prefill_decision.py --base 08b8c42 [--policies kairos,sjf] [--batches 40]
      [--batch 10] [--cpu 0]

``--base`` is checked out with ``git archive`` under /tmp/ab-prefill-<ref> (once).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
POLICIES = "fcfs,kairos,kairos+,lars,edf,lrs,sjf,dual(fcfs),dual(kairos+),dual(edf)"


def worker(tree: str, waiting_n: int) -> None:
    """Answer 'policy count' lines on stdin with that many call times (us) and the plan's size."""
    sys.path.insert(0, f"{tree}/python")
    spec = importlib.util.spec_from_file_location("bench", f"{tree}/scripts/bench_prefill_decision.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    from sglang_pd.scheduling.config import PolicyConfig
    from sglang_pd.scheduling.registry import create_prefill_policy
    from sglang_pd.scheduling.types import PrefillBudget

    setups: dict = {}
    for line in sys.stdin:
        name, k = line.split()
        if name not in setups:
            dual = name.startswith("dual(")
            cfg = PolicyConfig(prefill_queues="dual" if dual else "single")
            reqs, now = bench.make_queue(waiting_n, 0)
            setups[name] = (cfg, create_prefill_policy(name[5:-1] if dual else name, cfg),
                            bench.as_scheduler_queue(reqs, cfg), now)
        cfg, policy, waiting, now = setups[name]
        times = []
        gc.disable()
        for _ in range(int(k)):
            budget = PrefillBudget(cfg.max_prefill_tokens, cfg.chunked_prefill_size, cfg.max_running_requests,
                                   bench.AdmitAll())
            t0 = time.perf_counter()
            plan = policy.schedule(waiting, now, budget)
            times.append(time.perf_counter() - t0)
        gc.enable()
        print(" ".join(f"{t * 1e6:.2f}" for t in times), "|", len(plan), sum(n for _, n in plan), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", help="git ref to compare this tree with")
    ap.add_argument("--base-tree", help="or a checked-out tree (with python/ and scripts/)")
    ap.add_argument("--policies", default=POLICIES)
    ap.add_argument("--batches", type=int, default=40, help="turns per tree and policy")
    ap.add_argument("--batch", type=int, default=10, help="calls per turn")
    ap.add_argument("--cpu", type=int, default=0, help="the core both workers are pinned to (-1: none)")
    ap.add_argument("--waiting", type=int, default=1000, help="queue length")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.waiting)
    base = args.base_tree
    if base is None:
        if not args.base:
            sys.exit("--base REF or --base-tree DIR")
        base = f"/tmp/ab-prefill-{args.base}"
        if not Path(base).exists():
            Path(base).mkdir(parents=True)
            archive = subprocess.run(["git", "-C", str(REPO), "archive", args.base, "python", "scripts"],
                                     check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", base], input=archive, check=True)
    pin = [] if args.cpu < 0 else ["taskset", "-c", str(args.cpu)]
    workers = {tag: subprocess.Popen([*pin, sys.executable, __file__, "--worker", tree,
                                      "--waiting", str(args.waiting)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
               for tag, tree in (("base", base), ("new", str(REPO)))}

    def ask(tag: str, policy: str, k: int) -> tuple[list[float], str]:
        w = workers[tag]
        assert w.stdin is not None and w.stdout is not None
        w.stdin.write(f"{policy} {k}\n")
        w.stdin.flush()
        times, plan = w.stdout.readline().split("|")
        return [float(x) for x in times.split()], plan.strip()

    policies = args.policies.split(",")
    res: dict[str, dict[str, list[float]]] = {p: {"base": [], "new": []} for p in policies}
    plans: dict[str, dict[str, str]] = {p: {} for p in policies}
    for p in policies:
        for tag in workers:
            ask(tag, p, 20)  # warm-up
    for i in range(args.batches):
        for p in policies:
            for tag in ("base", "new") if i % 2 == 0 else ("new", "base"):
                times, plans[p][tag] = ask(tag, p, args.batch)
                res[p][tag] += times
    for w in workers.values():
        assert w.stdin is not None
        w.stdin.close()
        w.wait()
    print(f"{'policy':>14} " + " ".join(f"{'base ' + s:>9} {'new ' + s:>9} {'ratio':>6}" for s in ("p50", "p10", "min"))
          + "  plan (base | new)")
    for p in policies:
        b, n = sorted(res[p]["base"]), sorted(res[p]["new"])
        cols = " ".join(f"{b[int(len(b) * f)]:9.1f} {n[int(len(n) * f)]:9.1f} {n[int(len(n) * f)] / b[int(len(b) * f)]:6.2f}"
                        for f in (0.5, 0.1, 0.0))
        print(f"{p:>14} {cols}  {plans[p]['base']} | {plans[p]['new']}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
