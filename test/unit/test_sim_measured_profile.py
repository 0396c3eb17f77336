"""The simulator's ground truth from a measured profile: prefill fitted to the lone and batched
grids (``fit_measured_prefill``: PLA-Serve's terms plus the step's tokens squared), decode rows
smoothed to straight lines in the context (``smooth_rows``)."""

from __future__ import annotations

import pytest

from sglang_pd.scheduling.cost_model import PrefillCoeffs
from sglang_pd.scheduling.profile import (DecodeGrid, PrefillBatchGrid, PrefillCoeffsSpec, PrefillGrid, Profile,
                                          ProfileMeta)
from sglang_pd.sim.profiles import GridDecode, StepCost, fit_measured_prefill, smooth_rows

TRUE = PrefillCoeffs(launch_s=0.05, per_req_s=0.002, a=4e-7, b=1.2e-3, g_w=3e-4, g_r=1e-5)


def _step(chunks: list[tuple[int, int]], tokens2: float) -> float:
    return StepCost("t", TRUE, lambda b, c, m: 0.0, 1.0, 1, step_tokens2_s=tokens2).prefill_s(chunks)


def _profile(tokens2: float, split: bool) -> Profile:
    ls, hs, bs, bl = [32, 64, 128, 256, 512, 768], [0, 512], [1, 2, 4], [64, 256, 512]
    lone = [[_step([(l, h)], tokens2) for h in hs] for l in ls]
    batched = [[_step([(l, 0)] * b, tokens2) for l in bl] for b in bs]
    meta = ProfileMeta(model="m", arch="LlamaForCausalLM", device="cpu", dtype="float32", page_size=16,
                       attention_backend="torch", created="2026-11-23")
    coeffs = PrefillCoeffsSpec(launch_s=0.1, b=3.0, g_w=1.0) if split else None  # only the split is read
    grid = PrefillGrid(new_tokens=ls, context_tokens=hs, seconds=lone, coeffs=coeffs,
                       batched=PrefillBatchGrid(batch_sizes=bs, new_tokens=bl, seconds=batched))
    return Profile(schema_version=1, meta=meta, prefill=grid)


@pytest.mark.parametrize("tokens2", [0.0, 2e-7])
def test_recovers_the_terms_that_made_the_grid(tokens2: float) -> None:
    coeffs, got2 = fit_measured_prefill(_profile(tokens2, split=False))
    assert got2 == pytest.approx(tokens2, abs=1e-12)
    for name in ("launch_s", "per_req_s", "a", "g_r"):
        assert getattr(coeffs, name) == pytest.approx(getattr(TRUE, name), rel=1e-6, abs=1e-12), name
    assert coeffs.b + coeffs.g_w == pytest.approx(TRUE.b + TRUE.g_w, rel=1e-6)
    assert coeffs.g_w == 0.0  # no split known: all of k is b


def test_keeps_the_profiles_compute_memory_split() -> None:
    coeffs, _ = fit_measured_prefill(_profile(1e-7, split=True))
    assert coeffs.b / (coeffs.b + coeffs.g_w) == pytest.approx(0.75)


def test_steps_of_more_tokens_cost_more_per_token_only_with_the_term() -> None:
    """Two 300-token prompts in one step: with the squared term the step costs more than the PLA
    terms alone say (the CPU effect it models); a lone short prompt barely changes."""
    with_term = StepCost("t", TRUE, lambda b, c, m: 0.0, 1.0, 1, step_tokens2_s=2e-7)
    plain = StepCost("t", TRUE, lambda b, c, m: 0.0, 1.0, 1)
    two = [(300, 0), (300, 0)]
    assert with_term.prefill_s(two) - plain.prefill_s(two) == pytest.approx(2e-7 * 600 ** 2)
    assert with_term.prefill_s([(16, 0)]) == pytest.approx(plain.prefill_s([(16, 0)]), rel=1e-3)


def test_decode_rows_become_their_lines_and_stay_apart() -> None:
    ctx = [256, 512, 1024, 2048, 4096]
    line = [0.05 + 1e-5 * c for c in ctx]
    noisy = [t * f for t, f in zip(line, (1.06, 0.95, 1.04, 0.97, 1.0))]
    jump = [0.08 + 1e-5 * c for c in ctx]  # batch 4 much slower than 3: kept, not averaged away
    grid = DecodeGrid(batch_sizes=[1, 3, 4], context_tokens=ctx, seconds=[noisy, line, jump])
    rows = smooth_rows(grid).seconds
    assert rows[1] == pytest.approx(line) and rows[2] == pytest.approx(jump)  # already lines
    slope = (rows[0][-1] - rows[0][0]) / (ctx[-1] - ctx[0])
    assert all(r == pytest.approx(rows[0][0] + slope * (c - ctx[0])) for r, c in zip(rows[0], ctx))
    assert max(abs(r - t) / t for r, t in zip(rows[0], line)) < 0.03  # the noise is gone
    assert max(abs(r - t) / t for r, t in zip(noisy, line)) > 0.04
    gaps = DecodeGrid(batch_sizes=[1, 2], context_tokens=[256, 512, 1024],
                      seconds=[[0.05, None, 0.06], [0.07, None, None]])
    assert smooth_rows(gaps).seconds == [[pytest.approx(0.05), None, pytest.approx(0.06)], [0.07, None, None]]
    truth = GridDecode(grid, smooth=True)
    assert truth(1, 1024, 1024) == pytest.approx(rows[0][2])
