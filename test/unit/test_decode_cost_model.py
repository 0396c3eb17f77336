"""DecodeCostModel: the decode step-time table, its profile prior and its online cell means."""

from __future__ import annotations

import pytest

from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.decode_cost_model import (DEFAULT_DECODE_PRIOR, DecodeCoeffs, DecodeCostModel,
                                                    fit_linear)
from sglang_pd.core.step import ForwardMode, StepProfile, StepShape
from sglang_pd.scheduling.profile import DecodeGrid, Profile, ProfileMeta, dump_profile

LIN = DecodeCoeffs(launch_s=2e-3, per_req_s=1e-4, per_ctx_s=1e-7)
B, C = [1, 4, 16], [0, 4096, 65536]


def lin_grid(key: str = "total") -> DecodeGrid:
    col = (lambda b, c: c) if key == "total" else (lambda b, c: c * b)
    return DecodeGrid(batch_sizes=B, context_tokens=C, context_key=key,  # type: ignore[arg-type]
                      seconds=[[LIN.step_s(b, col(b, c)) for c in C] for b in B])


def decode_step(batch: int, total: int, longest: int | None = None,
                mode: ForwardMode = ForwardMode.DECODE) -> StepProfile:
    return StepProfile(mode, batch, batch, total, longest if longest is not None else total // batch,
                       StepShape(batch, batch))


def test_interpolates_and_extrapolates_a_linear_table_exactly() -> None:
    m = DecodeCostModel.fixed(lin_grid())
    for b, c in [(1, 0), (3, 1000), (10, 50000), (16, 65536), (64, 262144), (2, 100)]:
        assert m.step_s(b, c) == pytest.approx(LIN.step_s(b, c), rel=1e-9)
    assert m.step_s(0, 0) == 0.0
    assert m.batch_s([100, 200, 300]) == pytest.approx(LIN.step_s(3, 600))


def test_step_time_grows_with_context_and_batch() -> None:
    m = DecodeCostModel()  # cold start: Kairos §2.2's batch-1 points
    assert m.step_s(1, 8192) == pytest.approx(11.0e-3, rel=1e-6)
    assert m.step_s(1, 131072) == pytest.approx(40.3e-3, rel=1e-6)
    assert m.step_s(8, 8192) > m.step_s(1, 8192)


def test_mean_keyed_profile_reads_total_contexts() -> None:
    m = DecodeCostModel.fixed(lin_grid("mean"))
    assert m.step_s(4, 4 * 4096) == pytest.approx(LIN.step_s(4, 4 * 4096))
    assert m.step_s(8, 8 * 1000) == pytest.approx(LIN.step_s(8, 8 * 1000), rel=1e-9)


def test_padded_attention_costs_every_request_at_the_longest_context() -> None:
    """The torch backend pads decode attention to the longest request: one 4K request among
    three 100-token ones costs 4 x 4K there, the sum (4.3K) on paged kernels."""
    paged, padded = DecodeCostModel.fixed(lin_grid()), DecodeCostModel(grid=lin_grid(), learn=False, padded=True)
    ctx = [4096, 100, 100, 100]
    assert paged.batch_s(ctx) == pytest.approx(LIN.step_s(4, sum(ctx)))
    assert padded.batch_s(ctx) == pytest.approx(LIN.step_s(4, 4 * 4096))
    assert padded.batch_s([100] * 3) == pytest.approx(paged.batch_s([100] * 3))  # equal: no padding
    # learning reads the step at the same effective context: a padded step fills the 4 x 4K cell
    learner = DecodeCostModel(grid=lin_grid(), prior_weight=1.0, scale_window=1, padded=True)
    learner.observe(decode_step(4, 4396, longest=4096), 2 * LIN.step_s(4, 4 * 4096), 0.0)
    assert learner.batch_s(ctx) == pytest.approx(2 * LIN.step_s(4, 4 * 4096), rel=0.3)
    cfg = PolicyConfig(decode_attention_padded=True)
    assert DecodeCostModel.from_config(cfg).padded and not DecodeCostModel.from_config(PolicyConfig()).padded


def test_null_cells_follow_a_linear_fit_of_the_measured_ones() -> None:
    g = lin_grid()
    g.seconds[2][2] = None  # e.g. beyond the pool
    m = DecodeCostModel.fixed(g)
    assert m.step_s(16, 65536) == pytest.approx(LIN.step_s(16, 65536), rel=1e-6)
    fitted = fit_linear([(b, c, LIN.step_s(b, c)) for b in B for c in C])
    assert fitted.per_ctx_s == pytest.approx(LIN.per_ctx_s, rel=1e-6)


