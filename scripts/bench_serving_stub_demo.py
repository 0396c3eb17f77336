#!/usr/bin/env python3
"""Run the serving benchmark against the stub server and write sample plots.

No model or GPU needed: the stub queues prefills one at a time (10 ms + 0.02 ms per prompt
token) and stretches decode steps by 2% per other request decoding, so latency grows with load
the way a real server's does. Used to make the figures in docs/img/.

    python scripts/bench_serving_stub_demo.py --out-dir docs/img
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from sglang_pd.bench.app import run_benchmark
from sglang_pd.bench.cli import build_parser
from sglang_pd.bench.stub_harness import running_stub

WORKLOAD = [
    "--dataset-name",
    "mix",
    "--length-mix",
    "128:32:0.8,2048:32:0.2",
    "--long-threshold",
    "1024",
    "--slo-ttft-ms",
    "100",
    "--slo-tpot-ms",
    "12",
    "--seed",
    "3",
    "--disable-tqdm",
]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out-dir", default="docs/img")
    p.add_argument("--rate", type=float, default=30.0, help="req/s of the single run")
    p.add_argument("--sweep-rates", default="10,20,30,40,50")
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--output-file", default=None, help="JSONL to append results to")
    a = p.parse_args()
    out = ["--output-file", a.output_file] if a.output_file else []
    stub_flags = [
        "--first-ms",
        "10",
        "--itl-ms",
        "10",
        "--prefill-ms-per-token",
        "0.02",
        "--serial-prefill",
        "--decode-slowdown",
        "0.02",
        "--lifetime",
        "1800",
    ]
    with running_stub(*stub_flags) as base:
        common = ["--base-url", base, "--num-prompts", str(a.num_prompts), *WORKLOAD, *out]
        run_benchmark(
            build_parser().parse_args([*common, "--request-rate", str(a.rate), "--plot", a.out_dir])
        )
        with tempfile.TemporaryDirectory() as tmp:  # keep only the two sweep figures
            run_benchmark(
                build_parser().parse_args([*common, "--sweep-rates", a.sweep_rates, "--plot", tmp])
            )
            for name in ("sweep_attainment.png", "sweep_goodput.png"):
                shutil.copy(Path(tmp) / name, Path(a.out_dir) / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
