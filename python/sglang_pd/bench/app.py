"""Ties the pieces together: flags -> workload -> runs -> metrics -> report/JSONL/plots."""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import sys
from dataclasses import replace
from typing import Any

import aiohttp

from sglang_pd.bench.backends import BackendConfig
from sglang_pd.bench.cli import build_parser, validate
from sglang_pd.bench.datasets import DatasetSpec, build_items, schedule
from sglang_pd.bench.metrics import BenchMetrics, SloSpec, compute_metrics, dispatch_error_summary
from sglang_pd.bench.prompts import PromptFactory, config_vocab_size, load_tokenizer
from sglang_pd.bench.report import append_jsonl, jsonl_record, print_summary
from sglang_pd.bench.runner import BenchError, RunOptions, RunOutput, run_sessions
from sglang_pd.bench.workload import build_sessions, session_heads

logger = logging.getLogger("sglang_pd.bench")


async def _model_info(base_url: str) -> dict[str, Any]:
    """``GET /get_model_info`` from the target server; {} when it cannot answer."""
    try:
        timeout = aiohttp.ClientTimeout(total=10)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            async with http.get(base_url.rstrip("/") + "/get_model_info") as resp:
                if resp.status == 200:
                    return dict(await resp.json(content_type=None))
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
        logger.warning("GET /get_model_info failed: %s", e)
    return {}


def _factory(args: argparse.Namespace, info: dict[str, Any]) -> tuple[PromptFactory, str | None]:
    source = args.tokenizer or info.get("tokenizer_path") or info.get("model_path")
    tok = load_tokenizer(source)
    if args.tokenizer and tok is None:
        raise BenchError(f"--tokenizer {args.tokenizer}: no readable tokenizer.json there")
    if tok is None:
        how = (
            "input ids from a 1000-id range"
            if args.backend == "sglang"
            else "approximate word prompts"
        )
        print(f"warning: no tokenizer.json found (tried {source!r}); using {how}", file=sys.stderr)
    vocab = None if tok is not None else config_vocab_size(source)
    return PromptFactory(tok, vocab, seed=args.seed), (source if tok is not None else None)


def _info(
    args: argparse.Namespace, rate: float, timed: bool, tokenizer: str | None
) -> dict[str, Any]:
    return {
        "backend": args.backend,
        "dataset_name": args.dataset_name,
        "dataset_path": args.dataset_path,
        "request_rate": rate,
        "burstiness": args.burstiness,
        "max_concurrency": args.max_concurrency,
        "num_prompts": args.num_prompts,
        "random_input_len": args.random_input_len,
        "random_output_len": args.random_output_len,
        "random_range_ratio": args.random_range_ratio,
        "length_mix": args.length_mix,
        "max_input_len": args.max_input_len,
        "max_output_len": args.max_output_len,
        "multi_turn": args.multi_turn,
        "time_scale": args.time_scale,
        "trace_timed": timed,
        "stream": not args.disable_stream,
        "seed": args.seed,
        "tokenizer": tokenizer,
        "base_url": args.base_url,
    }


