"""slack+'s overrun reserve (issue 34; docs/decode_scheduling.md "The reserve"): a request is
skipped only while its slack keeps the decode table's recent overrun in reserve, read from
``DecodeCostModel.overrun_s`` (measured step minus the table's prediction, recent steps)."""

from __future__ import annotations

import pytest

from decode_sim import running_req
from policy_helpers import FakeReq
from sglang_pd.core.step import ForwardMode, StepProfile, StepShape
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.decode.pacing import decode_context
from sglang_pd.scheduling.decode.slack_plus import SlackPlusDecodePolicy
from sglang_pd.scheduling.decode_cost_model import DecodeCoeffs, DecodeCostModel

T = 0.25
TABLE = DecodeCoeffs(launch_s=0.12, per_req_s=0.01, per_ctx_s=0.0)  # CPU-like: 120 ms + 10 ms a request


def _decode(batch: int, ctx: int) -> StepProfile:
    return StepProfile(ForwardMode.DECODE, batch, batch, ctx, ctx, StepShape(batch, batch), total_s=0.0)


def test_overruns_are_measured_against_the_table_before_each_step() -> None:
    model = DecodeCostModel(prior=TABLE)
    assert model.overrun_s(0.9) == 0.0  # nothing observed
    predicted = []
    for extra in (0.0, -0.01, 0.03, 0.05, 0.002):
        before = model.step_s(4, 400)
        predicted.append(before)
        model.observe(_decode(4, 400), before + extra, now=0.0)
    # the five overruns, each against the table as it stood before that step
    assert model.overrun_s(1.0) == pytest.approx(0.05)
    assert model.overrun_s(0.5) == pytest.approx(0.002)
    assert model.overrun_s(0.0) == 0.0  # floored: a faster step leaves no reserve
    fixed = DecodeCostModel.fixed(prior=TABLE)  # the simulator's exact table: learns nothing
    fixed.observe(_decode(4, 400), 1.0, now=0.0)
    assert fixed.overrun_s(0.9) == 0.0


def _case(model: DecodeCostModel, reserve: float) -> list[FakeReq]:
    """Five requests whose slack beyond decode-all is the lone fresh one's step plus half the
    reserve (skippable without the reserve, not with it), and that fresh one due between its
    own step and decode-all (a rescue, docstring step 3)."""
    ahead = [running_req(f"ahead{i}", 100, T) for i in range(5)]
    fresh = running_req("f0", 100, T)
    t_one = model.batch_s([decode_context(fresh)])
    t_all = model.batch_s([decode_context(r) for r in [*ahead, fresh]])
    for r in ahead:
        r.n_generated = 6
        r.first_token_time = t_all + t_one + reserve / 2 - T * r.n_generated
    fresh.first_token_time = (t_one + t_all) / 2 - T  # due after its own step, before decode-all's
    return [*ahead, fresh]


def test_a_request_is_skipped_only_while_its_slack_keeps_the_reserve() -> None:
    model = DecodeCostModel(prior=TABLE)
    for k in range(16):  # steps jitter 50 ms either way around the table (its mean stays right)
        model.observe(_decode(6, 600), model.step_s(6, 600) + (0.05 if k % 2 else -0.05), now=0.0)
    reserve = model.overrun_s(0.9)
    assert reserve > 0.04
    assert model.batch_s([100] * 6) <= T  # the pace stays feasible: the reserve is what differs
    reqs = _case(model, reserve)
    no_reserve = SlackPlusDecodePolicy(PolicyConfig(), model=model)  # the default: no reserve
    batch = no_reserve.schedule(reqs, now=0.0)  # the rescue (and packing) skips some of the five
    assert "f0" in {r.rid for r in batch} and len(batch) < len(reqs)
    kept = SlackPlusDecodePolicy(PolicyConfig(decode_reserve_quantile=0.9), model=model)
    assert len(kept.schedule(reqs, now=0.0)) == len(reqs) and kept.num_partial_steps == 0


def test_no_reserve_where_the_table_is_exact() -> None:
    """A table that does not learn (the simulator's) gives the rule as first written."""
    model = DecodeCostModel.fixed(prior=TABLE)
    reqs = _case(model, 0.0)
    batches = [[r.rid for r in SlackPlusDecodePolicy(cfg, model=model).schedule(reqs, now=0.0)]
               for cfg in (PolicyConfig(decode_reserve_quantile=0.9), PolicyConfig())]
    assert batches[0] == batches[1] and "f0" in batches[0] and len(batches[0]) < len(reqs)


def test_the_quantile_is_checked() -> None:
    with pytest.raises(ValueError, match="decode_reserve_quantile"):
        PolicyConfig(decode_reserve_quantile=1.5)
