#!/usr/bin/env python3
"""Simulator fidelity for the PD cluster, the whole bar in one command (issue 34 item 4).

    python scripts/bench_cluster_fidelity.py --out /tmp/fid [--seeds 3] [--num-prompts 80] [--rate 1.5]
    python scripts/bench_cluster_fidelity.py --out /tmp/fidq --quick     # plumbing smoke, figures meaningless

1. ``bench_cluster.py --setups ours`` once per seed 0..N, each on its own window of the trace
   (``--trace-skip seed x --num-prompts``: other requests, other arrival gaps) and its own seed;
   each run also scrapes the servers' engine step times (SETUP_steps.json);
2. the cost profile: ``--profile`` if it exists, else measured here by the profiler;
3. ``sim_fidelity_cluster.py``: calibrates the simulator on seed 0 (per-instance step factors
   and a TTFT overhead: sglang_pd/sim/calibration.py) and predicts seeds 1..N, never the run
   it was fitted on, then prints each run's per-class comparison and the bar's table (per
   class and metric, each seed's error and the mean |error|; per class mean and max).

Writes OUT/seedS/ (bench_cluster's logs and records), OUT/calibration.json, OUT/fidelity.md.
``--quick``: bench_cluster's quick workload (tiny model, 14 requests) and one predicted seed.
``--rounds N``: each seed's window runs N times (identical requests and arrivals); the bar's
figures are then each seed's mean over its N runs, engine and simulator alike, since one run
strays 12-19% from that mean at 80 requests (docs/bench_cluster.md). Calibrated on each of seed
0's rounds, the fits averaged (``Calibration.mean``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import subprocess
import sys
import time
from pathlib import Path

import sim_fidelity_cluster as sfc  # a sibling script (scripts/ is on the path)

REPO = Path(__file__).resolve().parents[1]
QUICK_PROMPTS = 14  # bench_cluster --quick's request count (its window size here)


def bench_argv(a: argparse.Namespace, seed: int, log_dir: Path) -> list[str]:
    n = QUICK_PROMPTS if a.quick else a.num_prompts
    argv = [sys.executable, str(REPO / "scripts" / "bench_cluster.py"), "--setups", a.setups,
            "--seed", str(seed), "--trace-skip", str(seed * n), "--log-dir", str(log_dir), "--trace", a.trace,
            "--no-prime",  # each seed is its own invocation, calibrated and predicted alike
            "--request-log",  # the engines' TTFT stages, set beside the simulator's
            "--prefills", str(a.prefills)]  # the simulated cluster follows (bench_cluster.json's config)
    if a.rounds > 1:  # the same window N times: the simulator is compared with the runs' mean
        argv += ["--rounds", str(a.rounds)]
    if a.quick:
        return [*argv, "--quick"]
    return [*argv, "--num-prompts", str(n), "--rate", str(a.rate), "--model-dir", str(a.out / "smollm2-135m")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seeds", type=int, default=3, help="predicted runs (seeds 1..N); seed 0 calibrates")
    ap.add_argument("--setups", default="ours")
    ap.add_argument("--trace", default="azure-conv")
    ap.add_argument("--num-prompts", type=int, default=80, help="requests per seed window")
    ap.add_argument("--rate", type=float, default=1.5)
    ap.add_argument("--prefills", type=int, choices=(1, 2), default=2,
                    help="bench_cluster --prefills: 2 prefill engines sharing the first core, or 1 alone there")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run each seed's window N times (bench_cluster --rounds); each seed's engine figures "
                         "are then the mean over its N runs, and so are the simulator's")
    ap.add_argument("--profile", type=Path, default=None, help="cost profile JSON (default: OUT/profile.json, "
                    "measured first if missing)")
    ap.add_argument("--profile-repeats", type=int, default=3)
    ap.add_argument("--cores", type=float, default=None, help="sim_fidelity_cluster.py --cores (shared cores)")
    ap.add_argument("--shared", choices=("all", "prefill"), default="prefill",
                    help="with --cores: who shares them (sim_fidelity_cluster.py --shared; bench_cluster pins "
                         "the prefill engines to one core)")
    ap.add_argument("--reuse", action="store_true", help="keep seed runs already in OUT (their records exist)")
    ap.add_argument("--quick", action="store_true", help="tiny model, 14 requests, one predicted seed")
    a = ap.parse_args(argv)
    if a.quick:
        a.seeds = 1
    if a.seeds < 1 or a.num_prompts < 1 or a.rate <= 0 or a.rounds < 1:
        ap.error("--seeds, --num-prompts, --rate and --rounds must be positive")
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    dirs = [a.out / f"seed{s}" for s in range(a.seeds + 1)]
    for s, d in enumerate(dirs):
        if a.reuse and (d / "bench_cluster.json").exists():
            continue
        print(f"== seed {s}: bench_cluster ({time.monotonic() - t0:.0f} s)", flush=True)
        rc = subprocess.run(bench_argv(a, s, d), check=False).returncode
        if rc != 0:
            print(f"bench_cluster seed {s} exited {rc}: see {d}", file=sys.stderr)
            return rc
    profile = a.profile or a.out / "profile.json"
    model = str(REPO / "models" / "tiny-llama") if a.quick else str(a.out / "smollm2-135m")
    fid = ["--bench-dir", *map(str, dirs[1:]), "--calibrate-from", str(dirs[0]), "--setups", a.setups,
           "--profile", str(profile), "--calibration", str(a.out / "calibration.json"), "--model-path", model,
           "--profile-repeats", str(a.profile_repeats)] + (["--cores", str(a.cores), "--shared", a.shared]
                                                            if a.cores else [])
    if not profile.exists():
        print(f"== profile: measuring {profile} ({time.monotonic() - t0:.0f} s)", flush=True)
        fid.append("--make-profile")
    print(f"== simulator ({time.monotonic() - t0:.0f} s)", flush=True)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = sfc.main(fid)
    (a.out / "fidelity.md").write_text(f"`python scripts/bench_cluster_fidelity.py {' '.join(sys.argv[1:])}`\n\n"
                                       + buf.getvalue())
    print(buf.getvalue() + f"\n(wrote {a.out}/fidelity.md; {time.monotonic() - t0:.0f} s in all)")
    return rc


if __name__ == "__main__":
    sys.exit(main())