def test_observed_steps_make_the_cell_their_historical_mean() -> None:
    m = DecodeCostModel(grid=lin_grid(), prior_weight=1.0, scale_window=1)
    prior = LIN.step_s(4, 4096)
    for t in (2 * prior, 4 * prior):
        m.observe(decode_step(4, 4096), t, now=0.0)
    assert m.num_samples == 2
    # scale_window=1: the prior part is rescaled by the last ratio (4x)
    assert m.step_s(4, 4096) == pytest.approx((4 * prior + 2 * prior + 4 * prior) / 3)


def test_only_decode_steps_teach_it() -> None:
    m = DecodeCostModel(grid=lin_grid())
    for mode in (ForwardMode.EXTEND, ForwardMode.MIXED):
        m.observe(decode_step(4, 4096, mode=mode), 1.0, now=0.0)
    assert m.num_samples == 0 and m.step_s(4, 4096) == pytest.approx(LIN.step_s(4, 4096))
    fixed = DecodeCostModel.fixed(lin_grid())
    fixed.observe(decode_step(4, 4096), 1.0, now=0.0)
    assert fixed.step_s(4, 4096) == pytest.approx(LIN.step_s(4, 4096))


def test_a_prior_at_the_wrong_scale_is_rescaled_where_no_step_ran() -> None:
    """The GPU guess on a CPU 100x slower: after steps in one region, the unvisited cells
    (here a long solo request) are read at the live scale, not the GPU's."""
    m = DecodeCostModel()
    true = DecodeCoeffs(*(100 * v for v in DEFAULT_DECODE_PRIOR.__dict__.values()))
    for b, c in [(2, 1000), (3, 2000), (4, 3000)] * 20:
        m.observe(decode_step(b, c), true.step_s(b, c), now=0.0)
    assert m.step_s(1, 131072) == pytest.approx(true.step_s(1, 131072), rel=0.1)
    assert m.step_s(3, 2000) == pytest.approx(true.step_s(3, 2000), rel=0.1)


def test_off_cell_steps_do_not_bias_the_cell() -> None:
    """A step between cells moves its nearest cell by the table's own cell/point ratio."""
    m = DecodeCostModel(grid=lin_grid())
    for _ in range(50):
        m.observe(decode_step(5, 10000), LIN.step_s(5, 10000), now=0.0)
    for b, c in [(4, 4096), (1, 0), (16, 65536)]:
        assert m.step_s(b, c) == pytest.approx(LIN.step_s(b, c), rel=1e-6)


def test_from_config_reads_the_profile(tmp_path) -> None:
    meta = ProfileMeta(model="m", arch="LlamaForCausalLM", device="cpu", dtype="float32", page_size=16,
                       attention_backend="torch", created="2026-05-09")
    path = tmp_path / "p.json"
    dump_profile(Profile(schema_version=1, meta=meta, decode=lin_grid()), path)
    m = DecodeCostModel.from_config(PolicyConfig(cost_model_profile=str(path)))
    assert m.step_s(4, 4096) == pytest.approx(LIN.step_s(4, 4096))
    assert DecodeCostModel.from_config(PolicyConfig()).step_s(1, 8192) == pytest.approx(0.011)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="prior_weight"):
        DecodeCostModel(prior_weight=0)
    with pytest.raises(ValueError, match="per_ctx_s"):
        DecodeCoeffs(1e-3, 0.0, float("nan"))
    with pytest.raises(ValueError, match="decode_no_slo_tpot_ms"):
        PolicyConfig(decode_no_slo_tpot_ms=0)


def test_simulator_reads_a_torch_profile_as_padded(tmp_path) -> None:
    """The simulator's ground truth from a profile measured on the torch backend pads decode
    attention like that engine; one from a paged backend sums the contexts."""
    from sglang_pd.sim.profiles import GridDecode, pads

    for backend, want in (("torch", LIN.step_s(4, 4 * 4096)), ("triton", LIN.step_s(4, 4096 + 300))):
        meta = ProfileMeta(model="m", arch="LlamaForCausalLM", device="cpu", dtype="float32", page_size=16,
                           attention_backend=backend, created="2026-11-23")
        prof = Profile(schema_version=1, meta=meta, decode=lin_grid())
        truth = GridDecode(prof.decode, padded=pads(prof))
        assert truth(4, 4096 + 300, 4096) == pytest.approx(want)  # one 4K request, three of 100
