"""Fidelity check (issue 16): the simulator against the real CPU engine on one short trace.

    python -m sglang_pd.tools.make_dummy_config smollm2-135m /tmp/smollm2-dummy
    python scripts/sim_fidelity.py --model-path /tmp/smollm2-dummy --dummy --make-profile \
        --profile /tmp/cpu_profile.json --trace TRACE.jsonl --num-prompts 40 --kv-capacity-tokens 32768

0. (``--make-profile``) measures the offline engine into ``--profile`` (until the profiler lands),

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
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from sglang_pd.bench.metrics import percentile
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.sim.cluster import Cluster, ClusterSpec
from sglang_pd.sim.profiles import build_cost
from sglang_pd.sim.workload import Arrival, Workload


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 300.0) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        if proc.poll() is not None:
            sys.exit(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    sys.exit(f"server at {url} not healthy after {timeout_s:.0f} s")


def real_run(a: argparse.Namespace, out: Path) -> dict:
    server = [sys.executable, "-m", "sglang_pd.launch_server", "--model-path", a.model_path, "--port", str(a.port),
              "--mode", "colocated", "--page-size", str(a.page_size), "--max-total-tokens", str(a.kv_capacity_tokens),
              "--chunked-prefill-size", str(a.chunked_prefill_size), "--max-running-requests", str(a.max_running),
              "--skip-tokenizer-init"] + (["--load-format", "dummy"] if a.dummy else [])
    proc = subprocess.Popen(server, stdout=open(out / "server.log", "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        wait_healthy(f"http://127.0.0.1:{a.port}", proc)
        bench = [sys.executable, "-m", "sglang_pd.bench_serving", "--backend", "sglang", "--port", str(a.port),
                 "--dataset-name", "trace", "--dataset-path", a.trace, "--num-prompts", str(a.num_prompts),
                 "--time-scale", str(a.time_scale), "--output-details", "--output-file", str(out / "bench.jsonl")]
        subprocess.run(bench, check=True)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    return json.loads((out / "bench.jsonl").read_text().splitlines()[-1])


def make_profile(a: argparse.Namespace, path: Path) -> Path:
    """Measure this machine's CPU engine (the offline Engine: the server's EngineCore) and
    write a profile (docs/profile.md): single prefills over a length grid, decode steps over
    batch x context. Prefill: the cost model's fit of the EXTEND steps; decode: a least-squares
    plane t = c0 + c1·B + c2·(total context) over the DECODE steps, written on a grid. A
    stand-in until the profiler (sglang_pd.tools.profile_cost_model) lands; it times whole
    steps (``StepProfile.total_s``), which is what the simulator's steps stand for."""
    from datetime import date

    from sglang_pd.offline_engine import Engine
    from sglang_pd.scheduling.cost_model import PrefillCostModel, PrefillPoint
    from sglang_pd.scheduling.profile import (DecodeGrid, PrefillCoeffsSpec, PrefillGrid, Profile, ProfileMeta,
                                              dump_profile)
    from sglang_pd.scheduling.step import ForwardMode

    eng = Engine(a.model_path, **server_kwargs(a))
    core = eng.core
    params = {"max_new_tokens": 1, "temperature": 0.0, "ignore_eos": True}
    eng.generate(input_ids=[[7] * 64], sampling_params=params)  # warm-up
    lengths = [32, 64, 128, 256, 512, 1024]
    pre: dict[int, list[float]] = {n: [] for n in lengths}
    fit = PrefillCostModel(prior_weight=0.0, min_samples=1, window=4096)
    for _ in range(3):
        for n in lengths:
            core.step_profiles.clear()
            eng.generate(input_ids=[[7] * n], sampling_params=params)
            for sp in core.step_profiles:
                if sp.mode is ForwardMode.EXTEND:
                    fit.add_sample(PrefillPoint(sp.batch_size, sp.new_tokens, sp.context_tokens, sp.total_s))
                    if sp.new_tokens == n and sp.batch_size == 1:
                        pre[n].append(sp.total_s)
    samples = []
    for b in (1, 2, 4, 8, 16):
        for c in (64, 256, 768):
            core.step_profiles.clear()
            eng.generate(input_ids=[[7] * c] * b, sampling_params={**params, "max_new_tokens": 12})
            samples += [(sp.batch_size, sp.context_tokens, sp.total_s) for sp in core.step_profiles
                        if sp.mode is ForwardMode.DECODE]
    eng.shutdown()
    c0, c1, c2 = _plane(samples)
    bs, cs = [1, 2, 4, 8, 16, 32, 64], [0, 1024, 4096, 16384, 65536]
    k = fit.coeffs
    prof = Profile(
        schema_version=1,
        meta=ProfileMeta(model=a.model_path, arch="measured", device="cpu", dtype="float32",
                         page_size=a.page_size, attention_backend="torch", created=date.today().isoformat(),
                         tool="scripts/sim_fidelity.py", notes="whole steps (total_s) of the offline engine"),
        prefill=PrefillGrid(new_tokens=lengths, context_tokens=[0],
                            seconds=[[sum(pre[n]) / len(pre[n])] for n in lengths],
                            coeffs=PrefillCoeffsSpec(launch_s=k.launch_s, per_req_s=k.per_req_s, a=k.a,
                                                     b=k.b + k.g_w, g_w=0.0, g_r=k.g_r)),
        decode=DecodeGrid(batch_sizes=bs, context_tokens=cs,
                          seconds=[[max(c0 + c1 * b + c2 * c, 1e-5) for c in cs] for b in bs]),
    )
    dump_profile(prof, path)
    print(f"profile: prefill {k}; decode t = {c0 * 1e3:.2f} ms + {c1 * 1e3:.3f} ms x B + {c2 * 1e6:.3f} us x ctx "
          f"({len(samples)} decode steps) -> {path}")
    return path


def _plane(samples: list[tuple[int, int, float]]) -> tuple[float, float, float]:
    """Least squares t = c0 + c1·B + c2·C (normal equations, 3x3)."""
    rows = [(1.0, float(b), float(c), t) for b, c, t in samples]
    A = [[sum(r[i] * r[j] for r in rows) for j in range(3)] for i in range(3)]
    v = [sum(r[i] * r[3] for r in rows) for i in range(3)]
    for col in range(3):  # Gaussian elimination with partial pivoting
        piv = max(range(col, 3), key=lambda r: abs(A[r][col]))
        A[col], A[piv], v[col], v[piv] = A[piv], A[col], v[piv], v[col]
        for r in range(col + 1, 3):
            f = A[r][col] / A[col][col]
            A[r] = [x - f * y for x, y in zip(A[r], A[col])]
            v[r] -= f * v[col]
    x = [0.0] * 3
    for r in (2, 1, 0):
        x[r] = (v[r] - sum(A[r][c] * x[c] for c in range(r + 1, 3))) / A[r][r]
    return x[0], x[1], x[2]


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
    ap.add_argument("--trace", required=True)
    ap.add_argument("--num-prompts", type=int, default=60)
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--port", type=int, default=30123)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--kv-capacity-tokens", type=int, default=65536)
    ap.add_argument("--chunked-prefill-size", type=int, default=2048)
    ap.add_argument("--max-running", type=int, default=256)
    a = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="sim_fidelity_"))
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
