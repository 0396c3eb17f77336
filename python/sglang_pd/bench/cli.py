"""Command-line flags. Names follow ``sglang.bench_serving`` where the two overlap."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math

from sglang_pd.bench.backends import BACKENDS
from sglang_pd.bench.datasets import DATASET_NAMES


def _rates(text: str) -> list[float]:
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--sweep-rates wants numbers like 1,2,4; got {text!r}"
        ) from None
    if not rates or any(r <= 0 for r in rates):
        raise argparse.ArgumentTypeError("--sweep-rates needs one or more rates > 0 (req/s)")
    return rates


def _json_obj(text: str) -> dict:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"--extra-request-body is not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise argparse.ArgumentTypeError("--extra-request-body must be a JSON object")
    return obj


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m sglang_pd.bench_serving",
        description="Online serving load test for SGLang-compatible servers: synthetic, "
        "length-mix and trace workloads, SLO attainment, goodput and plots.",
    )
    g = p.add_argument_group("target")
    g.add_argument(
        "--backend",
        choices=BACKENDS,
        default="sglang",
        help="sglang: POST /generate with input_ids; sglang-oai: /v1/completions; "
        "sglang-oai-chat: /v1/chat/completions",
    )
    g.add_argument(
        "--base-url", default=None, help="e.g. http://127.0.0.1:30000 (overrides host/port)"
    )
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=30000)
    g.add_argument(
        "--model",
        default=None,
        help="model name for OpenAI bodies (default: the server's model_path)",
    )
    g.add_argument(
        "--tokenizer",
        default=None,
        help="model dir with tokenizer.json (default: the server's model_path from "
        "GET /get_model_info, if readable here)",
    )
    g.add_argument(
        "--disable-stream", action="store_true", help="non-streaming requests (TTFT = E2E)"
    )
    g.add_argument(
        "--extra-request-body",
        type=_json_obj,
        default={},
        help='JSON object deep-merged into every body, e.g. \'{"sampling_params": {"top_k": 1}}\'',
    )
    g.add_argument("--request-timeout", type=float, default=600.0, help="per-request limit (s)")

    g = p.add_argument_group("workload")
    g.add_argument(
        "--dataset-name",
        choices=DATASET_NAMES,
        default="random",
        help="random | mix (--length-mix) | sharegpt-lengths (alias sharegpt) | "
        "trace (--dataset-path) | azure-conv | azure-code | mooncake",
    )
    g.add_argument("--dataset-path", default=None, help="trace or length CSV file")
    g.add_argument(
        "--trace",
        default=None,
        help="shorthand for --dataset-name trace --dataset-path TRACE (file or short name)",
    )
    g.add_argument("--num-prompts", type=int, default=1000, help="requests (turns) to send")
    g.add_argument("--random-input-len", type=int, default=1024, help="tokens (random dataset)")
    g.add_argument("--random-output-len", type=int, default=1024, help="tokens (random dataset)")
    g.add_argument(
        "--random-range-ratio",
        type=float,
        default=0.0,
        help="lengths are uniform in [len*ratio, len]; 1.0 = exact lengths",
    )
    g.add_argument(
        "--length-mix",
        default=None,
        help="IN:OUT:WEIGHT,... for --dataset-name mix, e.g. 64:16:0.8,2048:64:0.2",
    )
    g.add_argument(
        "--max-input-len", type=int, default=None, help="clamp prompts to this many tokens"
    )
    g.add_argument(
        "--max-output-len", type=int, default=None, help="clamp outputs to this many tokens"
    )
    g.add_argument(
        "--multi-turn",
        type=int,
        default=1,
        help="turns per session; each turn re-sends the history plus a new message",
    )
    g.add_argument("--seed", type=int, default=1)

    g = p.add_argument_group("arrivals")
    g.add_argument(
        "--request-rate",
        type=float,
        default=float("inf"),
        help="req/s, Poisson (or Gamma with --burstiness); inf sends all at once",
    )
    g.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help="Gamma shape of inter-arrival gaps: 1 = Poisson, <1 burstier, >1 steadier",
    )
    g.add_argument("--max-concurrency", type=int, default=None, help="cap on requests in flight")
    g.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="multiply trace arrival times: <1 replays faster, >1 slower",
    )
    g.add_argument(
        "--ignore-trace-times",
        action="store_true",
        help="use the trace's lengths with --request-rate arrivals instead of its times",
    )
    g.add_argument(
        "--duration",
        type=float,
        default=None,
        help="stop sending after this many seconds (in-flight requests drain)",
    )
    g.add_argument(
        "--drain-timeout",
        type=float,
        default=60.0,
        help="after --duration, seconds to wait for in-flight requests before cancelling",
    )
    g.add_argument(
        "--warmup-requests", type=int, default=1, help="sequential requests before timing"
    )
    g.add_argument(
        "--sweep-rates",
        type=_rates,
        default=None,
        help="run once per rate (req/s), e.g. 1,2,4,8; one JSONL line each",
    )

    g = p.add_argument_group("SLOs and output")
    g.add_argument(
        "--slo-ttft-ms", type=float, default=None, help="TTFT SLO (ms), also sent per request"
    )
    g.add_argument(
        "--slo-tpot-ms", type=float, default=None, help="TPOT SLO (ms), also sent per request"
    )
    g.add_argument(
        "--slo-ttft-ms-long",
        type=float,
        default=None,
        help="TTFT SLO (ms) of prompts of at least --long-threshold tokens (sent per request); "
        "--slo-ttft-ms is then the short class's",
    )
    g.add_argument(
        "--long-threshold",
        type=int,
        default=2048,
        help="prompt tokens at/above which a request is class 'long'",
    )
    g.add_argument("--output-file", default=None, help="JSONL file; one line appended per run")
    g.add_argument(
        "--output-details", action="store_true", help="add per-request lists to the JSONL"
    )
    g.add_argument("--plot", default=None, metavar="DIR", help="write PNG plots into DIR")
    g.add_argument("--disable-tqdm", action="store_true", help="no progress bar")
    return p


def validate(args: argparse.Namespace) -> None:
    """Reject contradictory or out-of-range flags with a message that says what is allowed."""
    if args.trace:
        args.dataset_name, args.dataset_path = "trace", args.trace
    checks = [
        (args.num_prompts >= 1, "--num-prompts must be >= 1"),
        (
            args.request_rate > 0 or math.isinf(args.request_rate),
            "--request-rate must be > 0 or inf",
        ),
        (args.burstiness > 0, "--burstiness must be > 0"),
        (args.time_scale > 0, "--time-scale must be > 0"),
        (
            args.max_concurrency is None or args.max_concurrency >= 1,
            "--max-concurrency must be >= 1",
        ),
        (args.duration is None or args.duration > 0, "--duration must be > 0 (s)"),
        (args.request_timeout > 0, "--request-timeout must be > 0 (s)"),
        (args.multi_turn >= 1, "--multi-turn must be >= 1"),
        (0.0 <= args.random_range_ratio <= 1.0, "--random-range-ratio must be in [0, 1]"),
        (args.warmup_requests >= 0, "--warmup-requests must be >= 0"),
        # serving installs no plotting libraries: fail before the run, not after it
        (
            not args.plot or importlib.util.find_spec("matplotlib") is not None,
            "--plot needs matplotlib: pip install 'sglang-pd[bench]'",
        ),
    ]
    for ok, msg in checks:
        if not ok:
            raise ValueError(msg)
