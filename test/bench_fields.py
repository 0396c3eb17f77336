"""The JSONL fields a bench_serving run must write: SGLang's, then ours (issue 8)."""

from __future__ import annotations

SGLANG_FIELDS = [
    "backend",
    "dataset_name",
    "request_rate",
    "max_concurrency",
    "duration",
    "completed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "input_throughput",
    "output_throughput",
    "total_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "std_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "p95_itl_ms",
    "p99_itl_ms",
    "mean_e2e_latency_ms",
    "median_e2e_latency_ms",
    "p99_e2e_latency_ms",
    "concurrency",
]
OUR_FIELDS = [
    "slo_ttft_ms",
    "slo_tpot_ms",
    "ttft_attainment",
    "tpot_attainment",
    "slo_attainment",
    "goodput_rps",
    "errors",
    "by_class",
]
