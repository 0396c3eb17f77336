"""Console summary (SGLang's layout plus SLO lines) and the JSONL record."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

from sglang_pd.bench.backends import RequestResult
from sglang_pd.bench.metrics import BenchMetrics, LatencyStats, Summary

_W = 50  # banner width, as SGLang prints it

# Field-name stem per latency family, as in SGLang's JSONL (e.g. mean_e2e_latency_ms).
_FAMILIES = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2e": "e2e_latency"}
_STATS = ("mean", "median", "std", "p90", "p95", "p99", "max")


def _rule(title: str = "", fill: str = "-") -> str:
    return f"{title:{fill}^{_W}}"


def _line(label: str, value: Any) -> str:
    return f"{label:<40} {value:<10}"


def _num(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100.0 * x:.2f}"


def _rate(x: float) -> str | float:
    return "inf" if math.isinf(x) else x


def format_summary(m: BenchMetrics, info: dict[str, Any]) -> str:
    """The text block printed after a run; every number carries its unit in the label."""
    o = m.overall
    out = [_rule(" Serving Benchmark Result ", "=")]
    out.append(_line("Backend:", info["backend"]))
    rate = info["request_rate"]
    out.append(_line("Traffic request rate (req/s):", "inf" if math.isinf(rate) else f"{rate:g}"))
    if info.get("trace_timed"):
        out.append(_line("Trace time scale (x):", info["time_scale"]))
    out.append(_line("Max request concurrency:", info.get("max_concurrency") or "not set"))
    out.append(_line("Successful requests:", o.completed))
    out.append(_line("Failed requests:", o.failed))
    out.append(_line("Benchmark duration (s):", _num(m.duration_s)))
    out.append(_line("Total input tokens:", o.total_input_tokens))
    out.append(_line("Total generated tokens:", o.total_output_tokens))
    out.append(_line("Request throughput (req/s):", _num(o.request_throughput)))
    out.append(_line("Input token throughput (tok/s):", _num(o.input_throughput)))
    out.append(_line("Output token throughput (tok/s):", _num(o.output_throughput)))
    out.append(_line("Total token throughput (tok/s):", _num(o.total_throughput)))
    out.append(_line("Concurrency (requests in flight):", _num(o.concurrency)))
    sections = (
        ("End-to-End Latency", "E2E Latency", o.e2e),
        ("Time to First Token", "TTFT", o.ttft),
        ("Time per Output Token (excl. 1st token)", "TPOT", o.tpot),
        ("Inter-Token Latency", "ITL", o.itl),
    )
    for title, name, st in sections:
        out.append(_rule(title))
        out.extend(_stat_lines(name, st))
    out.append(_line("Median per-request decode (tok/s):", _num(o.decode_tps.median)))
    out.append(_line("P90 per-request decode (tok/s):", _num(o.decode_tps.p90)))
    out.append(_rule("SLO Attainment"))
    out.append(_line("TTFT SLO (ms):", _num(m.slo.ttft_ms, 1)))
    if m.slo.ttft_ms_long is not None:
        out.append(_line("TTFT SLO, long prompts (ms):", _num(m.slo.ttft_ms_long, 1)))
    out.append(_line("TPOT SLO (ms):", _num(m.slo.tpot_ms, 1)))
    out.append(_line("TTFT attainment (%):", _pct(o.ttft_attainment)))
    out.append(_line("TPOT attainment (%):", _pct(o.tpot_attainment)))
    out.append(_line("SLO attainment, both (%):", _pct(o.slo_attainment)))
    out.append(_line("Goodput (req/s):", _num(o.goodput_rps)))
    out.append(_rule("Errors"))
    out.append(_line("Errors by kind (requests):", _errors(o.errors)))
    if info.get("not_sent"):
        out.append(_line("Not sent, cap or failed turn (requests):", info["not_sent"]))
    disp = info.get("dispatch_error_ms") or {}
    if disp:
        out.append(_line("Mean |send - planned| time (ms):", _num(disp["mean_ms"], 3)))
        out.append(_line("P99 |send - planned| time (ms):", _num(disp["p99_ms"], 3)))
        out.append(_line("Max |send - planned| time (ms):", _num(disp["max_ms"], 3)))
    out.append(_rule("By prompt length"))
    out.append(_class_table(m))
    out.append(_rule("", "="))
    return "\n".join(out)


def _stat_lines(name: str, st: LatencyStats) -> list[str]:
    return [
        _line(f"Mean {name} (ms):", _num(st.mean)),
        _line(f"Median {name} (ms):", _num(st.median)),
        _line(f"P90 {name} (ms):", _num(st.p90)),
        _line(f"P95 {name} (ms):", _num(st.p95)),
        _line(f"P99 {name} (ms):", _num(st.p99)),
        _line(f"Max {name} (ms):", _num(st.max)),
    ]


def _errors(errors: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in errors.items()) or "none"


def _class_table(m: BenchMetrics) -> str:
    """One row per length class: latency, then attainment of each SLO the class is held to."""
    head = f"{'class':<6}{'reqs':>6}{'ok':>6}{'TTFT p50/p99 (ms)':>20}{'TPOT p50 (ms)':>14}"
    head += f"{'TTFT att (%)':>13}{'TPOT att (%)':>13}{'SLO att (%)':>12}{'goodput (req/s)':>16}"
    rows = [f"long: prompt >= {m.long_threshold} tokens; short: below", head]
    for name, s in m.by_class.items():
        if not s.num_requests:
            rows.append(f"{name:<6}{0:>6}{0:>6}{'-':>20}{'-':>14}{'-':>13}{'-':>13}{'-':>12}"
                        f"{'-':>16}")
            continue
        ttft = f"{s.ttft.median:.1f}/{s.ttft.p99:.1f}"
        rows.append(
            f"{name:<6}{s.num_requests:>6}{s.completed:>6}{ttft:>20}{_num(s.tpot.median):>14}"
            f"{_pct(s.ttft_attainment):>13}{_pct(s.tpot_attainment):>13}"
            f"{_pct(s.slo_attainment):>12}{_num(s.goodput_rps):>16}"
        )
    return "\n".join(rows)


def summary_fields(s: Summary) -> dict[str, Any]:
    """SGLang's flat field names for one population, plus our SLO fields."""
    d: dict[str, Any] = {
        "num_requests": s.num_requests,
        "completed": s.completed,
        "failed": s.failed,
        "total_input_tokens": s.total_input_tokens,
        "total_output_tokens": s.total_output_tokens,
        "request_throughput": s.request_throughput,
        "input_throughput": s.input_throughput,
        "output_throughput": s.output_throughput,
        "total_throughput": s.total_throughput,
        "concurrency": s.concurrency,
    }
    for attr, stem in _FAMILIES.items():
        st = asdict(getattr(s, attr))
        for k in _STATS:
            d[f"{k}_{stem}_ms"] = st[k]
    d.update(
        ttft_attainment=s.ttft_attainment,
        tpot_attainment=s.tpot_attainment,
        slo_attainment=s.slo_attainment,
        slo_met=s.slo_met,
        goodput_rps=s.goodput_rps,
        errors=s.errors,
    )
    for k in ("mean", "median", "p90", "p99"):  # per-request decode speed, tok/s
        d[f"{k}_decode_tps"] = getattr(s.decode_tps, k)
    return d


