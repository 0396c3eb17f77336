"""Fidelity check (issue 16): the simulator against the real CPU engine on one short trace.

    python -m sglang_pd.tools.make_dummy_config smollm2-135m /tmp/smollm2-dummy
    python scripts/sim_fidelity.py --model-path /tmp/smollm2-dummy --dummy --make-profile \
        --profile /tmp/cpu_profile.json --make-trace --trace /tmp/fid.jsonl --num-prompts 40 \
        --kv-capacity-tokens 32768

0. (``--make-trace``) writes a seeded Poisson trace; (``--make-profile``) measures this machine's
   engine with the profiler (``sglang_pd.tools.profile_cost_model``) into ``--profile``,

1. starts a colocated server (``launch_server``, the given model, ``--max-total-tokens``),
2. replays the trace with ``bench_serving --dataset-name trace --output-details --output-file``,
3. runs ``sim run`` on the same requests (same lengths, same send times) with ``--profile``
   (a profile measured by the profiler on this machine's CPU engine: docs/profile.md), the
   prefix cache off (the engine has none) and the server's scheduling flags,
4. prints both sides' p50/p90 TTFT and TPOT and the relative errors (bar: within 10%).

The bench's real send times (``start_times``) are what the simulator replays, so both sides see
the same arrivals. KV bytes per token matter only for PD (this check is colocated).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from sglang_pd.bench.metrics import percentile
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.sim.cluster import Cluster
from sglang_pd.sim.cluster_spec import ClusterSpec
from sglang_pd.sim.profiles import build_cost
from sglang_pd.sim.workload import Arrival, Workload
from sglang_pd.utils.pinning import pin_engines
from sglang_pd.utils.server_procs import popen_own_group, stop, wait_healthy


def real_run(a: argparse.Namespace, out: Path) -> dict:
    server = [sys.executable, "-m", "sglang_pd.launch_server", "--model-path", a.model_path, "--port", str(a.port),
              "--mode", "colocated", "--page-size", str(a.page_size), "--max-total-tokens", str(a.kv_capacity_tokens),
              "--chunked-prefill-size", str(a.chunked_prefill_size), "--max-running-requests", str(a.max_running),
              "--skip-tokenizer-init"] + (["--load-format", "dummy"] if a.dummy else [])
    proc = popen_own_group(server, open(out / "server.log", "w"))
    try:
        if not wait_healthy(f"http://127.0.0.1:{a.port}", proc):
            sys.exit(f"server on :{a.port} not healthy (exit code {proc.poll()}); see {out / 'server.log'}")
        if a.pin_cores:
            print("pinned:", pin_engines([proc.pid]))
        bench = [sys.executable, "-m", "sglang_pd.bench_serving", "--backend", "sglang", "--port", str(a.port),
                 "--dataset-name", "trace", "--dataset-path", a.trace, "--num-prompts", str(a.num_prompts),
                 "--time-scale", str(a.time_scale), "--output-details", "--output-file", str(out / "bench.jsonl")]
        subprocess.run(bench, check=True)
    finally:
        stop(proc, grace_s=60)
    return json.loads((out / "bench.jsonl").read_text().splitlines()[-1])


def make_profile(a: argparse.Namespace, path: Path) -> Path:
    """Measure this machine's CPU engine with the profiler (``sglang_pd.tools.profile_cost_model``,
    docs/profile.md) over the lengths and batch sizes this check's trace reaches."""
    # dense where the trace lives (prompts 64..512, batches of a few): the ground truth reads the
    # decode grid by interpolation and fits prefill to these points, so coarse cells cost
    # accuracy (a 256/1024/4096 decode grid read ~7% off at batch 3 and batches of 10-13)
    cmd = [sys.executable, "-m", "sglang_pd.tools.profile_cost_model", "--model-path", a.model_path,
           "--out", str(path), "--page-size", str(a.page_size),
           "--prefill-new-tokens", "32,64,128,256,384,512,768", "--prefill-context-tokens", "0,512",
           "--prefill-batch-sizes", "1,2,4", "--prefill-batch-new-tokens", "64,256,512",
           "--decode-batch-sizes", "1,2,3,4,5,6,7,8,10,12,14,16",
           "--decode-context-tokens", "256,512,1024,2048,4096,8192,16384", "--repeats", str(a.profile_repeats),
           "--notes", "scripts/sim_fidelity.py"]
    subprocess.run(cmd + (["--load-format", "dummy"] if a.dummy else []), check=True)
    return path


