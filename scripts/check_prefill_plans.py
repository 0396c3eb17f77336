#!/usr/bin/env python3
"""Do two trees' prefill policies make the same plans? (Issue 28: decision-time work must not
change a single decision.) Every registry policy, alone and inside dual queues, decides over
queues of 3, 50, 300 and 1,000 waiting requests for several seeds, a few decisions in a row: each
plan is applied (chunks extended, finished requests removed, new ones arriving, ``now``
advancing), budgets and KV room vary, so state kept across decisions is exercised too. Both
the Scheduler's ``WaitingQueue`` (columns) and a plain list are fed.

  python scripts/check_prefill_plans.py --base bea256e      # this tree against a git ref
  python scripts/check_prefill_plans.py --dump plans.json   # only write this tree's plans

``--base`` checks the ref out under /tmp (as ab_overhead.py does), runs this file there with
that tree's package first on the path, and reports the first difference per policy.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


class RoomKV:
    """KV admission with a token room: refuses a grant that does not fit what is left."""

    def __init__(self, room: int) -> None:
        self.room = room

    def can_admit(self, req: object, new_tokens: int) -> bool:
        return new_tokens <= self.room

    def admit(self, req: object, new_tokens: int) -> None:
        self.room -= new_tokens


def make_reqs(sim_req: Any, n: int, rng: random.Random, t0: float, tag: str, spread: float = 1e-3) -> list[Any]:
    out = []
    for i in range(n):
        prompt = min(int(rng.lognormvariate(5.5, 1.3)) + 1, 32000)
        if rng.random() < 0.02:
            prompt = rng.choice((1, 2048, 4096))  # exact chunk multiples and tiny ones
        t = t0 + i * spread * rng.choice((1.0, 1.0, 0.0))  # some equal arrivals
        r = sim_req(f"{tag}{i}", t, prompt, 16, slo_ttft_s=rng.choice((0.5, 1.0, 2.0, 8.0, None)))
        if prompt > 2048 and rng.random() < 0.05:
            r.kv_len = 2048  # partly prefilled
        if rng.random() < 0.05:
            r.cached_len = min(prompt - 1, rng.choice((16, 256, 1024)))  # prefix hits
            r.kv_len = max(r.kv_len, r.cached_len)
        out.append(r)
    return out


def run_policy(name: str, n: int, seed: int, kind: str, decisions: int) -> list[list[tuple[str, Any]]]:
    from sglang_pd.scheduling.config import PolicyConfig
    from sglang_pd.scheduling.registry import create_prefill_policy
    from sglang_pd.scheduling.types import PrefillBudget
    from sglang_pd.scheduling.waiting import WaitingQueue
    from sglang_pd.sim.request import SimReq

    rng = random.Random(seed * 7919 + n)
    dual = name.startswith("dual(")
    cfg = PolicyConfig(prefill_queues="dual" if dual else "single",
                       prefill_max_partial=rng.choice((1, 2, 4)))
    policy = create_prefill_policy(name[5:-1] if dual else name, cfg)
    # odd seeds: every request arrived within the last millisecond (dual queues' AWD then
    # waits and holds instead of dispatching an overdue head at once)
    spread = 1e-3 if seed % 2 == 0 else 1e-6
    reqs = make_reqs(SimReq, n, rng, 0.0, "a", spread)
    reqs.sort(key=lambda r: r.arrival)
    try:  # as the Scheduler makes it (with the no-SLO default: the queue keeps ``due``)
        from sglang_pd.scheduling.slo import no_slo_ttft_s
        wq: Any = WaitingQueue(chunk=cfg.chunked_prefill_size, no_slo_s=no_slo_ttft_s(cfg))
    except TypeError:  # a tree from before the queue kept ``due``
        wq = WaitingQueue(chunk=cfg.chunked_prefill_size)
    for r in reqs:
        wq.add(r)
    now = n * spread + 1e-4
    plans: list[list[tuple[str, Any]]] = []  # each plan, then the hold it asked for
    for d in range(decisions):
        tokens = rng.choice((cfg.max_prefill_tokens, 4096, 700))
        slots = rng.choice((cfg.max_running_requests, 8, 1, 0))
        room = rng.choice((1 << 30, 20000, 3000))
        budget = PrefillBudget(tokens, cfg.chunked_prefill_size, slots, RoomKV(room))
        waiting = wq if kind == "columns" else list(wq)
        plan = policy.schedule(waiting, now, budget)
        plans.append([(r.rid, k) for r, k in plan] + [("hold", budget.hold_deadline)])
        for r, k in plan:  # apply the plan as the Scheduler would
            r.kv_len += k
            if r.prefill_remaining == 0:
                wq.remove(r)
            else:
                wq.refresh(r)
        now += rng.choice((0.0, 1e-4, 0.01, 0.2))
        for r in make_reqs(SimReq, rng.choice((0, 1, 5)), rng, now, f"d{d}-", spread):
            wq.add(r)
    return plans


def dump(decisions: int, seeds: int) -> dict[str, Any]:
    from sglang_pd.scheduling.registry import PREFILL_POLICIES

    names = [*PREFILL_POLICIES, *(f"dual({p})" for p in PREFILL_POLICIES)]
    out: dict[str, Any] = {}
    for name in names:
        for n in (3, 50, 300, 1000):
            for seed in range(seeds):
                for kind in ("columns", "list"):
                    out[f"{name} n={n} seed={seed} {kind}"] = run_policy(name, n, seed, kind, decisions)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", help="git ref to compare this tree with")
    ap.add_argument("--dump", help="write this tree's plans here (JSON) and stop")
    ap.add_argument("--tree", help="(internal) the tree whose package to import")
    ap.add_argument("--decisions", type=int, default=6)
    ap.add_argument("--seeds", type=int, default=4)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(args.tree or REPO) / "python"))
    if args.dump:
        Path(args.dump).write_text(json.dumps(dump(args.decisions, args.seeds)))
        return
    if not args.base:
        sys.exit("give --base REF or --dump FILE")
    sys.path.insert(0, str(REPO / "scripts"))
    from ab_overhead import worktree

    base = worktree(args.base)
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for side, tree in (("base", base), ("this", REPO)):
            files[side] = Path(tmp) / f"{side}.json"
            env = {**os.environ, "PYTHONPATH": str(tree / "python")}
            subprocess.run([sys.executable, __file__, "--tree", str(tree), "--dump", str(files[side]),
                            "--decisions", str(args.decisions), "--seeds", str(args.seeds)],
                           check=True, env=env, timeout=1800)
        a, b = (json.loads(files[s].read_text()) for s in ("base", "this"))
    bad = 0
    for case in a:
        if a[case] != b.get(case):
            bad += 1
            pa, pb = a[case], b.get(case) or []
            d = next((i for i, (x, y) in enumerate(zip(pa, pb)) if x != y), min(len(pa), len(pb)))
            print(f"DIFF {case}: decision {d}: base {pa[d][:6] if d < len(pa) else None} "
                  f"this {pb[d][:6] if d < len(pb) else None}")
    grants = sum(len(p) - 1 for plans in a.values() for p in plans)
    holds = sum(p[-1][1] is not None for plans in a.values() for p in plans)
    print(f"{len(a)} cases ({grants} grants and {holds} holds in the base tree's plans): {bad} differ")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
