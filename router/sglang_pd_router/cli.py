"""``sglang-pd-router`` / ``python -m sglang_pd_router``: flags follow sglang-router's
(``--pd-disaggregation --prefill URL [BOOTSTRAP_PORT] --decode URL --prefill-policy ...``), plus
ours for length awareness, the pool controller and per-class SLO defaults (docs/router.md)."""

from __future__ import annotations

import argparse
import logging

from .config import DEFAULT_BOOTSTRAP_PORT, PrefillSpec, RouterConfig
from .controller import ControllerConfig
from .policies import ROUTING_POLICIES
from .policies.conditional import ConditionalConfig
from .policies.queue_order import QUEUE_ORDERS
from .request_class import SHORT_PREFILL_THRESHOLD
from .workers import validate_url


def _url(value: str) -> str:
    try:
        return validate_url(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sglang-pd-router", description=__doc__.split("\n\n")[0])
    p.add_argument("--pd-disaggregation", action="store_true",
                   help="PD mode (the only mode; accepted for sglang-router compatibility)")
    p.add_argument("--prefill", nargs="+", action="append", default=[],
                   metavar=("URL", "BOOTSTRAP_PORT"),
                   help=f"a prefill worker and its bootstrap port (default "
                        f"{DEFAULT_BOOTSTRAP_PORT}; 'none' for none); repeatable")
    p.add_argument("--decode", action="append", default=[], type=_url, metavar="URL",
                   help="a decode worker; repeatable")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    policies = sorted(ROUTING_POLICIES)
    p.add_argument("--policy", choices=policies, default=None,
                   help="both pools' routing policy (the specific flags below win)")
    p.add_argument("--prefill-policy", choices=policies, default=None,
                   help="routing policy for prefill workers (default length_aware)")
    p.add_argument("--decode-policy", choices=policies, default=None,
                   help="routing policy for decode workers (default power_of_two)")
    p.add_argument("--seed", type=int, default=None, help="seed of the random policies")
    p.add_argument("--api-key", default=None,
                   help="clients must send it (Bearer) on every route but /health; also sent "
                        "to workers unless --worker-api-key is given")
    p.add_argument("--admin-api-key", default=None,
                   help="the key for /workers (default: --api-key); with neither, the admin "
                        "API is off")
    p.add_argument("--metrics-api-key", default=None,
                   help="a scrape-only key for /metrics (which --api-key and --admin-api-key "
                        "open too); with no key at all /metrics is open")
    p.add_argument("--worker-api-key", default=None,
                   help="the key sent to workers when it differs from --api-key")
    p.add_argument("--tokenizer-path", default=None,
                   help="tokenizer.json (or its folder) for exact prompt lengths; "
                        "without it lengths are estimated from the text (4 chars a token)")
    p.add_argument("--short-prefill-threshold", type=int, default=None,
                   help="prompts of at most this many tokens are short (default: the workers' "
                        f"--short-prefill-threshold from /get_server_info, else {SHORT_PREFILL_THRESHOLD})")
    p.add_argument("--decode-reuse-slack", type=int, default=2,
                   help="--decode-policy cache_aware: a follow-up goes to the decode holding its "
                        "history while that decode holds at most this many requests more than "
                        "the least loaded one")
    p.add_argument("--pool-controller", choices=("on", "off"), default="on",
                   help="PLA-Serve's instance-pressure controller moving prefill workers "
                        "between the short and long pools")
    c = ControllerConfig()
    p.add_argument("--controller-period-s", type=float, default=c.period_s)
    p.add_argument("--controller-cooldown-s", type=float, default=c.cooldown_s)
    p.add_argument("--controller-tau", type=float, default=c.tau, help="relative hysteresis")
    p.add_argument("--controller-delta", type=float, default=c.delta,
                   help="absolute hysteresis (pool pressures are in [0, 1])")
    p.add_argument("--controller-min-per-pool", type=int, default=c.min_per_pool)
    p.add_argument("--controller-weights", type=float, nargs=3, default=None,
                   metavar=("ALPHA", "BETA", "GAMMA"),
                   help=f"queue, SLO-deviation and utilisation weights (default {c.alpha} "
                        f"{c.beta} {c.gamma}; a negative GAMMA is the paper's sign)")
    p.add_argument("--controller-queue-ref-s", type=float, nargs=2, default=None,
                   metavar=("SHORT", "LONG"),
                   help="predicted queue time that counts as full pressure, per pool")
    cd = ConditionalConfig()
    p.add_argument("--conditional-disagg", choices=("on", "off"), default="off",
                   help="prefill a short prompt on its decode worker (no KV transfer) when the "
                        "prefill it would go to is loaded (docs/router.md)")
    p.add_argument("--conditional-disagg-max-tokens", type=int, default=None,
                   help="longest prompt (new tokens) prefilled on decode (default: the short "
                        "threshold)")
    p.add_argument("--conditional-disagg-min-queue-tokens", type=int,
                   default=cd.min_prefill_queue_tokens,
                   help="prompt tokens queued on the picked prefill that count as loaded")
    p.add_argument("--conditional-disagg-max-decode-queue-tokens", type=int,
                   default=cd.max_decode_queue_tokens,
                   help="local prefill tokens a decode worker may have waiting, at most")
    p.add_argument("--drain-timeout-s", type=float, default=60.0,
                   help="longest wait for a moved worker to finish its work before switching")
    p.add_argument("--slo-ttft-ms", type=float, nargs="+", default=None,
                   metavar="MS", help="TTFT SLO sent when the client gave none: one value for "
                   "both classes, or SHORT LONG")
    p.add_argument("--slo-tpot-ms", type=float, nargs="+", default=None, metavar="MS",
                   help="TPOT SLO default, as --slo-ttft-ms")
    p.add_argument("--request-timeout-secs", type=float, default=600.0)
    p.add_argument("--max-concurrent-requests", type=int, default=512)
    p.add_argument("--queue-size", type=int, default=1024,
                   help="requests waiting for a slot; more get 503")
    p.add_argument("--queue-timeout-secs", type=float, default=60.0)
    p.add_argument("--queue-order", choices=QUEUE_ORDERS, default="fifo",
                   help="which waiting request a freed slot goes to: fifo, or edf (earliest "
                        "TTFT deadline, as Dynamo's router queue; set --max-concurrent-requests "
                        "below the load for a queue to form)")
    p.add_argument("--retry-max-retries", type=int, default=3)
    p.add_argument("--retry-initial-backoff-ms", type=float, default=50.0)
    p.add_argument("--retry-max-backoff-ms", type=float, default=2000.0)
    p.add_argument("--disable-retries", action="store_true")
    p.add_argument("--cb-failure-threshold", type=int, default=5)
    p.add_argument("--cb-timeout-duration-secs", type=float, default=10.0)
    p.add_argument("--disable-circuit-breaker", action="store_true")
    p.add_argument("--health-check-interval-secs", type=float, default=5.0)
    p.add_argument("--health-check-timeout-secs", type=float, default=5.0)
    p.add_argument("--health-failure-threshold", type=int, default=2)
    p.add_argument("--health-success-threshold", type=int, default=1)
    p.add_argument("--load-poll-interval-secs", type=float, default=1.0,
                   help="how often each worker's /get_load is read")
    p.add_argument("--client-idle-timeout-secs", type=float, default=15.0,
                   help="a connection must send a request head within this (and is closed "
                        "after this long idle between requests)")
    p.add_argument("--body-timeout-secs", type=float, default=30.0,
                   help="a request body must arrive within this")
    p.add_argument("--max-connections", type=int, default=4096,
                   help="open client connections beyond this are closed at once")
    p.add_argument("--kv-deadline-secs", type=float, default=30.0,
                   help="a prefill not answered by then gets both workers probed: a silent "
                        "one fails the try (retried elsewhere)")
    p.add_argument("--first-byte-timeout-secs", type=float, default=10.0,
                   help="after the prefill answered, decode's first byte is awaited this long "
                        "before decode is probed (a silent decode fails the try)")
    p.add_argument("--max-migrations", type=int, default=2,
                   help="times a streamed /generate (input_ids prompt) whose decode broke off "
                        "mid-stream is resumed on another pair (docs/router.md)")
    p.add_argument("--disable-migration", action="store_true",
                   help="a decode that breaks off mid-stream ends the stream with an error")
    p.add_argument("--log-level", default="info",
                   choices=("debug", "info", "warning", "warn", "error"))
    return p


def _prefill_spec(values: list[str]) -> PrefillSpec:
    if not 1 <= len(values) <= 2:
        raise ValueError(f"--prefill takes URL [BOOTSTRAP_PORT], got {values}")
    try:
        url = _url(values[0])
    except argparse.ArgumentTypeError as e:
        raise ValueError(str(e)) from None
    if len(values) == 1:
        return PrefillSpec(url)
    if values[1].lower() == "none":
        return PrefillSpec(url, None)
    if not values[1].isdigit() or not 0 < int(values[1]) < 65536:
        raise ValueError(f"--prefill {url}: bootstrap port must be 1..65535 or 'none', "
                         f"got {values[1]!r}")
    return PrefillSpec(url, int(values[1]))


def _per_class(values: list[float] | None, flag: str) -> dict[str, float]:
    if not values:
        return {}
    if len(values) > 2:
        raise ValueError(f"{flag} takes one value or SHORT LONG, got {values}")
    short, long_ = values[0], values[-1]
    return {"short": short, "long": long_}


def config_from_args(args: argparse.Namespace) -> RouterConfig:
    """Check and convert parsed flags; bad values raise ValueError with the flag's name."""
    if not args.prefill or not args.decode:
        raise ValueError("give at least one --prefill URL [BOOTSTRAP_PORT] and one --decode URL")
    base = ControllerConfig()
    alpha, beta, gamma = args.controller_weights or (base.alpha, base.beta, base.gamma)
    q_short, q_long = args.controller_queue_ref_s or (base.queue_ref_s_short,
                                                       base.queue_ref_s_long)
    controller = ControllerConfig(
        period_s=args.controller_period_s, cooldown_s=args.controller_cooldown_s,
        tau=args.controller_tau, delta=args.controller_delta,
        min_per_pool=args.controller_min_per_pool, alpha=alpha, beta=beta, gamma=gamma,
        queue_ref_s_short=q_short, queue_ref_s_long=q_long)
    return RouterConfig(
        prefills=[_prefill_spec(v) for v in args.prefill],
        decodes=list(args.decode),
        host=args.host, port=args.port,
        prefill_policy=args.prefill_policy or args.policy or "length_aware",
        decode_policy=args.decode_policy or args.policy or "power_of_two",
        seed=args.seed, api_key=args.api_key, worker_api_key=args.worker_api_key,
        admin_api_key=args.admin_api_key, metrics_api_key=args.metrics_api_key,
        client_idle_timeout_s=args.client_idle_timeout_secs,
        body_timeout_s=args.body_timeout_secs, max_connections=args.max_connections,
        kv_deadline_s=args.kv_deadline_secs, first_byte_timeout_s=args.first_byte_timeout_secs,
        max_migrations=0 if args.disable_migration else args.max_migrations,
        tokenizer_path=args.tokenizer_path,
        short_prefill_threshold=args.short_prefill_threshold,
        decode_reuse_slack=args.decode_reuse_slack,
        pool_controller=args.pool_controller == "on", controller=controller,
        drain_timeout_s=args.drain_timeout_s,
        conditional=ConditionalConfig(
            args.conditional_disagg_max_tokens, args.conditional_disagg_min_queue_tokens,
            args.conditional_disagg_max_decode_queue_tokens)
        if args.conditional_disagg == "on" else None,
        slo_ttft_ms=_per_class(args.slo_ttft_ms, "--slo-ttft-ms"),
        slo_tpot_ms=_per_class(args.slo_tpot_ms, "--slo-tpot-ms"),
        request_timeout_s=args.request_timeout_secs,
        max_concurrent_requests=args.max_concurrent_requests,
        queue_size=args.queue_size, queue_timeout_s=args.queue_timeout_secs,
        queue_order=args.queue_order,
        max_retries=0 if args.disable_retries else args.retry_max_retries,
        retry_initial_backoff_ms=args.retry_initial_backoff_ms,
        retry_max_backoff_ms=args.retry_max_backoff_ms,
        cb_failure_threshold=(10**9 if args.disable_circuit_breaker
                              else args.cb_failure_threshold),
        cb_timeout_s=args.cb_timeout_duration_secs,
        health_check_interval_s=args.health_check_interval_secs,
        health_check_timeout_s=args.health_check_timeout_secs,
        health_failure_threshold=args.health_failure_threshold,
        health_success_threshold=args.health_success_threshold,
        load_poll_interval_s=args.load_poll_interval_secs,
        log_level="warning" if args.log_level == "warn" else args.log_level,
    )


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cfg = config_from_args(args)
    except ValueError as e:
        parser.error(str(e))
    logging.basicConfig(level=cfg.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from .server import run_router  # aiohttp is imported only when serving

    run_router(cfg)
