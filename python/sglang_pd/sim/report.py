"""A simulation's outputs through bench's one definition of the metrics: every request becomes
a ``bench.backends.RequestResult`` and goes through ``bench.metrics.compute_metrics``
(TTFT, TPOT, attainment as bench_serving reports them; E2E attainment = both SLOs met, bench's
joint ``slo_attainment``, as Kairos defines it). Plus per-request JSON lines, queue lengths
over time, and PNG plots (bench/plots.py for a run; attainment vs QPS per policy here).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sglang_pd.bench.backends import RequestResult
from sglang_pd.bench.metrics import BenchMetrics, SloSpec, compute_metrics
from sglang_pd.bench.report import format_summary, summary_fields
from sglang_pd.sim.cluster_spec import SimResult
from sglang_pd.sim.instance import Track


def to_result(t: Track) -> RequestResult:
    ok = not t.error and t.first_token is not None and t.finish is not None
    r = RequestResult(t.index, t.prompt_len, t.output_len, output_len=t.output_len if ok else 0, success=ok,
                      error_kind="" if ok else "sim_abort", error=t.error, start_s=t.arrival,
                      scheduled_s=t.arrival)
    if ok:
        r.ttft_s = t.first_token - t.arrival  # type: ignore[operator]
        r.e2e_s = t.finish - t.arrival  # type: ignore[operator]
        r.end_s = t.finish  # type: ignore[assignment]
    return r


def metrics(res: SimResult, slo: SloSpec, long_threshold: int = 8192) -> tuple[list[RequestResult], BenchMetrics]:
    results = [to_result(t) for t in res.tracks]
    start = min((t.arrival for t in res.tracks), default=0.0)
    end = max((t.finish or t.arrival for t in res.tracks), default=0.0)
    return results, compute_metrics(results, max(end - start, 1e-9), slo, long_threshold)


def _pick(xs: list[float], q: float) -> float:
    """The q-quantile of sorted ``xs`` (nearest rank, from below); NaN when empty."""
    return xs[min(int(q * len(xs)), len(xs) - 1)] if xs else float("nan")


def class_ttft(res: SimResult, default_slo_s: float | None) -> dict[str, dict[str, float]]:
    """Per request class (``Track.request_class``, by new tokens): count, TTFT SLO attainment
    against each request's own SLO (its class's; ``default_slo_s`` when it carries none; a
    failed request misses), TTFT p50 / p90 in seconds. Bench's metrics take one SLO for all."""
    out: dict[str, dict[str, float]] = {}
    for cls in ("short", "long"):
        ts = [t for t in res.tracks if t.request_class == cls]
        if not ts:
            continue
        ttfts = sorted(t.first_token - t.arrival for t in ts if not t.error and t.first_token is not None)
        met = sum(1 for t in ts if not t.error and t.first_token is not None
                  and (t.slo_ttft_s or default_slo_s or float("inf")) >= t.first_token - t.arrival)
        out[cls] = {"n": len(ts), "attainment": met / len(ts), "ttft_p50_s": _pick(ttfts, 0.5),
                    "ttft_p90_s": _pick(ttfts, 0.9)}
    return out


def format_class_ttft(by_class: dict[str, dict[str, float]]) -> str:
    return "\n".join(f"{cls:<5} n={v['n']:.0f} TTFT SLO attainment {100 * v['attainment']:5.1f}%  "
                     f"TTFT p50/p90 {v['ttft_p50_s']:.3f}/{v['ttft_p90_s']:.3f} s" for cls, v in by_class.items())


def request_record(t: Track) -> dict[str, Any]:
    ok = not t.error and t.first_token is not None
    tpot = ((t.finish - t.first_token) / (t.output_len - 1)  # type: ignore[operator]
            if ok and t.output_len > 1 else None)
    return {"index": t.index, "arrival_s": t.arrival, "prompt_len": t.prompt_len, "cached_len": t.cached_len,
            "output_len": t.output_len, "source": t.source,
            "request_class": t.request_class, "slo_ttft_s": t.slo_ttft_s,
            "prefill_instance": t.p_inst,
            "decode_instance": t.d_inst, "prefill_done_s": t.prefill_done, "first_token_s": t.first_token,
            "finish_s": t.finish, "ttft_s": (t.first_token - t.arrival) if ok and t.first_token is not None else None, "tpot_s": tpot,
            "e2e_s": (t.finish - t.arrival) if ok and t.finish is not None else None, "error": t.error}


def write_requests(path: str | Path, res: SimResult) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "w") as f:
        for t in res.tracks:
            f.write(json.dumps(request_record(t)) + "\n")


