"""The router's command line: sglang-router-shaped flags, ours, and clear refusals."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sglang_pd_router.cli import build_parser, config_from_args


def _cfg(*argv: str):
    return config_from_args(build_parser().parse_args(list(argv)))


def test_sglang_router_shaped_flags() -> None:
    cfg = _cfg("--pd-disaggregation", "--prefill", "http://p1:30001", "8998",
               "--prefill", "http://p2:30002", "none", "--prefill", "http://p3:30003/",
               "--decode", "http://d1:30011", "--decode", "http://d2:30012",
               "--host", "0.0.0.0", "--port", "8000", "--prefill-policy", "round_robin",
               "--decode-policy", "random", "--api-key", "k")
    assert [(p.url, p.bootstrap_port) for p in cfg.prefills] == [
        ("http://p1:30001", 8998), ("http://p2:30002", None), ("http://p3:30003", 8998)]
    assert cfg.decodes == ["http://d1:30011", "http://d2:30012"]
    assert (cfg.host, cfg.port, cfg.prefill_policy, cfg.decode_policy) == (
        "0.0.0.0", 8000, "round_robin", "random")
    assert cfg.key_for_workers == "k"


def test_our_flags() -> None:
    cfg = _cfg("--prefill", "http://p:1", "--decode", "http://d:2", "--policy", "power_of_two",
               "--short-prefill-threshold", "256", "--pool-controller", "off",
               "--slo-ttft-ms", "400", "8000", "--slo-tpot-ms", "50",
               "--controller-weights", "1", "2", "-0.5", "--controller-tau", "0.1",
               "--disable-retries", "--tokenizer-path", "/tmp/tok")
    assert cfg.prefill_policy == cfg.decode_policy == "power_of_two"
    assert cfg.short_prefill_threshold == 256 and not cfg.pool_controller
    assert cfg.slo_ttft_ms == {"short": 400, "long": 8000}
    assert cfg.slo_tpot_ms == {"short": 50, "long": 50}
    c = cfg.controller
    assert (c.alpha, c.beta, c.gamma, c.tau) == (1, 2, -0.5, 0.1)
    assert cfg.max_retries == 0 and cfg.tokenizer_path == "/tmp/tok"
    assert _cfg("--prefill", "http://p:1", "--decode", "http://d:2").prefill_policy == \
        "length_aware"


@pytest.mark.parametrize("argv, message", [
    (["--decode", "http://d:2"], "at least one --prefill"),
    (["--prefill", "http://p:1", "x", "--decode", "http://d:2"], "bootstrap port"),
    (["--prefill", "http://p:1", "1", "2", "--decode", "http://d:2"], "URL \\[BOOTSTRAP_PORT\\]"),
    (["--prefill", "p:1", "--decode", "http://d:2"], "http://host:port"),
    (["--prefill", "http://p:1", "--decode", "http://d:2", "--slo-ttft-ms", "1", "2", "3"],
     "SHORT LONG"),
    (["--prefill", "http://p:1", "--decode", "http://d:2", "--request-timeout-secs", "0"],
     "request_timeout_s"),
])
def test_bad_flags_are_refused_with_the_reason(argv, message) -> None:
    with pytest.raises(ValueError, match=message):
        _cfg(*argv)


def test_module_entry_point_prints_help_and_refuses_bad_input() -> None:
    ok = subprocess.run([sys.executable, "-m", "sglang_pd_router", "--help"],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "--pd-disaggregation" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "sglang_pd_router", "--decode", "http://d:1"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "at least one --prefill" in bad.stderr
