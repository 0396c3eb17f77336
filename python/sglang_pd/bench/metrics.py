"""Benchmark metrics: pure functions of the per-request results.

Definitions (all latencies in ms in the outputs, seconds in :class:`RequestResult`):
- TTFT: send to first output-carrying chunk. E2E: send to end of reply.
- TPOT: (E2E - TTFT) / (output_len - 1), for successful requests with output_len > 1.
- ITL: every gap between consecutive output-carrying chunks, pooled over successful requests.
- Throughputs: successful requests (or their tokens) divided by the benchmark duration.
- Concurrency: sum of successful E2E latencies divided by the duration (average requests in flight).
- Attainment: requests meeting the SLO divided by *all* requests; failed requests are misses.
  TTFT is met when TTFT <= SLO; TPOT when TPOT <= SLO, or output_len <= 1 (no TPOT exists).
  Joint attainment needs every SLO that was given. With no SLO given these are None.
- Goodput: requests meeting every given SLO per second of benchmark duration.
- Per-request decode speed (tok/s): 1 / TPOT of each successful request with output_len > 1;
  ``decode_tps`` summarises it (mean, median, p90 ... in tokens/s).
- Percentiles interpolate linearly between order statistics (numpy's default); std is the
  population standard deviation; empty populations give 0.0 (as SGLang reports them).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from sglang_pd.bench.backends import RequestResult

CLASSES = ("short", "long")


@dataclass(frozen=True)
class SloSpec:
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    # long prompts' own TTFT SLO (``--slo-ttft-ms-long``): prompts of at least
    # ``long_threshold`` tokens are held to it (a long prefill alone can outlast a short SLO)
    ttft_ms_long: float | None = None
    long_threshold: int = 0

    @property
    def any(self) -> bool:
        return self.ttft_ms is not None or self.tpot_ms is not None

    def ttft_ms_for(self, prompt_len: int) -> float | None:
        """The TTFT SLO of a request with this many prompt tokens."""
        if self.ttft_ms_long is not None and prompt_len >= self.long_threshold:
            return self.ttft_ms_long
        return self.ttft_ms

    def body_for(self, prompt_len: int) -> dict[str, float]:
        """The per-request ``slo`` body field (only the set values)."""
        pairs = (("ttft_ms", self.ttft_ms_for(prompt_len)), ("tpot_ms", self.tpot_ms))
        return {k: v for k, v in pairs if v is not None}


@dataclass(frozen=True)
class LatencyStats:
    """Distribution summary in milliseconds."""

    count: int = 0
    mean: float = 0.0
    median: float = 0.0
    std: float = 0.0
    p90: float = 0.0
    p95: float = 0.0
    p99: float = 0.0
    max: float = 0.0


@dataclass
class Summary:
    """Metrics of one population of requests (all of them, or one length class)."""

    num_requests: int
    completed: int
    failed: int
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float  # req/s
    input_throughput: float  # tok/s
    output_throughput: float  # tok/s
    total_throughput: float  # tok/s
    concurrency: float
    ttft: LatencyStats
    tpot: LatencyStats
    itl: LatencyStats
    e2e: LatencyStats
    slo_met: int | None
    ttft_attainment: float | None
    tpot_attainment: float | None
    slo_attainment: float | None
    goodput_rps: float | None
    errors: dict[str, int] = field(default_factory=dict)
    # per-request decode speed, tokens/s: (output_len - 1) / (E2E - TTFT) = 1 / TPOT, for
    # successful requests with output_len > 1 (a distribution summary in tok/s, not ms)
    decode_tps: LatencyStats = field(default_factory=LatencyStats)


@dataclass
class BenchMetrics:
    duration_s: float
    slo: SloSpec
    long_threshold: int
    overall: Summary
    by_class: dict[str, Summary]


def percentile(values: Sequence[float], q: float) -> float:
    """q-th percentile (0..100) with linear interpolation; 0.0 for no values."""
    if not values:
        return 0.0
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def latency_stats(values_ms: Sequence[float]) -> LatencyStats:
    if not values_ms:
        return LatencyStats()
    n = len(values_ms)
    mean = sum(values_ms) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values_ms) / n)
    return LatencyStats(
        count=n,
        mean=mean,
        median=percentile(values_ms, 50),
        std=std,
        p90=percentile(values_ms, 90),
        p95=percentile(values_ms, 95),
        p99=percentile(values_ms, 99),
        max=max(values_ms),
    )


def length_class(r: RequestResult, long_threshold: int) -> str:
    """ "long" when the prompt has at least ``long_threshold`` tokens."""
    return "long" if r.prompt_len >= long_threshold else "short"


def slo_checks(r: RequestResult, slo: SloSpec) -> tuple[bool, bool]:
    """(TTFT met, TPOT met) for one request; a failed request meets neither."""
    if not r.success:
        return False, False
    ttft_ms = slo.ttft_ms_for(r.prompt_len)
    ttft_ok = ttft_ms is None or r.ttft_s * 1000.0 <= ttft_ms
    tpot = r.tpot_s
    tpot_ok = slo.tpot_ms is None or tpot is None or tpot * 1000.0 <= slo.tpot_ms
    return ttft_ok, tpot_ok


def summarize(results: Sequence[RequestResult], duration_s: float, slo: SloSpec) -> Summary:
    """All metrics of one population over a benchmark of ``duration_s`` seconds."""
    ok = [r for r in results if r.success]
    n, done = len(results), len(ok)

    def rate(x: float) -> float:
        return x / duration_s if duration_s > 0 else 0.0

    tin = sum(r.prompt_len for r in ok)
    tout = sum(r.output_len for r in ok)
    tpots = [r.tpot_s * 1000.0 for r in ok if r.tpot_s is not None]
    itls = [g * 1000.0 for r in ok for g in r.itl_s]
    checks = [slo_checks(r, slo) for r in results]
    ttft_met = sum(1 for a, _ in checks if a)
    tpot_met = sum(1 for _, b in checks if b)
    both = sum(1 for a, b in checks if a and b)

    def frac(k: int, given: bool) -> float | None:
        return k / n if given and n else None

    return Summary(
        num_requests=n,
        completed=done,
        failed=n - done,
        total_input_tokens=tin,
        total_output_tokens=tout,
        request_throughput=rate(done),
        input_throughput=rate(tin),
        output_throughput=rate(tout),
        total_throughput=rate(tin + tout),
        concurrency=rate(sum(r.e2e_s for r in ok)),
        ttft=latency_stats([r.ttft_s * 1000.0 for r in ok]),
        tpot=latency_stats(tpots),
        itl=latency_stats(itls),
        e2e=latency_stats([r.e2e_s * 1000.0 for r in ok]),
        slo_met=both if slo.any else None,
        ttft_attainment=frac(ttft_met, slo.ttft_ms is not None),
        tpot_attainment=frac(tpot_met, slo.tpot_ms is not None),
        slo_attainment=frac(both, slo.any),
        goodput_rps=rate(both) if slo.any else None,
        errors=dict(sorted(Counter(r.error_kind for r in results if not r.success).items())),
        decode_tps=latency_stats([1.0 / r.tpot_s for r in ok if r.tpot_s]),
    )


def compute_metrics(
    results: Sequence[RequestResult], duration_s: float, slo: SloSpec, long_threshold: int
) -> BenchMetrics:
    """Overall metrics plus the same split by prompt-length class."""
    by_class = {
        c: summarize([r for r in results if length_class(r, long_threshold) == c], duration_s, slo)
        for c in CLASSES
    }
    return BenchMetrics(
        duration_s, slo, long_threshold, summarize(results, duration_s, slo), by_class
    )


def dispatch_errors_ms(results: Sequence[RequestResult]) -> list[float]:
    """Send time minus planned time (ms) for requests that had a planned time."""
    return [(r.start_s - r.scheduled_s) * 1000.0 for r in results if r.scheduled_s is not None]


def dispatch_error_summary(results: Sequence[RequestResult]) -> dict[str, float]:
    """Mean / p50 / p99 / max of |send - planned| in ms (empty dict if nothing was planned)."""
    errs = [abs(e) for e in dispatch_errors_ms(results)]
    if not errs:
        return {}
    return {
        "mean_ms": sum(errs) / len(errs),
        "p50_ms": percentile(errs, 50),
        "p99_ms": percentile(errs, 99),
        "max_ms": max(errs),
        "count": float(len(errs)),
    }


def timeseries(
    results: Sequence[RequestResult], bin_s: float, horizon_s: float
) -> dict[str, list[float]]:
    """Completed requests/s and output tokens/s in bins of ``bin_s`` over [0, horizon_s].

    Output tokens are spread evenly over a request's output-carrying chunks, whose times are
    rebuilt as send + TTFT + cumulative ITL (chunks may hold several tokens).
    """
    nbins = max(1, math.ceil(horizon_s / bin_s))
    req = [0.0] * nbins
    tok = [0.0] * nbins

    def slot(t: float) -> int:
        return min(max(int(t / bin_s), 0), nbins - 1)

    for r in results:
        if not r.success:
            continue
        req[slot(r.end_s)] += 1.0
        times = [r.start_s + r.ttft_s]
        for g in r.itl_s:
            times.append(times[-1] + g)
        share = r.output_len / len(times)
        for t in times:
            tok[slot(t)] += share
    return {
        "t_s": [i * bin_s for i in range(nbins)],
        "req_per_s": [x / bin_s for x in req],
        "out_tok_per_s": [x / bin_s for x in tok],
    }
