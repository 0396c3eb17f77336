"""The simulator's ground-truth prefill from a measured profile (``fit_measured_prefill``):
PLA-Serve's terms plus the step's tokens squared, fitted to the lone and batched grids."""

from __future__ import annotations

import pytest

from sglang_pd.scheduling.cost_model import PrefillCoeffs
from sglang_pd.scheduling.profile import PrefillBatchGrid, PrefillCoeffsSpec, PrefillGrid, Profile, ProfileMeta
from sglang_pd.sim.profiles import StepCost, fit_measured_prefill

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
