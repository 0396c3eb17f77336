"""slack+ on what a PD decode server fed it in the issue 34 runs, and the engine's decode log.

The engine's decode log (engine/decode_log.py, ``--log-level debug``; bench_cluster.py
--decode-log) showed, on the shared 2-core machine, 97-98% of slack+'s decisions decode every
request (as continuous), SLOs and deadlines as sent (a fresh request due in 249 ms at T_slo
250 ms) and the table's step within 1.08x of the measured one at p50. One kind of partial step
cost more than it saved: ``n=8 chose=3 t_all=224.6ms t_chosen=192.3ms behind=6
due_ms=[-73s,-47,-83s,-187s,-91s,-29s,194,247]``: five requests already behind their pace were
left out (each a whole ~200 ms step later) so that a fresh request's token (due in 194 ms)
would not be ~30 ms late. Step 3's rescue now never skips a behind request.
"""

from __future__ import annotations

import logging

import pytest

from decode_sim import running_req
from policy_helpers import FakeReq
from sglang_pd.core.scheduled_step import ScheduledStep
from sglang_pd.core.step import ForwardMode, StepProfile, StepShape
from sglang_pd.engine.decode_log import DecodeLog
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.decode.pacing import decode_context, next_deadline
from sglang_pd.scheduling.decode.slack_plus import SlackPlusDecodePolicy
from sglang_pd.scheduling.decode_cost_model import DecodeCoeffs, DecodeCostModel

T = 0.25
# a CPU-like table: 120 ms a step + 10 ms per request (contexts do not matter here)
TABLE = DecodeCoeffs(launch_s=0.12, per_req_s=0.01, per_ctx_s=0.0)


def req(rid: str, due: float, n_generated: int = 1) -> FakeReq:
    """A request whose next token is due ``due`` seconds after now = 0."""
    r = running_req(rid, 100, T)
    r.n_generated, r.first_token_time = n_generated, due - T * n_generated
    return r


def engine_case() -> list[FakeReq]:
    """Five requests 100 ms behind their pace (alone, their next token is 230 ms late: best
    effort) and two fresh ones due in 165 and 250 ms; decode-all 190 ms, feasible."""
    return [req(f"late{i}", -0.1, n_generated=6) for i in range(5)] + [req("f0", 0.165), req("f1", T)]


def test_a_rescue_never_skips_a_request_already_behind() -> None:
    """Before: f0 and f1 plus two of the late ones (160 ms, tokens/s under decode-all's, f0
    "rescued" from 25 ms of lateness) and three late requests a whole step later. Now: every
    request, as continuous batching."""
    pol = SlackPlusDecodePolicy(PolicyConfig(), model=DecodeCostModel.fixed(prior=TABLE))
    reqs = engine_case()
    batch = pol.schedule(reqs, now=0.0)
    assert len(batch) == len(reqs) and pol.num_partial_steps == 0


def test_a_rescue_that_skips_only_requests_ahead_still_runs() -> None:
    """The same fresh request f0 (due in 165 ms, decode-all 190 ms) with five requests ahead of
    their pace (due in 500 ms) instead: the rescue skips none that is behind and runs."""
    pol = SlackPlusDecodePolicy(PolicyConfig(), model=DecodeCostModel.fixed(prior=TABLE))
    reqs = [req(f"ahead{i}", 0.5, n_generated=6) for i in range(5)] + [req("f0", 0.165)]
    batch = pol.schedule(reqs, now=0.0)
    t = pol.model.batch_s([decode_context(r) for r in batch])
    assert "f0" in {r.rid for r in batch} and len(batch) < len(reqs)
    assert t <= next_deadline(reqs[-1], T, 0.0)


def _decode_step(batch: list[FakeReq]) -> ScheduledStep:
    return ScheduledStep(ForwardMode.DECODE, [(r, 1) for r in batch],  # type: ignore[misc]
                         StepShape(len(batch), len(batch)), len(batch))


def test_decode_log_line_and_silence_when_disabled(caplog: pytest.LogCaptureFixture) -> None:
    pol = SlackPlusDecodePolicy(PolicyConfig(), model=DecodeCostModel.fixed(prior=TABLE))
    reqs = engine_case()
    step = _decode_step(reqs[5:])  # as if the two fresh ones were chosen
    log = DecodeLog()
    took = StepProfile(ForwardMode.DECODE, 2, 2, 200, 100, step.shape, total_s=0.2)
    with caplog.at_level(logging.INFO, logger="sglang_pd.engine.decode_log"):
        assert not DecodeLog.enabled()
        log.decided(pol, reqs, step, 0.0)
        log.done(took)
    assert not caplog.records
    with caplog.at_level(logging.DEBUG, logger="sglang_pd.engine.decode_log"):
        log.decided(pol, reqs, step, 0.0)
        log.done(took)
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("decode n=7 chose=2 ctx_max=100 ")
    assert "t_all=190.0ms t_chosen=140.0ms behind=5" in line
    assert "[-100s,-100s,-100s,-100s,-100s,165,250]" in line and line.endswith("took=200.0ms")
