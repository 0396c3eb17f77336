"""SLO defaults and deadlines (DESIGN.md section 3): a request's clock starts at the frontend's
arrival, converted once into the engine clock; its SLO is resolved once where it enters (its own,
else the server default) and the engine applies no default of its own."""

from __future__ import annotations

import pytest
from sglang_pd.engine.request import MAX_FRONTEND_AGE_S, Req
from sglang_pd.offline_engine import parse_slo
from sglang_pd.protocol import GenerateReq, SamplingParams, Slo
from sglang_pd.request_params import default_slo
from sglang_pd.request_params import parse_slo as parse_request_slo
from sglang_pd.server_args import ServerArgs


def _msg(arrival_time: float = 0.0, slo: Slo | None = None) -> GenerateReq:
    return GenerateReq(rid="r", input_ids=[1, 2], sampling_params=SamplingParams(),
                       arrival_time=arrival_time, slo=slo)


def test_deadline_starts_at_the_frontend_arrival() -> None:
    req = Req.from_msg(_msg(arrival_time=1000.0), now=50.0, wall_now=1002.5)
    assert req.arrival == pytest.approx(47.5)  # 2.5 s queued before the engine saw it
    assert Req.from_msg(_msg(), now=50.0, wall_now=1002.5).arrival == 50.0  # no frontend time
    assert Req.from_msg(_msg(arrival_time=2000.0), now=50.0, wall_now=1000.0).arrival == 50.0  # skew
    old = Req.from_msg(_msg(arrival_time=1.0), now=50.0, wall_now=1e6)
    assert old.arrival == 50.0 - MAX_FRONTEND_AGE_S


def test_server_defaults_apply_only_without_a_request_slo() -> None:
    defaults = default_slo(500.0, 50.0)
    assert defaults == Slo(0.5, 0.05) and default_slo(None, None) is None
    assert parse_request_slo(None, {}, defaults) == defaults
    own = parse_request_slo({"ttft_ms": 200.0}, {}, defaults)
    assert own == Slo(0.2, 0.05)  # per field: tpot falls back
    assert parse_request_slo(None, {"x-slo-tpot-ms": "20"}, defaults) == Slo(0.5, 0.02)
    assert parse_request_slo({"ttft_ms": 100}, {"x-slo-ttft-ms": "300"}) == Slo(0.1, None)  # body first
    # the engine takes the resolved value as it is: no default of its own
    req = Req.from_msg(_msg(slo=own), 0.0, 0.0)
    assert (req.slo_ttft_s, req.slo_tpot_s) == (0.2, 0.05)
    bare = Req.from_msg(_msg(), 0.0, 0.0)
    assert (bare.slo_ttft_s, bare.slo_tpot_s) == (None, None)


def test_server_args_build_the_policy_config() -> None:
    args = ServerArgs(model_path="m", slo_ttft_ms=800, slo_tpot_ms=40, enable_mixed_chunk=True,
                      short_prefill_buckets="32,64x1,2", disaggregation_mode="prefill")
    cfg = args.policy_config()
    assert (cfg.slo_ttft_s, cfg.slo_tpot_s, cfg.role, cfg.enable_mixed_chunk) == (0.8, 0.04, "prefill", True)
    assert cfg.buckets.tokens == (32, 64) and cfg.buckets.bucket(40, 2) == (64, 2)
    with pytest.raises(ValueError, match="slo-ttft-ms"):
        ServerArgs(model_path="m", slo_ttft_ms=float("nan"))
    with pytest.raises(ValueError, match="decode-policy"):
        ServerArgs(model_path="m", decode_policy="nope")
    with pytest.raises(ValueError, match="short-prefill-buckets"):
        ServerArgs(model_path="m", short_prefill_buckets="64,32x1")


def test_offline_slo_is_validated() -> None:
    assert parse_slo({"ttft_ms": 100}) == Slo(ttft_s=0.1)
    assert parse_slo(None) is None
    assert parse_slo(None, Slo(1.0, None)) == Slo(1.0, None)  # the engine's defaults
    for bad in ({"ttft": 1}, {"ttft_ms": -1}, {"tpot_ms": float("inf")}):
        with pytest.raises(ValueError):
            parse_slo(bad)


def test_prefill_policy_flags_reach_the_config_and_a_bad_profile_fails_at_start(tmp_path) -> None:
    from sglang_pd.server_args import parse_server_args

    args = parse_server_args(["--model-path", "m", "--prefill-policy", "kairos+", "--prefill-max-partial", "3",
                              "--prefill-deadline-margin-ms", "20"])
    cfg = args.policy_config()
    assert (args.schedule_policy, cfg.prefill_max_partial, cfg.prefill_deadline_margin_ms) == ("kairos+", 3, 20)
    with pytest.raises(ValueError, match="prefill_max_partial"):
        ServerArgs(model_path="m", prefill_max_partial=0)
    bad = tmp_path / "p.json"
    bad.write_text('{"schema_version": 99}')
    with pytest.raises(ValueError, match="--cost-model-profile"):
        ServerArgs(model_path="m", cost_model_profile=str(bad))
    with pytest.raises(ValueError, match="--cost-model-profile"):
        ServerArgs(model_path="m", cost_model_profile=str(tmp_path / "missing.json"))
