"""Serving A/B on one machine: a colocated server per variant (same model, same load), one
bench_serving run each, TTFT/TPOT side by side. For a regression hunt in one device call:
    python scripts/gpu/serving_ab.py --model DIR --variant base= --variant pf="--colocated-decode prefill-first"
On CPU (no --device cuda) it serves with the torch backend. Prints one table row per variant and
writes the rows as JSON lines to --out (a file)."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from sglang_pd.utils.server_procs import free_port, require_healthy, spawn_logged, stop

KEEP = ("completed", "duration", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms",
        "output_throughput")


def run_variant(args: argparse.Namespace, name: str, extra: str, work: Path) -> dict:
    port = free_port()
    cmd = [sys.executable, "-m", "sglang_pd.launch_server", "--model-path", args.model, "--host",
           "127.0.0.1", "--port", str(port), "--device", args.device, "--max-total-tokens", "65536",
           *(["--dtype", "bfloat16", "--attention-backend", "triton"] if args.device == "cuda" else []),
           *shlex.split(extra)]
    log = work / f"server_{name}.log"
    proc = spawn_logged(cmd, log)
    url = f"http://127.0.0.1:{port}"
    try:
        require_healthy(url, proc, args.start_timeout)
        out = work / f"bench_{name}.jsonl"
        bench = [sys.executable, "-m", "sglang_pd.bench_serving", "--backend", "sglang", "--base-url", url,
                 "--dataset-name", "random", "--num-prompts", str(args.num_prompts), "--random-input-len",
                 str(args.input_len), "--random-output-len", str(args.output_len), "--random-range-ratio", "1",
                 "--request-rate", str(args.rate), "--output-file", str(out), "--disable-tqdm",
                 "--request-timeout", "60", "--tokenizer", args.model]
        for _ in range(args.rounds):
            subprocess.run(bench, capture_output=True, text=True, timeout=args.bench_timeout, check=True)
        rows = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
        return {"variant": name, "args": extra} | {k: rows[-1].get(k) for k in KEEP} | {
            "first_round_median_ttft_ms": rows[0].get("median_ttft_ms")}
    except Exception as e:  # noqa: BLE001 - one failed variant is recorded, the next one runs
        tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
        return {"variant": name, "args": extra, "error": repr(e)[:300], "log_tail": tail}
    finally:
        stop(proc, 10.0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--variant", action="append", required=True, help="NAME=SERVER ARGS")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--rate", type=float, default=32)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2, help="bench runs per server; the last is reported")
    p.add_argument("--start-timeout", type=float, default=60)
    p.add_argument("--bench-timeout", type=float, default=120)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="serving_ab."))
    rows = []
    for v in args.variant:
        name, _, extra = v.partition("=")
        rows.append(run_variant(args, name, extra, work))
        r = rows[-1]
        print(json.dumps(r) if "error" in r else
              f"{name:12s} TTFT p50 {r['median_ttft_ms']:8.1f} ms (first round {r['first_round_median_ttft_ms']:.1f})"
              f"  p99 {r['p99_ttft_ms']:8.1f}  TPOT p50 {r['median_tpot_ms']:6.2f} ms  p99 {r['p99_tpot_ms']:6.2f}"
              f"  {r['completed']} done in {r['duration']:.2f} s", flush=True)
    if args.out:
        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"server logs: {work}")


if __name__ == "__main__":
    main()
