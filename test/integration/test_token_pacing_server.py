"""--token-pacing end to end: the real server in front of the fake engine (one token per 5 ms).

With pacing, a stream whose tokens come far ahead of its TPOT SLO reaches the client at the SLO
pace; without it (the default) they come as made. The content is the same either way.
Timing bounds are loose on purpose (the machine is shared): 10 tokens at a 60 ms SLO take at
least ~540 ms paced and ~50 ms unpaced.
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


@pytest.mark.parametrize("pacing", [True, False])
def test_streams_follow_the_tpot_pace_only_with_pacing(tmp_path, pacing: bool) -> None:
    model = write_tiny_model_dir(str(tmp_path / "model"))
    flags = ["--slo-tpot-ms", str(TPOT_MS)] + (["--token-pacing"] if pacing else [])
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
    span, span_fast = times[-1] - times[0], fast[-1] - fast[0]
    if pacing:
        assert len(times) == N  # one token per chunk: released one by one
        assert span >= 0.9 * (N - 1) * TPOT_MS / 1e3
        assert span_fast >= 0.9 * (N - 1) * 0.020 and span_fast < span
        # no bursts (tokens of a burst arrive well under a millisecond apart); the margin is wide
        # because a token the loaded client reads late shortens its successor's gap
        gaps = [b - a for a, b in zip(times, times[1:])]
        assert min(gaps) >= 0.25 * TPOT_MS / 1e3
    else:
        assert span < 0.5 * (N - 1) * TPOT_MS / 1e3
