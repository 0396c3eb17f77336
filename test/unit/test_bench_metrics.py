"""Metric functions of the serving benchmark, checked against hand computation."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

_PY = Path(__file__).resolve().parents[2] / "python"
if str(_PY) not in sys.path:  # when the package is not pip-installed
    sys.path.insert(0, str(_PY))

from sglang_pd.bench.backends import RequestResult  # noqa: E402
from sglang_pd.bench.metrics import (  # noqa: E402
    SloSpec,
    compute_metrics,
    dispatch_error_summary,
    latency_stats,
    percentile,
    slo_checks,
    summarize,
    timeseries,
)


def ok(i: int, plen: int, out: int, ttft: float, itl: list[float], e2e: float, start: float = 0.0):
    return RequestResult(
        i,
        plen,
        out,
        output_len=out,
        success=True,
        ttft_s=ttft,
        itl_s=itl,
        e2e_s=e2e,
        start_s=start,
        end_s=start + e2e,
    )


def failed(i: int, plen: int, kind: str):
    return RequestResult(i, plen, 8, success=False, error_kind=kind, error="x")


@pytest.fixture
def results() -> list[RequestResult]:
    return [
        ok(0, 10, 5, 0.100, [0.02, 0.03, 0.02, 0.03], 0.200),  # TPOT 25 ms
        ok(1, 3000, 3, 0.500, [0.05, 0.05], 0.600),  # long; TPOT 50 ms
        ok(2, 20, 1, 0.050, [], 0.050),  # one token: no TPOT
        failed(3, 30, "http_400"),
        failed(4, 4000, "timeout"),  # long
    ]


SLO = SloSpec(ttft_ms=200.0, tpot_ms=30.0)


def test_totals_and_throughputs(results):
    s = summarize(results, 2.0, SLO)
    assert (s.num_requests, s.completed, s.failed) == (5, 3, 2)
    assert s.total_input_tokens == 10 + 3000 + 20  # failed requests' prompts are not counted
    assert s.total_output_tokens == 5 + 3 + 1
    assert s.request_throughput == pytest.approx(3 / 2.0)
    assert s.input_throughput == pytest.approx(3030 / 2.0)
    assert s.output_throughput == pytest.approx(9 / 2.0)
    assert s.total_throughput == pytest.approx(3039 / 2.0)
    assert s.concurrency == pytest.approx((0.2 + 0.6 + 0.05) / 2.0)
    assert s.errors == {"http_400": 1, "timeout": 1}


def test_latency_distributions(results):
    s = summarize(results, 2.0, SLO)
    # TTFT over successes: 100, 500, 50 ms.
    assert s.ttft.count == 3
    assert s.ttft.mean == pytest.approx(650 / 3)
    assert s.ttft.median == pytest.approx(100)
    assert s.ttft.std == pytest.approx(
        math.sqrt(((100 - 650 / 3) ** 2 + (500 - 650 / 3) ** 2 + (50 - 650 / 3) ** 2) / 3)
    )
    assert s.ttft.p90 == pytest.approx(100 + 0.8 * 400)  # position 1.8 in [50, 100, 500]
    assert s.ttft.p99 == pytest.approx(100 + 0.98 * 400)
    assert s.ttft.max == pytest.approx(500)
    # TPOT = (e2e - ttft) / (out - 1): 25 ms and 50 ms; the 1-token request has none.
    assert s.tpot.count == 2
    assert s.tpot.mean == pytest.approx(37.5)
    assert s.tpot.p99 == pytest.approx(25 + 0.99 * 25)
    # ITL pools every gap: 20, 30, 20, 30, 50, 50 ms.
    assert s.itl.count == 6
    assert s.itl.mean == pytest.approx(200 / 6)
    assert s.itl.median == pytest.approx(30)
    assert s.itl.p95 == pytest.approx(50)
    assert s.e2e.mean == pytest.approx(850 / 3)
    assert s.e2e.median == pytest.approx(200)


def test_attainment_counts_failures_as_misses(results):
    s = summarize(results, 2.0, SLO)
    # TTFT met: r0 (100 ms), r2 (50 ms); missed: r1 (500 ms), both failures.
    assert s.ttft_attainment == pytest.approx(2 / 5)
    # TPOT met: r0 (25 ms), r2 (single token counts as met); missed: r1 (50 ms), failures.
    assert s.tpot_attainment == pytest.approx(2 / 5)
    assert s.slo_met == 2
    assert s.slo_attainment == pytest.approx(2 / 5)
    assert s.goodput_rps == pytest.approx(2 / 2.0)


def test_by_class_split(results):
    m = compute_metrics(results, 2.0, SLO, long_threshold=2048)
    short, long_ = m.by_class["short"], m.by_class["long"]
    assert (short.num_requests, short.completed) == (3, 2)
    assert (long_.num_requests, long_.completed) == (2, 1)
    assert short.slo_attainment == pytest.approx(2 / 3)
    assert short.goodput_rps == pytest.approx(1.0)
    assert long_.ttft_attainment == 0.0 and long_.slo_attainment == 0.0
    assert long_.goodput_rps == 0.0
    assert short.errors == {"http_400": 1} and long_.errors == {"timeout": 1}
    assert long_.ttft.mean == pytest.approx(500)
    assert m.overall.completed == 3
    # The threshold is inclusive: a prompt of exactly 3000 tokens is long at 3000.
    assert compute_metrics(results, 2.0, SLO, 3000).by_class["long"].num_requests == 2
    assert compute_metrics(results, 2.0, SLO, 3001).by_class["long"].num_requests == 1


def test_slo_boundaries_and_absent_slos():
    r = ok(0, 5, 3, 0.2, [0.03, 0.03], 0.26)  # TTFT 200 ms, TPOT 30 ms exactly
    assert slo_checks(r, SloSpec(200.0, 30.0)) == (True, True)
    assert slo_checks(r, SloSpec(199.9, 29.9)) == (False, False)
    s = summarize([r], 1.0, SloSpec())
    assert s.ttft_attainment is None and s.slo_attainment is None and s.goodput_rps is None
    only_ttft = summarize([r, failed(1, 5, "connection")], 1.0, SloSpec(ttft_ms=250.0))
    assert only_ttft.tpot_attainment is None
    assert only_ttft.slo_attainment == pytest.approx(0.5)  # joint = the SLOs that were given


def test_long_prompts_have_their_own_ttft_slo(results):
    """--slo-ttft-ms-long: prompts at/above the threshold are held to the long SLO only."""
    slo = SloSpec(ttft_ms=200.0, tpot_ms=None, ttft_ms_long=600.0, long_threshold=2048)
    assert slo_checks(results[1], slo) == (True, True)  # long, 500 ms <= 600 ms
    assert slo_checks(results[1], SloSpec(ttft_ms=200.0)) == (False, True)
    slow_short = ok(5, 100, 2, 0.3, [0.01], 0.31)  # short, 300 ms: the short SLO applies
    assert slo_checks(slow_short, slo) == (False, True)
    m = compute_metrics(results + [slow_short], 2.0, slo, long_threshold=2048)
    assert m.by_class["long"].ttft_attainment == pytest.approx(1 / 2)  # r1 met, r4 failed
    assert m.by_class["short"].ttft_attainment == pytest.approx(2 / 4)
    assert slo.body_for(100) == {"ttft_ms": 200.0} and slo.body_for(4000) == {"ttft_ms": 600.0}


def test_empty_and_zero_duration():
    s = summarize([], 0.0, SLO)
    assert s.completed == 0 and s.request_throughput == 0.0 and s.ttft.mean == 0.0
    assert s.slo_attainment is None  # no requests: attainment undefined


def test_percentile_matches_numpy():
    rng = np.random.default_rng(0)
    xs = rng.random(37).tolist()
    for q in (0, 10, 50, 90, 95, 99, 100):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
    st = latency_stats(xs)
    assert st.std == pytest.approx(float(np.std(xs)))
    assert percentile([], 50) == 0.0


def test_dispatch_errors():
    a = ok(0, 1, 1, 0.1, [], 0.1, start=1.0012)
    a.scheduled_s = 1.0
    b = ok(1, 1, 1, 0.1, [], 0.1, start=2.0)
    b.scheduled_s = 2.003
    c = ok(2, 1, 1, 0.1, [], 0.1, start=5.0)  # later turn: no planned time
    d = dispatch_error_summary([a, b, c])
    assert d["count"] == 2
    assert d["max_ms"] == pytest.approx(3.0)
    assert d["mean_ms"] == pytest.approx((1.2 + 3.0) / 2)
    assert dispatch_error_summary([c]) == {}


def test_timeseries_bins():
    # 4 tokens over 2 chunks at 0.5 s and 1.5 s (2 each); completes at 1.6 s.
    r = ok(0, 1, 4, 0.5, [1.0], 1.6)
    failed_r = failed(1, 1, "http_500")
    ts = timeseries([r, failed_r], bin_s=1.0, horizon_s=2.0)
    assert ts["t_s"] == [0.0, 1.0]
    assert ts["out_tok_per_s"] == [2.0, 2.0]
    assert ts["req_per_s"] == [0.0, 1.0]


def test_per_request_decode_speed(results):
    """1 / TPOT per request (tok/s): 40 tok/s and 20 tok/s; one-token and failed ones have none."""
    s = summarize(results, 2.0, SLO)
    assert s.decode_tps.count == 2
    assert s.decode_tps.median == pytest.approx(30.0)
    assert s.decode_tps.max == pytest.approx(40.0)
    from sglang_pd.bench.report import summary_fields
    f = summary_fields(s)
    assert f["median_decode_tps"] == pytest.approx(30.0) and f["p90_decode_tps"] == pytest.approx(38.0)
