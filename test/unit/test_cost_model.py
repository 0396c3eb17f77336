"""PrefillCostModel (PLA-Serve §2.1 + our launch/per-request terms): fit, prior, batch term."""

from __future__ import annotations

import math
import random

import pytest

from sglang_pd.core.step import ForwardMode, StepProfile, StepShape
from sglang_pd.scheduling.cost_model import PrefillCoeffs, PrefillCostModel, PrefillPoint

TRUE = PrefillCoeffs(launch_s=3e-3, per_req_s=2e-4, a=2e-10, b=3e-5, g_w=1e-5, g_r=2e-7)
PRIOR = PrefillCoeffs(launch_s=1e-2, per_req_s=1e-3, a=1e-9, b=6e-5, g_w=2e-5, g_r=1e-6)  # b : g_w = 3 : 1


def _steps(n: int, seed: int = 0, coeffs: PrefillCoeffs = TRUE, noise: float = 0.0):
    """Steps whose per-request shares are equal (so the step's sums determine the attention term)."""
    rng = random.Random(seed)
    truth = PrefillCostModel.fixed(coeffs)
    for _ in range(n):
        batch = rng.choice((1, 1, 2, 4, 8))
        l, h = rng.randint(16, 4096), rng.choice((0, rng.randint(0, 32768)))
        t = truth.step_s([(l, h)] * batch) * (1 + noise * rng.uniform(-1, 1))
        shape = StepShape(batch, batch * l)
        yield StepProfile(ForwardMode.EXTEND, batch, batch * l, batch * h, h, shape, t, t)


def test_recovers_known_coefficients_from_synthetic_steps() -> None:
    m = PrefillCostModel(PRIOR, prior_weight=1e-6, min_samples=8)
    for step in _steps(300):
        m.observe(step, step.total_s, 0.0)
    c = m.coeffs
    for got, want in ((c.launch_s, TRUE.launch_s), (c.per_req_s, TRUE.per_req_s), (c.a, TRUE.a),
                      (c.b + c.g_w, TRUE.b + TRUE.g_w), (c.g_r, TRUE.g_r)):
        assert got == pytest.approx(want, rel=1e-3)
    # b and g_w share one column: the fit keeps the prior's split (3 : 1), not the truth's
    assert c.b / (c.b + c.g_w) == pytest.approx(0.75)
    assert m.boundary_tokens() == pytest.approx(max(0.0, (c.g_w - c.b) / c.a))


