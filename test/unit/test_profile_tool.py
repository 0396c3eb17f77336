"""tools/profile_cost_model on the CPU engine with the tiny model (shapes, not timings), and the
engine's per-step samples for /metrics."""

from __future__ import annotations

import pytest

from sglang_pd.protocol import GenerateReq, SamplingParams
from sglang_pd.scheduling.decode_cost_model import DecodeCostModel
from sglang_pd.scheduling.profile import load_profile
from sglang_pd.tools import profile_cost_model as tool
from sglang_pd.tools.make_tiny_model import main as make_tiny


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("tiny"))
    make_tiny([path])
    return path


def test_profiler_writes_a_profile_the_cost_models_read(tiny: str, tmp_path) -> None:
    out = tmp_path / "p.json"
    tool.main(["--model-path", tiny, "--out", str(out), "--repeats", "1", "--warmup", "0",
               "--prefill-new-tokens", "8,64", "--prefill-context-tokens", "0,256,8192",
               "--prefill-batch-sizes", "1,4", "--prefill-batch-new-tokens", "8,32",
               "--decode-batch-sizes", "1,4", "--decode-context-tokens", "2,64,8192"])
    p = load_profile(out)
    assert p.meta.device == "cpu" and p.meta.arch == "LlamaForCausalLM" and p.meta.repeats == 1
    d = p.decode
    assert d is not None and d.context_key == "total" and d.batch_sizes == [1, 4]
    # batch 4 over 2 tokens is < 1 token each; batch 1 over 8192 exceeds the 4096 context
    assert d.seconds[1][0] is None and d.seconds[0][2] is None
    assert all(t > 0 for t in (d.seconds[0][0], d.seconds[0][1], d.seconds[1][1], d.seconds[1][2]))
    assert d.std_seconds is not None and d.std_seconds[0][0] == 0.0  # one repeat
    pf = p.prefill
    assert pf is not None and pf.seconds[0][2] is None and pf.seconds[1][1] > 0
    assert pf.batched is not None and pf.batched.seconds[1][1] > 0
    assert pf.coeffs is not None
    assert min(getattr(pf.coeffs, f) for f in pf.coeffs.__struct_fields__) >= 0
    assert len(p.extra["prefill_attention_seconds"]) == 2
    model = DecodeCostModel.from_profile(p)
    assert model.step_s(4, 64) == pytest.approx(d.seconds[1][1])


def test_bad_grids_are_refused(tiny: str) -> None:
    with pytest.raises(SystemExit):
        tool.parse_args(["--model-path", tiny, "--out", "x", "--decode-batch-sizes", "4,2"])
    with pytest.raises(SystemExit):
        tool.parse_args(["--model-path", tiny, "--out", "x", "--skip-prefill", "--skip-decode"])


def test_engine_hands_out_each_step_sample_once(tiny: str) -> None:
    args = tool.parse_args(["--model-path", tiny, "--out", "x", "--skip-prefill",
                            "--decode-batch-sizes", "1", "--decode-context-tokens", "64"])
    core = tool.build_core(args)
    try:
        core.add_request(GenerateReq("a", [1, 2, 3], SamplingParams(max_new_tokens=3, temperature=0.0)))
        while core.has_work:
            core.step()
        assert core.stats().step_samples is None  # /get_load never consumes them
        s = core.stats(step_samples=True).step_samples
        assert s is not None and s.modes == ["extend", "decode", "decode"] and s.batch_sizes == [1, 1, 1]
        assert all(t > 0 for t in s.seconds)
        assert core.stats(step_samples=True).step_samples.modes == []  # type: ignore[union-attr]
    finally:
        core.close()


def test_profile_with_tp_records_its_size(tiny: str, tmp_path) -> None:
    """--tp-size 2: rank 0 times the steps (a real rank 1 runs each forward with it) and the
    profile says the steps ran on 2 ranks."""
    out = tmp_path / "tp2.json"
    tool.main(["--model-path", tiny, "--out", str(out), "--repeats", "1", "--warmup", "0",
               "--skip-prefill", "--decode-batch-sizes", "1,2", "--decode-context-tokens", "16",
               "--tp-size", "2"])
    p = load_profile(out)
    assert p.meta.tp_size == 2
    assert p.decode is not None and all(t is not None and t > 0 for row in p.decode.seconds for t in row)
