#!/usr/bin/env python3
"""Does ``nice`` give one engine priority over another on a shared core? (docs/bench_cluster.md)

Two engines (SmolLM2 shape, dummy weights, one thread each) on core 0: A prefills short
prompts back to back at nice 0; B, every thread at nice +10, prefills a long prompt now and
then. Run once with both in this script's session and once with each in a session of its own
(``setsid``, what ``start_new_session`` did). With Linux's scheduler autogroups on
(``/proc/sys/kernel/sched_autogroup_enabled``), each session is a group that gets an equal
share of the core first, so B's nice value stops counting.

    python scripts/probe_core_priority.py [--seconds 20] [--long 509] [--short 25]

Prints, per mode, A's short-prefill time (p50, max) while B is busy, and B's long-prefill time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sglang_pd.engine.engine_core import EngineCore

REPO = Path(__file__).resolve().parents[1]


def _engine(model: str) -> EngineCore:
    from sglang_pd.engine.engine_core import EngineCore
    from sglang_pd.server_args import ServerArgs

    return EngineCore(ServerArgs(model_path=model, load_format="dummy", device="cpu", page_size=16,
                                 max_total_tokens=16384, dtype="float32", chunked_prefill_size=512,
                                 disable_radix_cache=True))


def _prefill(core: EngineCore, rid: str, n: int) -> float:
    from sglang_pd.protocol import GenerateReq, SamplingParams

    ids = [(7 * i + hash(rid)) % 40000 + 5 for i in range(n)]
    core.add_request(GenerateReq(rid=rid, input_ids=ids, sampling_params=SamplingParams(max_new_tokens=1)))
    t0 = time.perf_counter()
    while not any(o.finish_reason for o in core.step()):
        pass
    return time.perf_counter() - t0


def child(role: str, model: str, seconds: float, long_len: int, short_len: int) -> None:
    """A: shorts until ``seconds`` pass, one line per prefill; B (nice +10): a long every 2 s."""
    os.sched_setaffinity(0, {0})
    import torch

    torch.set_num_threads(1)
    core = _engine(model)
    _prefill(core, "warm", 32)
    end = time.time() + seconds
    if role == "B":
        for tid in os.listdir(f"/proc/{os.getpid()}/task"):
            os.setpriority(os.PRIO_PROCESS, int(tid), 10)
        time.sleep(2.0)
    k = 0
    while time.time() < end:
        t0 = time.time()
        took = _prefill(core, f"{role}{k}", long_len if role == "B" else short_len)
        print(f"{role} {t0:.3f} {t0 + took:.3f}", flush=True)
        k += 1
        if role == "B":
            time.sleep(2.0)


def run_mode(own_sessions: bool, args: argparse.Namespace, model: str) -> tuple[list[float], list[float]]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=f"{REPO / 'python'}:{os.environ.get('PYTHONPATH', '')}")
    cmd = [sys.executable, __file__, "--child"]
    extra = [model, str(args.seconds), str(args.long), str(args.short)]
    procs = [subprocess.Popen([*cmd, role, *extra], stdout=subprocess.PIPE, text=True, env=env,
                              start_new_session=own_sessions) for role in ("A", "B")]
    spans: dict[str, list[tuple[float, float]]] = {"A": [], "B": []}
    for p in procs:
        out, _ = p.communicate(timeout=args.seconds * 4 + 120)
        for line in out.splitlines():
            role, t0, t1 = line.split()
            spans[role].append((float(t0), float(t1)))
    busy = spans["B"]
    shorts = [t1 - t0 for t0, t1 in spans["A"] if any(b0 < t1 and t0 < b1 for b0, b1 in busy)]
    return shorts, [t1 - t0 for t0, t1 in busy]


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--long", type=int, default=509)
    ap.add_argument("--short", type=int, default=25)
    args = ap.parse_args()
    autogroup = Path("/proc/sys/kernel/sched_autogroup_enabled")
    print(f"autogroups: {autogroup.read_text().strip() if autogroup.exists() else 'n/a'}")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "sglang_pd.tools.make_dummy_config", "smollm2-135m", tmp],
                       check=True, capture_output=True)  # the SmolLM2 shape, no weights
        for own in (False, True):
            shorts, longs = run_mode(own, args, tmp)
            a = f"p50 {1e3 * statistics.median(shorts):.0f} ms, max {1e3 * max(shorts):.0f} ms" if shorts else "none"
            print(f"{'own sessions' if own else 'one session '}: A's {args.short}-token prefills while B "
                  f"runs ({len(shorts)}): {a}; B's {args.long}-token prefills: "
                  + ", ".join(f"{1e3 * t:.0f}" for t in longs) + " ms", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
