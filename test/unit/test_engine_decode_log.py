"""The engine's decode decision log (engine/decode_log.py) on the real EngineCore: one line per
decode step when the logger is at DEBUG, none otherwise, and the same tokens either way."""

from __future__ import annotations

import logging
import re

import pytest

from engine_drive import serve_greedy
from sglang_pd.server_args import ServerArgs

LOGGER = "sglang_pd.engine.decode_log"


def _serve(model: str) -> dict[str, list[int]]:
    from sglang_pd.engine.engine_core import EngineCore

    core = EngineCore(ServerArgs(model_path=model, page_size=4, device="cpu", max_total_tokens=2048,
                                 dtype="float32", decode_policy="slack+", slo_tpot_ms=250.0))
    return serve_greedy(core, [[11, 12, 13], [40 + i for i in range(30)], [7] * 6], max_new_tokens=6)


def test_decode_log_on_the_engine(tiny_model_factory, caplog: pytest.LogCaptureFixture) -> None:
    model = tiny_model_factory("llama")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        quiet = _serve(model)
    assert not [r for r in caplog.records if r.name == LOGGER]
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        logged = _serve(model)
    assert logged == quiet
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert lines  # every request decodes 5 tokens after its first: at least 5 decode steps
    for line in lines:
        m = re.fullmatch(r"decode n=(\d+) chose=(\d+) ctx_max=\d+ gap=\S+ t_all=[\d.]+ms t_chosen=[\d.]+ms "
                         r"behind=\d+ due_ms\(s=skipped\)=\[(.*)\] took=[\d.]+ms", line)
        assert m, line
        n, chose = int(m[1]), int(m[2])
        assert 1 <= chose <= n and len(m[3].split(",")) == n
        assert sum(d.endswith("s") for d in m[3].split(",")) == n - chose
