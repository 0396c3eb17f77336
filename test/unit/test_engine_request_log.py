"""The engine's per-request timeline (engine/request_log.py) on the real EngineCore: one line per
finished request at DEBUG (INFO with ``--log-requests``), stages in order, the same tokens
either way."""

from __future__ import annotations

import logging

import pytest

from engine_drive import serve_greedy
from sglang_pd.bench.ttft_stages import parse_line
from sglang_pd.server_args import ServerArgs

LOGGER = "sglang_pd.engine.request_log"
PROMPTS = [[11, 12, 13], [40 + i for i in range(30)], [7] * 6]


def _serve(model: str, log_requests: bool) -> dict[str, list[int]]:
    from sglang_pd.engine.engine_core import EngineCore

    core = EngineCore(ServerArgs(model_path=model, page_size=4, device="cpu", max_total_tokens=2048,
                                 dtype="float32", log_requests=log_requests))
    return serve_greedy(core, PROMPTS, max_new_tokens=4, max_steps=100)


@pytest.mark.parametrize("log_requests, level", [(False, logging.DEBUG), (True, logging.INFO)])
def test_one_line_per_request(tiny_model_factory, caplog: pytest.LogCaptureFixture,
                              log_requests: bool, level: int) -> None:
    model = tiny_model_factory("llama")
    with caplog.at_level(level + 10, logger=LOGGER):  # one level above: nothing logged
        quiet = _serve(model, log_requests)
    assert not [r for r in caplog.records if r.name == LOGGER]
    with caplog.at_level(level, logger=LOGGER):
        logged = _serve(model, log_requests)
    assert logged == quiet
    lines = [parse_line(r.getMessage()) for r in caplog.records if r.name == LOGGER]
    assert sorted(ln.rid for ln in lines if ln is not None) == ["0", "1", "2"]
    for ln in lines:
        assert ln is not None and ln.mode == "colocated" and ln.room is None and ln.status == "ok"
        assert ln.prompt == len(PROMPTS[int(ln.rid)]) and ln.out == 4
        assert ln.queue_ms is not None and ln.first_ms is not None
        assert 0 <= ln.queue_ms <= ln.first_ms <= ln.end_ms


def test_rejected_request_logs_nothing(tiny_model_factory, caplog: pytest.LogCaptureFixture) -> None:
    """A request refused at admission never reached a stage: no timeline line (its 400 is the
    frontend's to log)."""
    from sglang_pd.engine.engine_core import EngineCore
    from sglang_pd.protocol import GenerateReq, SamplingParams

    core = EngineCore(ServerArgs(model_path=tiny_model_factory("llama"), page_size=4, device="cpu",
                                 max_total_tokens=2048, dtype="float32"))
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        core.add_request(GenerateReq(rid="x", input_ids=[], sampling_params=SamplingParams(max_new_tokens=2)))
        outs = core.step()
    assert [o.error_status for o in outs] == [400]
    assert not [r for r in caplog.records if r.name == LOGGER]
