"""Issue 22 (frontend part): bounded work per input and per streamed update, strict shapes,
no internal text in answers. Pure: no server, no engine."""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any
from collections.abc import AsyncIterator

import orjson
import pytest

from sglang_pd.entrypoints.context import ServerContext
from sglang_pd.entrypoints.native import parse_generate_body
from sglang_pd.entrypoints.openai_logprobs import completion_logprobs
from sglang_pd.entrypoints.openai_protocol import completion_prompts, message_text
from sglang_pd.entrypoints.runner import guarded_stream
from sglang_pd.frontend.detokenizer import StopHoldback, stop_holdback
from sglang_pd.frontend.errors import ApiError
from sglang_pd.frontend.inputs import check_input_ids, make_slo
from sglang_pd.frontend.metrics import FrontendMetrics
from sglang_pd.frontend.request_state import ReqState
from sglang_pd.frontend.tokenizer import TokenizerBundle
from sglang_pd.frontend.tokenizer_manager import TokenizerManager
from sglang_pd.protocol import EngineReady, GenerateReq, SamplingParams, TokenLogprob
from sglang_pd.server_args import ServerArgs

ENGINE = EngineReady(ok=True, context_length=64, vocab_size=100)


def _status(fn: Any, *args: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        fn(*args)
    return info.value


def _by_definition(text: str, stops: list[str]) -> int:
    return max((k for s in stops for k in range(1, min(len(s) - 1, len(text)) + 1)
                if text.endswith(s[:k])), default=0)


# ---------------------------------------------------------------- item 5: stop hold-back
def test_incremental_stop_holdback_equals_the_definition_on_random_streams() -> None:
    """Fed piece by piece (pieces shorter and longer than the stops, full matches, NULs),
    the automaton holds back exactly what a rescan of the whole text would."""
    rng = random.Random(0)
    for _ in range(1500):
        stops = ["".join(rng.choice("ab\0") for _ in range(rng.randint(1, 7)))
                 for _ in range(rng.randint(1, 4))]
        scanner, text = StopHoldback(stops), ""
        for _ in range(rng.randint(1, 8)):
            piece = "".join(rng.choice("ab\0") for _ in range(rng.randint(0, 10)))
            text += piece
            assert scanner.feed(piece) == _by_definition(text, stops), (text, stops)
        assert stop_holdback(text, stops) == _by_definition(text, stops)


def test_stop_holdback_of_long_stops_and_texts() -> None:
    stop = "ab" * 127 + "c"  # 255 characters, many self-overlaps
    scanner = StopHoldback([stop] * 32)
    for _ in range(300):
        held = scanner.feed("ab")
    assert held == 254  # "abab...ab" (254 characters) could still become the stop
    assert scanner.feed("x") == 0


# ---------------------------------------------------------------- item 5: logprob listings
class _CountingTok:
    def __init__(self) -> None:
        self.calls = 0

    def token_text(self, token_id: int) -> str:
        self.calls += 1
        return "t" * (token_id % 3 + 1)


def _state_with_logprobs(n: int, top: int = 0) -> ReqState:
    req = GenerateReq(rid="r", input_ids=[1], sampling_params=SamplingParams(),
                      return_logprob=True, top_logprobs_num=top)
    state = ReqState(req=req, notify=asyncio.Event())
    state.output_token_logprobs = [TokenLogprob(-0.5, t) for t in range(n)]
    state.output_top_logprobs = [[TokenLogprob(-0.5, t)] * top for t in range(n)]
    return state


def test_streamed_completion_logprobs_look_at_new_tokens_only() -> None:
    """Every streamed chunk re-decoded every earlier token (quadratic in the output)."""
    full_state = _state_with_logprobs(50)
    full = completion_logprobs(full_state, _CountingTok(), 0)  # type: ignore[arg-type]
    tok = _CountingTok()
    state = _state_with_logprobs(0)
    tokens: list[str] = []
    offsets: list[int] = []
    sent = offset = 0
    for k in range(50):  # one token per chunk
        state.output_token_logprobs.append(full_state.output_token_logprobs[k])
        chunk = completion_logprobs(state, tok, sent, offset)  # type: ignore[arg-type]
        sent = len(state.output_token_logprobs)
        offset += sum(map(len, chunk["tokens"]))
        tokens += chunk["tokens"]
        offsets += chunk["text_offset"]
    assert tokens == full["tokens"] and offsets == full["text_offset"]
    assert tok.calls == 50


def test_token_texts_are_decoded_once_per_token_id() -> None:
    class Decoder:
        calls = 0

        def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
            Decoder.calls += 1
            return f"<{ids[0]}>"

    bundle = TokenizerBundle(tokenizer=Decoder())  # type: ignore[arg-type]
    assert [bundle.token_text(t) for t in (3, 4, 3, 3, 4)] == ["<3>", "<4>", "<3>", "<3>", "<4>"]
    assert Decoder.calls == 2


# ---------------------------------------------------------------- item 5: cheap checks first
def test_token_prompt_length_is_checked_before_its_ids_are_scanned() -> None:
    ids: list[Any] = [1] * 1_000 + ["x"]  # scanning would find the "x"; the length says no first
    assert "context length is 64" in _status(check_input_ids, ids, ENGINE).message


def test_completion_prompt_lists_are_capped_before_they_are_scanned() -> None:
    error = _status(completion_prompts, ["a"] * 600)
    assert error.status == 400 and "at most 512 prompts" in error.message
    assert completion_prompts([5, 6]) == ([[5, 6]], False)  # token ids: checked later


@pytest.fixture
def ctx(tmp_path: Any) -> ServerContext:
    args = ServerArgs(model_path="m", ipc_dir=str(tmp_path), skip_tokenizer_init=True,
                      max_queued_requests=1)
    tm = TokenizerManager(args, ENGINE, None, FrontendMetrics("m-hardening"))
    return ServerContext(server_args=args, tm=tm)


def _parse(body: dict[str, Any], ctx: ServerContext) -> Any:
    return asyncio.run(parse_generate_body(body, ctx, {}))


def test_batch_of_token_lists_is_capped_before_it_is_scanned(ctx: ServerContext) -> None:
    error = _status(_parse, {"input_ids": [[1]] * 600 + [7]}, ctx)
    assert "at most 512 prompts" in error.message


def test_a_full_server_refuses_before_parsing_prompts(ctx: ServerContext) -> None:
    ctx.tm.states["busy"] = _state_with_logprobs(0)  # the one allowed request is held
    error = _status(_parse, {"input_ids": "not even valid"}, ctx)
    assert error.status == 503 and error.headers == {"Retry-After": "1"}
    assert "--max-queued-requests" in error.message


# ---------------------------------------------------------------- item 6/10: strict shapes
def test_unknown_slo_keys_are_refused() -> None:
    error = _status(make_slo, {"ttft": 100, "tpot_ms": 20}, {})
    assert error.status == 400 and "unknown slo keys: ttft" in error.message


@pytest.mark.parametrize("part", [{"type": "text", "text": {"x": 1}}, {"type": "text"},
                                  {"type": "text", "text": 5}])
def test_text_parts_need_string_text(part: dict[str, Any]) -> None:
    assert "needs a string 'text'" in _status(message_text, [part], 0).message


# ---------------------------------------------------------------- item 6/10: stream errors
def test_a_bug_while_streaming_ends_with_an_sse_error_event(caplog: pytest.LogCaptureFixture) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b"data: {}\n\n"
        raise KeyError("secret internal detail")

    async def collect() -> list[bytes]:
        return [c async for c in guarded_stream(chunks(), "/generate")]

    with caplog.at_level(logging.ERROR):
        out = asyncio.run(collect())
    assert out[0] == b"data: {}\n\n" and out[-1] == b"data: [DONE]\n\n"
    error = orjson.loads(out[1][len(b"data: "):])["error"]
    assert error["code"] == 500 and "secret" not in error["message"]
    assert "secret internal detail" in caplog.text  # the details go to the log


def test_nothing_starts_after_fail_all(ctx: ServerContext) -> None:
    """The drain's end fails what runs; a request still being parsed then must not start (it
    would be cut by uvicorn with a plain-text 500 moments later)."""
    ctx.tm.fail_all(503, "the server is shutting down (drain period over); retry elsewhere")
    error = _status(_parse, {"input_ids": [1, 2]}, ctx)
    assert error.status == 503 and "shutting down" in error.message
