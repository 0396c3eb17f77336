"""Before/after A/B of the scheduler's cost: prefill decision time and per-step overhead.

Issue 33's bar ("decision time and step overhead not worse, same run before/after"). Each git ref
gets a worktree under /tmp; the two benchmarks run alternately (A B A B ...), each side with its
own tree first on PYTHONPATH, and the table gives the median per side and after/before. On a
shared, loaded machine alternation and ratios of medians are what keep the comparison fair; the
load average is printed. Run it under the CPU lock:

  flock /tmp/cpu.lock python scripts/ab_overhead.py 30edde7 HEAD [--rounds 3]

Decision: ``bench_prefill_decision.py --sizes 1000 --queues columns`` (p50 us of one
``schedule`` call, per policy). Overhead: ``bench_offline.py --workloads fixed --batches 1
--overhead --overhead-sizes 16,64 --skip-hf --threads 1`` on the tiny model (p50 ms outside the
forward per decode step at 16 and 64 running requests, and batch-1 output tok/s).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def worktree(ref: str) -> Path:
    sha = git("rev-parse", "--short=10", f"{ref}^{{commit}}")
    path = Path(tempfile.gettempdir()) / f"ab-overhead-{sha}"
    if not (path / "scripts").is_dir():
        git("worktree", "add", "--force", "--detach", str(path), sha)
    return path


def env_for(tree: Path) -> dict[str, str]:
    path = os.pathsep.join(str(tree / d) for d in ("python", "router", "sgl-kernel"))
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


def run(tree: Path, python: str, args: list[str], timeout: float) -> None:
    out = subprocess.run([python, *args], cwd=tree, env=env_for(tree), capture_output=True,
                         text=True, timeout=timeout)
    if out.returncode != 0:
        sys.exit(f"{tree}: {' '.join(args)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")


def one_round(tree: Path, python: str, model: Path, work: Path) -> dict[str, float]:
    """One run of both benchmarks in ``tree``: metric name -> value."""
    figures: dict[str, float] = {}
    dec = work / "decision.json"
    run(tree, python, ["scripts/bench_prefill_decision.py", "--sizes", "1000", "--queues", "columns",
                       "--json", str(dec)], timeout=900)
    for row in json.loads(dec.read_text()):
        figures[f"decide {row['policy']} p50 us"] = row["p50_us"]
    off = work / "offline.json"
    run(tree, python, ["scripts/bench_offline.py", "--model-path", str(model), "--workloads", "fixed",
                       "--batches", "1", "--overhead", "--overhead-sizes", "16,64", "--skip-hf",
                       "--threads", "1", "--output-json", str(off)], timeout=900)
    for row in json.loads(off.read_text()):
        figures[f"batch-{row['batch']} output tok/s"] = row["ours_output_tok_s"]
    for row in json.loads(off.with_suffix(".overhead.json").read_text()):
        figures[f"step overhead {row['running']} running p50 ms"] = row["overhead_ms_p50"]
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before", help="git ref of the baseline")
    ap.add_argument("after", help="git ref to compare")
    ap.add_argument("--rounds", type=int, default=3, help="runs per side (alternating)")
    ap.add_argument("--model-path", default=str(REPO / "models" / "tiny-llama"),
                    help="tiny model dir (made with sglang_pd.tools.make_tiny_model if missing)")
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args()
    trees = {"before": worktree(args.before), "after": worktree(args.after)}
    model = Path(args.model_path)
    if not (model / "config.json").exists():
        subprocess.run([args.python, "-m", "sglang_pd.tools.make_tiny_model", str(model), "--arch", "llama"],
                       env=env_for(trees["after"]), check=True, timeout=600)
    load0 = os.getloadavg()
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for side in ("before", "after"):
                print(f"round {r + 1}/{args.rounds}: {side} ({trees[side].name})", file=sys.stderr, flush=True)
                runs[side].append(one_round(trees[side], args.python, model, Path(tmp)))
    load1 = os.getloadavg()
    names = [k for k in runs["after"][0] if k in runs["before"][0]]
    print(f"before {args.before} ({trees['before'].name}), after {args.after} ({trees['after'].name}), "
          f"{args.rounds} alternating runs each; load average {load0[0]:.2f} at start, {load1[0]:.2f} at end "
          f"({os.cpu_count()} CPUs)")
    print(f"| {'metric':<46} | {'before (median)':>15} | {'after (median)':>14} | {'after/before':>12} "
          f"| {'before min-max':>17} | {'after min-max':>17} |")
    print(f"|{'-' * 48}|{'-' * 16}:|{'-' * 15}:|{'-' * 13}:|{'-' * 18}:|{'-' * 18}:|")
    decide_ratios = []
    for name in names:
        b = statistics.median(x[name] for x in runs["before"])
        a = statistics.median(x[name] for x in runs["after"])
        ratio = a / b if b else math.nan
        if name.startswith("decide "):
            decide_ratios.append(ratio)
        spread = [f"{min(x[name] for x in runs[side]):.3f}-{max(x[name] for x in runs[side]):.3f}"
                  for side in ("before", "after")]
        print(f"| {name:<46} | {b:>15.3f} | {a:>14.3f} | {ratio:>12.3f} | {spread[0]:>17} | {spread[1]:>17} |")
    if decide_ratios:
        geo = math.exp(statistics.mean(math.log(x) for x in decide_ratios))
        print(f"decision time, geometric mean of after/before over {len(decide_ratios)} policies: {geo:.3f}")


if __name__ == "__main__":
    main()