def test_prior_is_used_until_enough_samples() -> None:
    m = PrefillCostModel(PRIOR, min_samples=16)
    steps = list(_steps(16))
    for step in steps[:15]:
        m.observe(step, step.total_s, 0.0)
    assert m.coeffs == PRIOR and m.num_samples == 15
    m.observe(steps[15], steps[15].total_s, 0.0)
    assert m.coeffs != PRIOR

    def err(model: PrefillCostModel) -> float:
        return sum(abs(model.step_s([(s.new_tokens // s.batch_size, s.context_tokens // s.batch_size)]
                                    * s.batch_size) / s.total_s - 1) for s in steps)

    assert err(m) < err(PrefillCostModel.fixed(PRIOR)) / 2  # the data now weighs in


def test_prior_grid_holds_directions_the_data_never_explores() -> None:
    """Live steps never have context (H = 0): g_r is left to the prior points (near the prior's
    value: those points also absorb the gap between the prior's a and the fitted one)."""
    m = PrefillCostModel(PRIOR, min_samples=8)
    truth = PrefillCostModel.fixed(TRUE)
    rng = random.Random(1)
    for _ in range(200):
        l, b = rng.randint(16, 4096), rng.choice((1, 4))
        m.add_sample(PrefillPoint(b, b * l, 0, truth.step_s([(l, 0)] * b)))
    assert PRIOR.g_r / 2 < m.coeffs.g_r < PRIOR.g_r * 2
    assert m.coeffs.b + m.coeffs.g_w == pytest.approx(TRUE.b + TRUE.g_w, rel=0.1)  # prior weight 8 of 208


def test_batch_term_b_short_prefills_in_one_step_cost_less_than_b_alone() -> None:
    m = PrefillCostModel.fixed(TRUE)
    one = m.step_s([(128, 0)])
    batched = m.step_s([(128, 0)] * 8)
    assert batched < 8 * one
    assert 8 * one - batched == pytest.approx(7 * TRUE.launch_s)  # the launch is paid once
    assert m.step_s([]) == 0.0


def test_request_time_is_the_sum_of_its_chunk_steps() -> None:
    m = PrefillCostModel.fixed(TRUE)
    new, ctx, chunk = 10_000, 3000, 2048
    steps, done = 0.0, 0
    while done < new:
        n = min(chunk, new - done)
        steps += m.step_s([(n, ctx + done)])
        done += n
    assert m.request_s(new, ctx, chunk) == pytest.approx(steps)
    assert m.request_times([new, 100], [ctx, 0], chunk) == pytest.approx([steps, m.request_s(100)])
    # the attention term does not depend on the chunking: only launch and KV re-reads do
    attn = PrefillCostModel.fixed(PrefillCoeffs(a=TRUE.a))
    assert attn.request_s(new, ctx, chunk) == pytest.approx(attn.request_s(new, ctx))


def test_coefficients_stay_non_negative_under_noise() -> None:
    """No context cost in the truth (g_r = 0) and 20% noise: a free fit would go negative."""
    truth = PrefillCoeffs(launch_s=1e-3, a=1e-10, b=4e-5)
    m = PrefillCostModel(PrefillCoeffs(b=1e-5, g_w=1e-5), prior_weight=1e-6, min_samples=8)
    for step in _steps(400, seed=3, coeffs=truth, noise=0.2):
        m.observe(step, step.total_s, 0.0)
    c = m.coeffs
    assert min(c.launch_s, c.per_req_s, c.a, c.b, c.g_w, c.g_r) >= 0
    assert c.b + c.g_w == pytest.approx(4e-5, rel=0.1)


def test_only_extend_steps_are_prefill_samples() -> None:
    m = PrefillCostModel(min_samples=1)
    for mode in (ForwardMode.DECODE, ForwardMode.MIXED):
        m.observe(StepProfile(mode, 8, 8, 8000, 1000, StepShape(8, 8), 0.02, 0.02, 8), 0.02, 0.0)
    assert m.num_samples == 0
    m.observe(StepProfile(ForwardMode.EXTEND, 1, 512, 0, 0, StepShape(1, 512)), 0.05, 0.0)
    assert m.num_samples == 1


def test_sliding_window_follows_a_new_regime() -> None:
    slow = PrefillCoeffs(launch_s=6e-3, per_req_s=4e-4, a=4e-10, b=6e-5, g_w=2e-5, g_r=4e-7)
    m = PrefillCostModel(TRUE, window=64, min_samples=8, prior_weight=1e-6)
    for step in list(_steps(100, seed=4)) + list(_steps(200, seed=5, coeffs=slow)):
        m.observe(step, step.total_s, 0.0)
    assert m.num_samples == 64
    assert m.coeffs.a == pytest.approx(slow.a, rel=1e-3)
    assert m.coeffs.launch_s == pytest.approx(slow.launch_s, rel=1e-3)


def test_fixed_model_does_not_learn_and_bad_coefficients_are_refused() -> None:
    m = PrefillCostModel.fixed(TRUE)
    for step in _steps(50, coeffs=PRIOR):
        m.observe(step, step.total_s, 0.0)
    assert m.coeffs == TRUE
    with pytest.raises(ValueError, match="g_r"):
        PrefillCoeffs(g_r=-1.0)
    with pytest.raises(ValueError, match="a must be"):
        PrefillCoeffs(a=math.nan)


def test_reprefill_boundary_is_where_compute_meets_memory() -> None:
    m = PrefillCostModel.fixed(PrefillCoeffs(a=1e-9, b=1e-5, g_w=4e-5, g_r=1e-6))
    c = m.coeffs
    assert m.boundary_tokens() == pytest.approx((c.g_w - c.b) / c.a)  # PLA-Serve §2.1, H = 0
    h = 4096
    lm = m.boundary_tokens(h)
    comp = c.a * lm * (lm + 2 * h) + c.b * lm
    mem = c.g_w * lm + c.g_r * h
    assert comp == pytest.approx(mem)
    assert PrefillCostModel.fixed(PrefillCoeffs(a=1e-9)).boundary_tokens() is None  # split unknown


def test_unequal_batches_fit_exactly_with_the_steps_attention_sum() -> None:
    """A long chunk batched with short prompts: the step's own sum L_i(L_i + 2H_i) recovers the
    attention coefficient; equal shares of the sums would not."""
    rng = random.Random(3)
    truth = PrefillCostModel.fixed(TRUE)
    exact = PrefillCostModel(PRIOR, prior_weight=1e-6, min_samples=8)
    shares = PrefillCostModel(PRIOR, prior_weight=1e-6, min_samples=8)
    for _ in range(200):
        chunks = [(rng.randint(1024, 8192), rng.randint(0, 16384))]
        chunks += [(rng.randint(8, 64), 0) for _ in range(rng.randint(0, 7))]
        t = truth.step_s(chunks)
        new, ctx = sum(l for l, _ in chunks), sum(h for _, h in chunks)
        attn = sum(l * (l + 2 * h) for l, h in chunks)
        shape = StepShape(len(chunks), new)
        exact.observe(StepProfile(ForwardMode.EXTEND, len(chunks), new, ctx, 0, shape, t, t, 0, attn), t, 0.0)
        shares.observe(StepProfile(ForwardMode.EXTEND, len(chunks), new, ctx, 0, shape, t, t), t, 0.0)
    assert exact.coeffs.a == pytest.approx(TRUE.a, rel=1e-3)
    assert abs(shares.coeffs.a / TRUE.a - 1) > 0.05