def jsonl_record(
    m: BenchMetrics,
    info: dict[str, Any],
    results: Sequence[RequestResult] | None = None,
) -> dict[str, Any]:
    """One JSONL line. ``results`` adds SGLang's per-request detail lists (times in s)."""
    rec: dict[str, Any] = {
        "backend": info["backend"],
        "dataset_name": info["dataset_name"],
        "request_rate": _rate(info["request_rate"]),
        "max_concurrency": info.get("max_concurrency"),
        "duration": m.duration_s,
    }
    rec.update(summary_fields(m.overall))
    rec.update(
        slo_ttft_ms=m.slo.ttft_ms,
        slo_ttft_ms_long=m.slo.ttft_ms_long,
        slo_tpot_ms=m.slo.tpot_ms,
        long_threshold=m.long_threshold,
        by_class={k: summary_fields(v) for k, v in m.by_class.items()},
        timestamp=time.time(),
    )
    for k, v in info.items():
        rec.setdefault(k, _rate(v) if isinstance(v, float) else v)
    if results is not None:
        rec.update(
            input_lens=[r.prompt_len for r in results],
            output_lens=[r.output_len for r in results],
            ttfts=[r.ttft_s for r in results],
            itls=[r.itl_s for r in results],
            e2e_latencies=[r.e2e_s for r in results],
            start_times=[r.start_s for r in results],
            # Per-request error text lives here: "errors" keeps its by-kind counts in every mode.
            error_kinds=[r.error_kind for r in results],
            error_messages=[r.error for r in results],
            generated_texts=[r.generated_text for r in results],
        )
    return rec


def append_jsonl(path: str | Path, record: dict[str, Any]) -> None:
    p = Path(path)
    if p.parent and not p.parent.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a") as f:
        f.write(json.dumps(record, allow_nan=False) + "\n")


def print_summary(m: BenchMetrics, info: dict[str, Any], file: TextIO | None = None) -> None:
    print(format_summary(m, info), file=file, flush=True)