def run_info(res: SimResult, describe: str, qps: float | None, extra: dict[str, Any]) -> dict[str, Any]:
    steps = sum(i.num_steps for i in res.instances)
    return {"backend": f"sim {describe}", "request_rate": qps if qps is not None else float("inf"),
            "dataset_name": extra.get("workload", ""), "sim_end_s": res.sim_end_s, "wall_s": res.wall_s,
            "num_events": res.num_events, "num_steps": steps,
            "instances": {i.name: {"steps": i.num_steps, "busy_frac": i.busy_s / res.sim_end_s if res.sim_end_s else 0.0,
                                   "prefill_tokens": i.prefill_tokens, "decode_tokens": i.decode_tokens,
                                   "retractions": i.sched.num_retractions,
                                   "prefix_hit_rate": i.prefix_cache.hit_rate if i.prefix_cache else None}
                          for i in res.instances},
            # PD: prompt tokens whose KV crossed the link, and those decode-side reuse spared
            "kv_transfer_tokens": sum(t.transfer_tokens for t in res.tracks),
            "decode_reused_tokens": sum(t.reused_len for t in res.tracks), **extra}


def summary_record(m: BenchMetrics, info: dict[str, Any]) -> dict[str, Any]:
    rec = dict(info)
    rec.update(summary_fields(m.overall))
    rec["by_class"] = {k: summary_fields(v) for k, v in m.by_class.items()}
    rec["slo_ttft_ms"], rec["slo_tpot_ms"] = m.slo.ttft_ms, m.slo.tpot_ms
    return rec


def format_run(m: BenchMetrics, info: dict[str, Any]) -> str:
    text = format_summary(m, info)
    lines = [text, (f"simulated {info['sim_end_s']:.1f} s in {info['wall_s']:.2f} s wall "
                    f"({info['num_events']} events, {info['num_steps']} steps)")]
    for name, st in info["instances"].items():
        hit = st["prefix_hit_rate"]
        lines.append(f"  {name}: busy {100 * st['busy_frac']:.1f}%  steps {st['steps']}  prefill tok "
                     f"{st['prefill_tokens']}  decode tok {st['decode_tokens']}  retractions {st['retractions']}"
                     + (f"  prefix hits {100 * hit:.1f}%" if hit is not None else ""))
    if info.get("decode_reused_tokens"):
        lines.append(f"  KV transferred: {info['kv_transfer_tokens']} prompt tokens; decode-side reuse spared "
                     f"{info['decode_reused_tokens']}")
    return "\n".join(lines)


def plot_queues(res: SimResult, path: str | Path, title: str) -> Path:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 6), layout="constrained")
    ax_q, ax_u = fig.subplots(2, 1, sharex=True)
    ts = [s[0] for s in res.samples]
    for k, inst in enumerate(res.instances):
        ax_q.plot(ts, [s[1][k][0] for s in res.samples], label=f"{inst.name} waiting")
        if inst.role != "prefill":
            ax_q.plot(ts, [s[1][k][1] for s in res.samples], linestyle="--", label=f"{inst.name} running")
        ax_u.plot(ts, [100 * s[1][k][3] for s in res.samples], label=inst.name)
    ax_q.set_ylabel("requests")
    ax_q.legend(fontsize=7, ncol=4)
    ax_q.grid(alpha=0.3)
    ax_u.set_ylabel("KV pool in use (%)")
    ax_u.set_xlabel("simulated time (s)")
    ax_u.grid(alpha=0.3)
    fig.suptitle(f"Queues and KV usage over time - {title}")
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=110)
    return p


def plot_policy_sweep(qps: Sequence[float], series: Mapping[str, Sequence[BenchMetrics]], out: str | Path,
                      title: str) -> list[Path]:
    """One PNG per metric (E2E, TTFT, TPOT attainment, goodput): a line per policy vs QPS."""
    from matplotlib.figure import Figure

    getters = {
        "e2e_attainment": ("E2E SLO attainment (%): TTFT and TPOT met", lambda m: 100 * (m.overall.slo_attainment or 0)),
        "ttft_attainment": ("TTFT SLO attainment (%)", lambda m: 100 * (m.overall.ttft_attainment or 0)),
        "tpot_attainment": ("TPOT SLO attainment (%)", lambda m: 100 * (m.overall.tpot_attainment or 0)),
        "goodput": ("goodput (req/s)", lambda m: m.overall.goodput_rps or 0.0),
    }
    files = []
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    for key, (label, get) in getters.items():
        fig = Figure(figsize=(7, 4.5), layout="constrained")
        ax = fig.subplots()
        for name, runs in series.items():
            style = ":" if "exact" in name else "-"
            ax.plot(list(qps), [get(m) for m in runs], marker="o", linestyle=style, label=name)
        ax.set_xlabel("offered load (req/s)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title(f"{label.split(' (')[0]} vs QPS - {title}", fontsize=10)
        p = d / f"{key}.png"
        fig.savefig(p, dpi=110)
        files.append(p)
    return files