def make_trace(path: Path, n: int, rate: float, seed: int) -> Path:
    """A seeded Mooncake-format JSONL (``timestamp`` ms, ``input_length``, ``output_length``):
    Poisson arrivals at ``rate`` req/s, prompts 64..512 tokens, outputs 16..48."""
    rng = random.Random(seed)
    t, lines = 0.0, []
    for _ in range(n):
        lines.append(json.dumps({"timestamp": round(t * 1e3), "input_length": rng.randint(64, 512),
                                 "output_length": rng.randint(16, 48)}))
        t += rng.expovariate(rate)
    path.write_text("\n".join(lines) + "\n")
    return path


def server_kwargs(a: argparse.Namespace) -> dict:
    kw = {"page_size": a.page_size, "max_total_tokens": a.kv_capacity_tokens, "chunked_prefill_size": a.chunked_prefill_size,
          "max_running_requests": a.max_running, "skip_tokenizer_init": True}
    if a.dummy:
        kw["load_format"] = "dummy"
    return kw


def sim_run(a: argparse.Namespace, rec: dict) -> tuple[list[float], list[float]]:
    starts, ins, outs = rec["start_times"], rec["input_lens"], rec["output_lens"]
    t0 = min(starts)
    arrivals = sorted((Arrival(s - t0, i, max(o, 1)) for s, i, o in zip(starts, ins, outs)), key=lambda x: x.arrival_s)
    cfg = PolicyConfig(page_size=a.page_size, chunked_prefill_size=a.chunked_prefill_size,
                       max_running_requests=a.max_running)
    cost = build_cost(a.profile, kv_capacity_tokens=a.kv_capacity_tokens, kv_bytes_per_token=1.0)
    res = Cluster(ClusterSpec(num_colocated=1, cfg=cfg), cost).run(Workload(arrivals))
    ttft = [t.first_token - t.arrival for t in res.tracks if t.first_token is not None]
    tpot = [(t.finish - t.first_token) / (t.output_len - 1) for t in res.tracks
            if t.finish is not None and t.first_token is not None and t.output_len > 1]
    return ttft, tpot


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--profile", required=True, help="profile JSON measured on this machine's CPU engine "
                    "(written first by --make-profile)")
    ap.add_argument("--make-profile", action="store_true", help="measure the offline engine into --profile first")
    ap.add_argument("--dummy", action="store_true", help="--load-format dummy (shapes from config.json)")
    ap.add_argument("--pin-cores", action=argparse.BooleanOptionalAction, default=True,
                    help="the engine alone on one core, the frontend and the bench on the others")
    ap.add_argument("--profile-repeats", type=int, default=5,
                    help="timed runs per profile cell (cell means of 3 moved 5-10%% between runs here)")
    ap.add_argument("--trace", required=True, help="Mooncake-format JSONL (written first by --make-trace)")
    ap.add_argument("--make-trace", action="store_true",
                    help="write a seeded Poisson trace (--num-prompts, --trace-rate, --seed) into --trace first")
    ap.add_argument("--trace-rate", type=float, default=0.7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--num-prompts", type=int, default=60)
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--port", type=int, default=30123)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--kv-capacity-tokens", type=int, default=65536)
    ap.add_argument("--chunked-prefill-size", type=int, default=2048)
    ap.add_argument("--max-running", type=int, default=256)
    a = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="sim_fidelity_"))
    if a.make_trace:
        make_trace(Path(a.trace), a.num_prompts, a.trace_rate, a.seed)
    if a.make_profile:
        make_profile(a, Path(a.profile))
    rec = real_run(a, out)
    real_ttft = [x for x in rec["ttfts"] if x > 0]
    real_tpot = [(e - t) / (o - 1) for e, t, o in zip(rec["e2e_latencies"], rec["ttfts"], rec["output_lens"]) if o > 1]
    sim_ttft, sim_tpot = sim_run(a, rec)
    print(f"{'metric':<10}{'real (ms)':>12}{'sim (ms)':>12}{'error':>9}")
    for name, real, sim in (("TTFT", real_ttft, sim_ttft), ("TPOT", real_tpot, sim_tpot)):
        for q in (50, 90):
            r, s = percentile(real, q) * 1e3, percentile(sim, q) * 1e3
            print(f"{name} p{q:<5}{r:>12.1f}{s:>12.1f}{100 * (s - r) / r if r else float('nan'):>8.1f}%")
    print("bench record and server log in", out)


if __name__ == "__main__":
    main()
