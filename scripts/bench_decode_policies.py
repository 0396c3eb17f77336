#!/usr/bin/env python3
"""Decode policies back to back on the real engine: continuous, slack, slack+ (issue 21).

    python scripts/bench_decode_policies.py --model-path DIR --load-format dummy \
        --slo-tpot-ms 150 --num-prompts 32 --out-dir out/decode_policies \
        [--cost-model-profile PROFILE.json] [--length-mix 6144:256:0.1,384:256:0.9]

One colocated server per policy (prefill steps preempt decode there), or with ``--pd`` a 1P+1D
pair behind SGLang's router as ``scripts/quickstart.sh`` starts it (the decode server runs the
policy and sees no prefill steps; the prefill server is FCFS), the same seeded
``bench_serving --dataset-name mix`` workload against each, all requests at once; back to back, or all at the same time with ``--concurrent`` (on a shared machine the
other jobs' load changes between back-to-back runs; run together, the policies share it). Prints TPOT attainment, ITL p99, per-request decode tokens/s (p50, p90), total
tokens/s, and each policy's ratio to continuous. Timings: say which machine, and whether shared.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from sglang_pd.utils.server_procs import free_port, popen_own_group, stop, wait_healthy


POLICIES = ("continuous", "slack", "slack+")


class Deployment:
    """The processes serving one policy (one colocated server, or prefill + decode + router)."""

    def __init__(self, procs: list[subprocess.Popen], url: str) -> None:
        self.procs, self.url = procs, url

    def stop(self) -> None:
        for proc in reversed(self.procs):  # router first, then the servers
            stop(proc)


def require_healthy(proc: subprocess.Popen, url: str, what: str, log: Path) -> None:
    if not wait_healthy(url, proc):
        stop(proc)
        raise RuntimeError(f"{what} not healthy (exit code {proc.poll()}); see {log}")


def server_cmd(args: argparse.Namespace, port: int, extra: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "sglang_pd.launch_server", "--model-path", args.model_path,
           "--load-format", args.load_format, "--port", str(port),
           "--max-total-tokens", str(args.max_total_tokens), "--slo-tpot-ms", str(args.slo_tpot_ms)]
    if args.cost_model_profile:
        cmd += ["--cost-model-profile", args.cost_model_profile]
    return cmd + extra + args.server_arg


def start(args: argparse.Namespace, policy: str, log: Path) -> Deployment:
    if args.pd:
        return start_pd(args, policy, log)
    port = free_port()
    proc = popen_own_group(server_cmd(args, port, ["--decode-policy", policy]), open(log, "wb"))
    url = f"http://127.0.0.1:{port}"
    require_healthy(proc, url, f"server for {policy}", log)
    return Deployment([proc], url)


def start_pd(args: argparse.Namespace, policy: str, log: Path) -> Deployment:
    """Prefill (FCFS) + decode (``policy``) + a PD router (SGLang's, as scripts/quickstart.sh)."""
    p_port, d_port, boot, r_port = free_port(), free_port(), free_port(), free_port()
    logs = [log.with_name(f"{log.stem}_{part}.log") for part in ("prefill", "decode", "router")]
    procs: list[subprocess.Popen] = []
    try:
        procs.append(popen_own_group(server_cmd(args, p_port, [
            "--mode", "prefill", "--disaggregation-bootstrap-port", str(boot)]), open(logs[0], "wb")))
        procs.append(popen_own_group(server_cmd(args, d_port, ["--mode", "decode", "--decode-policy", policy]), open(logs[1], "wb")))
        require_healthy(procs[0], f"http://127.0.0.1:{p_port}", "prefill server", logs[0])
        require_healthy(procs[1], f"http://127.0.0.1:{d_port}", f"decode server ({policy})", logs[1])
        router = "sglang_router.launch_router" if args.router == "sglang" else "sglang_pd_router"
        procs.append(popen_own_group([
            sys.executable, "-m", router, "--pd-disaggregation",
            "--prefill", f"http://127.0.0.1:{p_port}", str(boot), "--decode", f"http://127.0.0.1:{d_port}",
            "--host", "127.0.0.1", "--port", str(r_port)], open(logs[2], "wb")))
        url = f"http://127.0.0.1:{r_port}"
        require_healthy(procs[2], url, "router", logs[2])
    except BaseException:
        Deployment(procs, "").stop()
        raise
    return Deployment(procs, url)


def bench_cmd(args: argparse.Namespace, url: str, out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "sglang_pd.bench_serving", "--base-url", url, "--backend", "sglang",
           "--dataset-name", "mix", "--length-mix", args.length_mix, "--num-prompts", str(args.num_prompts),
           "--slo-tpot-ms", str(args.slo_tpot_ms), "--long-threshold", str(args.long_threshold),
           "--seed", str(args.seed), "--output-file", str(out), "--disable-tqdm", "--output-details"]
    if args.tokenizer:
        cmd += ["--tokenizer", args.tokenizer]
    return cmd


def bench(args: argparse.Namespace, url: str, out: Path) -> dict:
    subprocess.run(bench_cmd(args, url, out), check=True,
                   stdout=subprocess.DEVNULL if args.quiet else None)
    return json.loads(out.read_text().splitlines()[-1])


def run_concurrently(args: argparse.Namespace, policies: list[str], out_dir: Path) -> dict[str, dict]:
    """All servers and clients at once: on a shared machine each policy then sees the same
    interference (run back to back, the load of other jobs differs from run to run)."""
    servers = [start(args, p, out_dir / f"server_{p}.log") for p in policies]
    outs = [out_dir / f"{p.replace('+', '_plus')}.jsonl" for p in policies]
    try:
        clients = [subprocess.Popen(bench_cmd(args, d.url, out), stdout=subprocess.DEVNULL)
                   for d, out in zip(servers, outs)]
        for c in clients:
            if c.wait() != 0:
                raise RuntimeError(f"bench_serving failed: {c.args}")
    finally:
        for d in servers:
            d.stop()
    return {p: json.loads(o.read_text().splitlines()[-1]) for p, o in zip(policies, outs)}


def row(policy: str, r: dict, base: dict | None) -> str:
    def ratio(key: str) -> str:
        return f"{r[key] / base[key]:.2f}x" if base and base.get(key) else "-"
    att = r.get("tpot_attainment") or 0.0
    return (f"{policy:<11}{100 * att:>8.1f}%{r['p99_itl_ms']:>10.1f}{r['median_decode_tps']:>10.2f}"
            f"{r['p90_decode_tps']:>10.2f}{r['total_throughput']:>10.1f}   p50 {ratio('median_decode_tps')}"
            f", total {ratio('total_throughput')}, ITL p99 {ratio('p99_itl_ms')}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--slo-tpot-ms", type=float, required=True)
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--length-mix", default="6144:256:0.1,384:256:0.9")
    ap.add_argument("--long-threshold", type=int, default=2048)
    ap.add_argument("--max-total-tokens", type=int, default=65536)
    ap.add_argument("--cost-model-profile", default=None)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--out-dir", default="out/decode_policies")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--pd", action="store_true",
                    help="1P+1D behind SGLang's router per policy (the decode server runs the policy)")
    ap.add_argument("--router", choices=("sglang", "ours"), default="sglang",
                    help="with --pd: SGLang's router (as the quickstart) or sglang-pd-router")
    ap.add_argument("--concurrent", action="store_true",
                    help="run the policies' servers and clients at the same time (fair on a shared machine)")
    ap.add_argument("--server-arg", action="append", default=[], help="extra server flag (repeatable)")
    args = ap.parse_args()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    policies = args.policies.split(",")
    if args.concurrent:
        results = run_concurrently(args, policies, out_dir)
    for policy in [] if args.concurrent else policies:
        deployment = start(args, policy, out_dir / f"server_{policy}.log")
        try:
            results[policy] = bench(args, deployment.url, out_dir / f"{policy.replace('+', '_plus')}.jsonl")
        finally:
            deployment.stop()
    base = results.get("continuous")
    router = "SGLang's router" if args.router == "sglang" else "sglang-pd-router"
    where = f"1P+1D behind {router}" if args.pd else "colocated"
    print(f"\nSLO TPOT {args.slo_tpot_ms} ms, {args.num_prompts} requests, mix {args.length_mix}, {where}")
    print(f"{'policy':<11}{'TPOT att':>9}{'ITL p99':>10}{'p50 tok/s':>10}{'p90 tok/s':>10}{'total':>10}"
          "   (per-request decode tok/s; total tok/s)")
    for policy, r in results.items():
        print(row(policy, r, base))
    (out_dir / "summary.json").write_text(json.dumps({p: {k: r.get(k) for k in (
        "tpot_attainment", "p99_itl_ms", "median_decode_tps", "p90_decode_tps", "total_throughput",
        "output_throughput", "duration")} for p, r in results.items()}, indent=2))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
