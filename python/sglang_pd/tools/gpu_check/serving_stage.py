"""Stage serving: a colocated server (tiny model; Triton attention and CUDA graphs on the device)
started with launch_server, one sampled request (temperature 1, top-p/top-k) that must answer
200, then a short bench_serving run (random prompts, fixed rate), then the server stopped. The
server's last log lines come back with the piece. On the device the server gets an empty Triton
cache of its own, and the kernels compiled after /health answered (after the start-up warm-up,
i.e. under the requests) are listed: each one stalled a live request (seconds of TTFT); the stage
is partial when there is any."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from functools import partial
from pathlib import Path
from typing import Any

from sglang_pd.tools.gpu_check.common import Ctx, attempt
from sglang_pd.utils.server_procs import free_port, require_healthy, spawn_logged, stop

START_TIMEOUT_S = 45.0  # an empty Triton cache: the warm-up compiles every variant
STOP_GRACE_S = 10.0  # the stage has a short time limit; a server that ignores SIGTERM is killed


def sampled_request(url: str) -> dict[str, Any]:
    body = {"text": "The quick brown fox", "sampling_params": {
        "temperature": 1.0, "top_p": 0.9, "top_k": 40, "max_new_tokens": 16, "ignore_eos": True}}
    req = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=20) as r:  # a 500 raises HTTPError here
        out = json.loads(r.read())
    return {"status": 200, "completion_tokens": out["meta_info"]["completion_tokens"]}


def bench(ctx: Ctx, url: str) -> dict[str, Any]:
    out_file = ctx.work / "bench_serving.jsonl"
    n, rate = (4, 8) if ctx.dry_run else (64, 32)
    cmd = [sys.executable, "-m", "sglang_pd.bench_serving", "--backend", "sglang", "--base-url", url,
           "--dataset-name", "random", "--num-prompts", str(n), "--random-input-len", "128",
           "--random-output-len", "32" if not ctx.dry_run else "8", "--random-range-ratio", "1",
           "--request-rate", str(rate), "--output-file", str(out_file), "--disable-tqdm",
           "--request-timeout", "20", "--tokenizer", str(ctx.tiny_model)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=25, check=False)
    if proc.returncode != 0 or not out_file.exists():
        raise RuntimeError(f"bench_serving exit {proc.returncode}: {proc.stdout[-1500:]} {proc.stderr[-1500:]}")
    rec = json.loads(out_file.read_text().strip().splitlines()[-1])
    keep = ("completed", "errors", "duration", "request_throughput", "output_throughput",
            "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms",
            "p99_tpot_ms", "mean_itl_ms", "median_e2e_latency_ms")
    return {k: rec[k] for k in keep if k in rec} | {"num_prompts": n, "request_rate": rate}


def start_server(ctx: Ctx, log: Path, graphs: bool) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "sglang_pd.launch_server", "--model-path", str(ctx.tiny_model),
           "--host", "127.0.0.1", "--port", str(port), "--device", ctx.device, "--dtype", ctx.dtype_name,
           "--attention-backend", "torch" if ctx.dry_run else "triton", "--max-total-tokens", "65536"]
    if not graphs:
        cmd.append("--disable-cuda-graph")
    return spawn_logged(cmd, log), f"http://127.0.0.1:{port}"


def triton_kernels(cache: Path) -> list[str]:
    """Every compiled kernel in a Triton cache dir: one metadata JSON each (group files aside)."""
    out = []
    for f in sorted(cache.rglob("*.json")) if cache.exists() else []:
        if not f.name.startswith("__grp__"):
            try:
                out.append(f"{f.parent.name}/{json.loads(f.read_text()).get('name', f.stem)}")
            except (OSError, ValueError):
                out.append(f"{f.parent.name}/{f.stem}")
    return out


def _exit_on_term(signum: int, frame: Any) -> None:
    raise SystemExit(f"stopped by signal {signum} (the stage's time limit)")


def _healthy(url: str, proc: subprocess.Popen) -> dict[str, bool]:
    require_healthy(url, proc, START_TIMEOUT_S)
    return {"ok": True}


def run(ctx: Ctx, rec: Any) -> str:
    log = ctx.work / "server.log"
    proc: subprocess.Popen | None = None
    # check.sh's timeout sends SIGTERM: unwind through ``finally`` so the server (its own
    # session, which the timeout does not reach) is stopped and does not hold the GPU
    signal.signal(signal.SIGTERM, _exit_on_term)
    cache = ctx.work / "triton_cache_serving"
    if not ctx.dry_run:
        os.environ["TRITON_CACHE_DIR"] = str(cache)  # inherited by the server: starts empty
    try:
        # graphs on (the default) first; if that server cannot start, once more without graphs
        for graphs in ([True] if ctx.dry_run else [True, False]):
            proc, url = start_server(ctx, log, graphs)
            start = attempt(rec, f"start_graphs_{'on' if graphs else 'off'}",
                            partial(_healthy, url, proc))
            if "error" not in start:
                break
            stop(proc, STOP_GRACE_S)
        if "error" in start:
            rec.piece["status"] = "fail"
            return f"server did not start: {start['error']}"
        warm = triton_kernels(cache)
        sampled = attempt(rec, "sampled_request", lambda: sampled_request(url))
        result = attempt(rec, "bench_serving", lambda: bench(ctx, url))
        late = sorted(set(triton_kernels(cache)) - set(warm))
        rec.data["jit_after_warmup"] = {"at_health": len(warm), "compiled_under_load": len(late),
                                        "kernels": [k.split("/")[1] for k in late]}
    finally:
        if proc is not None:
            stop(proc, STOP_GRACE_S)
        if log.exists():
            rec.data["server_log_tail"] = log.read_text(errors="replace").splitlines()[-50:]
        rec.save()
    if "error" in sampled or "error" in result:
        rec.piece["status"] = "fail"
        return "; ".join(x["error"][:150] for x in (sampled, result) if "error" in x)
    mode = "graphs" if "start_graphs_off" not in rec.data else "no graphs (graphs failed to start)"
    jit = rec.data.get("jit_after_warmup", {}).get("compiled_under_load", 0)
    if jit:
        rec.piece["status"] = "partial"  # a request paid a compile the warm-up should have done
    return (f"{jit} kernels JIT-compiled after warm-up; " if jit else "") + (f"{mode}: {result.get('completed')}/{result['num_prompts']} done, "
            f"{result.get('output_throughput', 0):.0f} out tok/s, TTFT p50 "
            f"{result.get('median_ttft_ms', 0):.1f} ms, TPOT p50 {result.get('median_tpot_ms', 0):.2f} ms")
