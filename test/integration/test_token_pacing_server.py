"""--token-pacing end to end: the real server in front of the fake engine (one token per 5 ms).

With pacing, a stream whose tokens come far ahead of its TPOT SLO reaches the client at the SLO
pace; without it (the default) they come as made. The content is the same either way.
10 tokens at a 60 ms SLO take at least ~540 ms paced and ~50 ms unpaced. The suite checks what
load cannot break (lower bounds: pacing only holds tokens back); the gap and span bars are
`slow` tests, out of CI.
"""

from __future__ import annotations

import json
import os
import sys
import time

import httpx
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from fake_engine import write_tiny_model_dir  # noqa: E402
from test_http_fake_engine import start_server, stop_server  # noqa: E402

pytestmark = pytest.mark.timeout(120)
TPOT_MS, N = 60.0, 10


def _stream(url: str, body: dict) -> tuple[list[float], dict]:
    """Arrival times of the SSE chunks that carried new tokens, and the final chunk."""
    times, last, seen = [], {}, 0
    with httpx.stream("POST", f"{url}/generate", json=body, timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if len(chunk["output_ids"]) > seen:
                times.append(time.perf_counter())
                seen = len(chunk["output_ids"])
            last = chunk
    return times, last


def _run(tmp_path, pacing: bool, tpot_ms: float = TPOT_MS) -> tuple[list[float], list[float], list]:
    """Token arrival times of a stream at the server's SLO and of one at a 20 ms SLO; checks
    that streamed and plain answers carry the same tokens."""
    model = write_tiny_model_dir(str(tmp_path / "model"))
    flags = ["--slo-tpot-ms", str(tpot_ms)] + (["--token-pacing"] if pacing else [])
    srv = start_server(model, str(tmp_path / "server.log"), *flags)
    try:
        body = {"input_ids": [10, 20], "sampling_params": {"max_new_tokens": N}, "stream": True}
        times, final = _stream(srv.url, body)
        # a request's own SLO (body) sets its pace: 20 ms here
        fast, final_fast = _stream(srv.url, {**body, "slo": {"tpot_ms": 20}})
        # non-streaming requests are never held
        plain = httpx.post(f"{srv.url}/generate", json={**body, "stream": False}, timeout=30).json()
    finally:
        stop_server(srv)
    assert final["output_ids"] == final_fast["output_ids"] == plain["output_ids"]
    assert len(final["output_ids"]) == N
    return times, fast, final["output_ids"]


def test_paced_streams_release_one_token_at_a_time_never_ahead_of_pace(tmp_path) -> None:
    times, fast, _ = _run(tmp_path, pacing=True)
    assert len(times) == N and len(fast) == N  # one token per chunk: released one by one
    # pacing can only hold tokens back, so these lower bounds hold however loaded the machine
    assert times[-1] - times[0] >= 0.9 * (N - 1) * TPOT_MS / 1e3
    assert fast[-1] - fast[0] >= 0.9 * (N - 1) * 0.020


def test_without_pacing_a_slow_slo_does_not_hold_tokens(tmp_path) -> None:
    """A 20 s TPOT SLO would hold 10 tokens for 3 minutes if paced: unpaced, the streams end
    within the client's 30 s timeout (an order-of-magnitude check, not a timing bar)."""
    times, _, _ = _run(tmp_path, pacing=False, tpot_ms=20_000.0)
    assert 1 <= len(times) <= N


@pytest.mark.slow
@pytest.mark.parametrize("pacing", [True, False])
def test_streams_follow_the_tpot_pace_only_with_pacing(tmp_path, pacing: bool) -> None:
    """The timing bars (a loaded machine breaks them: `slow`, out of CI)."""
    times, fast, _ = _run(tmp_path, pacing)
    span, span_fast = times[-1] - times[0], fast[-1] - fast[0]
    if pacing:
        assert span_fast < span
        # no bursts (tokens of a burst arrive well under a millisecond apart); the margin is wide
        # because a token the loaded client reads late shortens its successor's gap
        gaps = [b - a for a, b in zip(times, times[1:])]
        assert min(gaps) >= 0.25 * TPOT_MS / 1e3
    else:
        assert span < 0.5 * (N - 1) * TPOT_MS / 1e3
