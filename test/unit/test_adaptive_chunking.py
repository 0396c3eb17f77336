"""Medha's adaptive chunking (App. A.2) under --prefill-time-budget-ms, on a fixed cost model."""

from __future__ import annotations

import pytest

from policy_helpers import CountingKV, FakeReq
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.cost_model import PrefillCoeffs, PrefillCostModel
from sglang_pd.scheduling.prefill.chunking import RHO_MAX, time_budget_s
from sglang_pd.scheduling.prefill.lars import LarsPrefillPolicy
from sglang_pd.scheduling.types import PrefillBudget

# attention matters: a·L(L+2H) with a = 1e-9 s, plus 10 us per token and 5 ms per step
COEFFS = PrefillCoeffs(launch_s=0.005, a=1e-9, b=1e-5)
TARGET_MS = 100.0


def _policy(**kw) -> LarsPrefillPolicy:
    cfg = PolicyConfig(prefill_time_budget_ms=TARGET_MS, chunked_prefill_size=65536,
                       max_prefill_tokens=65536, prefill_no_slo_ttft_ms=1e6, **kw)
    return LarsPrefillPolicy(cfg, PrefillCostModel.fixed(COEFFS))


def _budget(riders: tuple[int, ...] = ()) -> PrefillBudget:
    return PrefillBudget(65536, 65536, 64, CountingKV(10**9), rider_contexts=riders)


def test_long_prefill_chunks_shrink_as_context_grows_and_fit_the_target() -> None:
    policy = _policy()
    model = policy.model
    long = FakeReq("long", 0.0, 40_000, slo_ttft_s=1e5)  # huge slack: rho capped at RHO_MAX
    sizes = []
    while long.prefill_remaining:
        plan = policy.schedule([long], 0.0, _budget())
        assert len(plan) == 1
        n = plan[0][1]
        if long.prefill_remaining > n:  # the last chunk is just what is left
            # the yielded share: at most (1 - rho_max) of the target, and not one token more fits
            assert model.step_s([(n, long.prefilled_len)]) <= TARGET_MS / 1e3 * (1 - RHO_MAX) + 1e-12
            assert model.step_s([(n + 1, long.prefilled_len)]) > TARGET_MS / 1e3 * (1 - RHO_MAX)
        sizes.append(n)
        long.prefilled_len += n
    assert sizes[0] > 2 * sizes[-2]  # attention grows with context: chunks shrink
    assert all(a >= b for a, b in zip(sizes, sizes[1:-1]))


def test_a_long_prefill_with_slack_yields_room_to_short_ones() -> None:
    policy = _policy()
    long = FakeReq("long", 0.0, 40_000, slo_ttft_s=1e5)
    shorts = [FakeReq(f"s{i}", 0.1, 200, slo_ttft_s=1e5) for i in range(3)]  # <= 256: short
    plan = policy.schedule([long] + shorts, 1.0, _budget())
    rids = [r.rid for r, _ in plan]
    assert rids[0] == "long"  # least relative slack first (LARS)
    assert any(r.startswith("s") for r in rids)  # shorts fill the yielded share
    total = policy.model.step_s((n, r.prefilled_len) for r, n in plan)
    assert total <= TARGET_MS / 1e3 + 1e-12


def test_urgent_long_prefill_takes_the_whole_budget() -> None:
    policy = _policy()
    long = FakeReq("long", 0.0, 40_000, slo_ttft_s=0.5)  # negative slack: rho clamps to 0
    plan = policy.schedule([long], 0.0, _budget())
    n = plan[0][1]
    assert policy.model.step_s([(n, 0)]) > TARGET_MS / 1e3 * (1 - RHO_MAX)
    assert policy.model.step_s([(n, 0)]) <= TARGET_MS / 1e3


def test_at_most_one_long_prefill_per_batch_and_no_requeue_loop() -> None:
    policy = _policy()
    a = FakeReq("a", 0.0, 20_000, slo_ttft_s=1.0)
    b = FakeReq("b", 0.0, 20_000, slo_ttft_s=1.0)
    plan = policy.schedule([a, b], 0.0, _budget())
    assert len([r for r, _ in plan if r.rid in ("a", "b")]) == 1  # b skipped, the call returned


def test_decodes_riding_along_count_first() -> None:
    policy = _policy()
    alone = policy.schedule([FakeReq("x", 0.0, 40_000, slo_ttft_s=0.5)], 0.0, _budget())[0][1]
    with_decodes = policy.schedule([FakeReq("y", 0.0, 40_000, slo_ttft_s=0.5)], 0.0,
                                   _budget(riders=(20_000,) * 32))[0][1]
    assert with_decodes < alone


def test_per_mode_default_and_off() -> None:
    assert time_budget_s(PolicyConfig()) is None  # fixed chunks
    assert time_budget_s(PolicyConfig(prefill_time_budget_ms=250)) == pytest.approx(0.25)
    # colocated with mixed steps: Medha's t_target from the TPOT SLO
    assert time_budget_s(PolicyConfig(enable_mixed_chunk=True, slo_tpot_ms=50)) == pytest.approx(0.05)
    assert time_budget_s(PolicyConfig(enable_mixed_chunk=True, slo_tpot_ms=50, role="prefill")) is None
    fixed = LarsPrefillPolicy(PolicyConfig(chunked_prefill_size=512), PrefillCostModel.fixed(COEFFS))
    budget = PrefillBudget(65536, 512, 64, CountingKV(10**9))
    assert fixed.schedule([FakeReq("l", 0.0, 4000)], 0.0, budget)[0][1] == 512