def run_benchmark(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Run the benchmark the flags describe (once, or once per sweep rate); return JSONL records."""
    validate(args)
    args.base_url = (args.base_url or f"http://{args.host}:{args.port}").rstrip("/")
    info = asyncio.run(_model_info(args.base_url))
    factory, tok_source = _factory(args, info)
    spec = DatasetSpec(
        name=args.dataset_name,
        path=args.dataset_path,
        num_prompts=args.num_prompts,
        random_input_len=args.random_input_len,
        random_output_len=args.random_output_len,
        random_range_ratio=args.random_range_ratio,
        length_mix=args.length_mix,
        max_input_len=args.max_input_len,
        max_output_len=args.max_output_len,
        ignore_trace_times=args.ignore_trace_times,
        seed=args.seed,
    )
    items = build_items(spec)
    heads = session_heads(items, args.multi_turn)
    timed = heads[0].arrival_s is not None
    if timed and args.sweep_rates:
        raise BenchError("--sweep-rates needs arrivals from a rate: add --ignore-trace-times")
    native = args.backend == "sglang"
    sessions = build_sessions(items, [0.0] * len(heads), factory, native, args.multi_turn)
    if args.slo_ttft_ms_long is not None and args.slo_ttft_ms is None:
        raise BenchError("--slo-ttft-ms-long needs --slo-ttft-ms (the short class's SLO)")
    slo = SloSpec(args.slo_ttft_ms, args.slo_tpot_ms, args.slo_ttft_ms_long, args.long_threshold)
    cfg = BackendConfig(
        backend=args.backend,
        base_url=args.base_url,
        model=args.model or str(info.get("model_path") or "default"),
        stream=not args.disable_stream,
        request_timeout_s=args.request_timeout,
        slo={
            k: v for k, v in (("ttft_ms", slo.ttft_ms), ("tpot_ms", slo.tpot_ms)) if v is not None
        },
        slo_ttft_ms_long=args.slo_ttft_ms_long,
        long_threshold=args.long_threshold,
        extra_body=args.extra_request_body,
    )
    opts = RunOptions(
        backend=cfg,
        max_concurrency=args.max_concurrency,
        duration_s=args.duration,
        drain_timeout_s=args.drain_timeout,
        warmup_requests=args.warmup_requests,
        show_progress=not args.disable_tqdm,
        factory=factory,
    )
    rates = args.sweep_rates or [args.request_rate]
    records: list[dict[str, Any]] = []
    sweep: list[BenchMetrics] = []
    for i, rate in enumerate(rates):
        arrivals = schedule(heads, rate, args.burstiness, args.time_scale, args.seed)
        planned = [replace(s, arrival_s=a) for s, a in zip(sessions, arrivals)]
        # Warm the server once per invocation, not once per sweep point.
        run_opts = opts if i == 0 else replace(opts, warmup_requests=0)
        out = asyncio.run(run_sessions(planned, run_opts))
        shown_rate = rate
        if timed:
            span = arrivals[-1] - arrivals[0]
            shown_rate = (len(arrivals) - 1) / span if span > 0 else math.inf
        m = compute_metrics(out.results, out.duration_s, slo, args.long_threshold)
        run_info = _info(args, shown_rate, timed, tok_source)
        run_info.update(
            not_sent=out.not_sent, dispatch_error_ms=dispatch_error_summary(out.results)
        )
        print_summary(m, run_info)
        rec = jsonl_record(m, run_info, out.results if args.output_details else None)
        records.append(rec)
        sweep.append(m)
        if args.output_file:
            append_jsonl(args.output_file, rec)
        if args.plot:
            _plot_run(args, out, m, rate, timed, len(rates) > 1)
    if args.plot and len(rates) > 1:
        from sglang_pd.bench.plots import plot_sweep

        plot_sweep(rates, sweep, args.plot, _title(args))
    if len(rates) > 1:
        _print_sweep(rates, sweep)
    return records


def _title(args: argparse.Namespace) -> str:
    src = args.dataset_path if args.dataset_name == "trace" else args.dataset_name
    return f"{args.backend}, {src}"


def _plot_run(
    args: argparse.Namespace, out: RunOutput, m: BenchMetrics, rate: float, timed: bool, many: bool
) -> None:
    from sglang_pd.bench.plots import plot_run  # matplotlib only when asked for

    load = f"time scale {args.time_scale:g}x" if timed else f"{rate:g} req/s"
    prefix = f"rate{rate:g}_" if many else ""
    files = plot_run(out.results, m, args.plot, f"{_title(args)}, {load}", prefix)
    print("plots: " + ", ".join(str(f) for f in files), file=sys.stderr)


def _print_sweep(rates: list[float], runs: list[BenchMetrics]) -> None:
    print(
        f"{'rate (req/s)':>12} {'thpt (req/s)':>12} {'goodput (req/s)':>15} "
        f"{'SLO att (%)':>11} {'p99 TTFT (ms)':>13} {'p99 TPOT (ms)':>13}"
    )
    for r, m in zip(rates, runs):
        o = m.overall
        att = "n/a" if o.slo_attainment is None else f"{100 * o.slo_attainment:.1f}"
        good = "n/a" if o.goodput_rps is None else f"{o.goodput_rps:.2f}"
        print(
            f"{r:>12g} {o.request_throughput:>12.2f} {good:>15} {att:>11} "
            f"{o.ttft.p99:>13.1f} {o.tpot.p99:>13.2f}"
        )


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    _raise_open_file_limit()
    try:
        run_benchmark(args)
    except (BenchError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


def _raise_open_file_limit() -> None:
    # Each in-flight request holds a socket; with --request-rate inf and many prompts the usual
    # soft limit of 1024 descriptors would turn into connection errors. Best effort only.
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = hard if hard != resource.RLIM_INFINITY else 65536
        if soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ImportError, ValueError, OSError):
        pass
