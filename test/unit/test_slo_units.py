"""The one ms -> s conversion for SLOs (router/sglang_pd_router/slo_units.py) and its users."""

from __future__ import annotations

import math

import pytest

from sglang_pd.protocol import Slo
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd_router.slo_units import slo_ms_to_s


@pytest.mark.parametrize("ms, seconds", [(500, 0.5), (50.0, 0.05), (1, 0.001)])
def test_positive_milliseconds_become_seconds(ms: float, seconds: float) -> None:
    assert slo_ms_to_s(ms) == pytest.approx(seconds)


@pytest.mark.parametrize("ms", [None, 0, 0.0, -5, math.inf, math.nan, True, "500", [500]])
def test_anything_else_is_no_slo(ms: object) -> None:
    assert slo_ms_to_s(ms) is None


def test_request_slo_and_server_defaults_use_the_same_rule() -> None:
    assert Slo.from_ms(500, None) == Slo(0.5, None)
    assert Slo.from_ms(0, 0) is None
    cfg = PolicyConfig(slo_ttft_ms=500)
    assert (cfg.slo_ttft_s, cfg.slo_tpot_s) == (0.5, None)
