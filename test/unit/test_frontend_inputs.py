"""Request parsing and validation: every bad input gives a 400 naming the problem."""

from __future__ import annotations

import asyncio

from typing import Any

import pytest

from sglang_pd.entrypoints.context import ServerContext
from sglang_pd.entrypoints.native import parse_generate_body as _parse_generate_body
from sglang_pd.entrypoints.openai_protocol import (ChatCompletionRequest, CompletionRequest,
                                                   check_supported, completion_prompts,
                                                   message_text, parse_body, to_sampling_params)
from sglang_pd.frontend.errors import ApiError
from sglang_pd.frontend.inputs import (build_generate_req, make_bootstrap, make_slo,
                                       parse_sampling_params)
from sglang_pd.frontend.metrics import FrontendMetrics
from sglang_pd.frontend.tokenizer_manager import TokenizerManager
from sglang_pd.protocol import EngineReady, SamplingParams, Slo
from sglang_pd.server_args import ServerArgs

ENGINE = EngineReady(ok=True, context_length=64, vocab_size=100)


@pytest.fixture
def ctx(tmp_path: Any) -> ServerContext:
    args = ServerArgs(model_path="m", ipc_dir=str(tmp_path), skip_tokenizer_init=True)
    tm = TokenizerManager(args, ENGINE, None, FrontendMetrics("m-test"))
    return ServerContext(server_args=args, tm=tm)


def parse_generate_body(body: dict, ctx: Any, headers: dict) -> Any:
    return asyncio.run(_parse_generate_body(body, ctx, headers))


def _error(fn: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(ApiError) as info:
        fn(*args, **kwargs)
    assert info.value.status == 400
    assert info.value.body()["error"]["type"] == "BadRequestError"
    return info.value.message


def test_sampling_params_defaults_and_aliases() -> None:
    sp = parse_sampling_params({"max_new_tokens": 5, "stop": "x", "sampling_seed": 3,
                                "regex": None, "stream_interval": 2, "temperature": 0})
    assert sp.max_new_tokens == 5 and sp.stop == ["x"] and sp.seed == 3
    assert sp.temperature == 0.0 and parse_sampling_params(None) == SamplingParams()


def test_sampling_params_errors() -> None:
    assert "unknown sampling_params keys: bogus, foo" in _error(
        parse_sampling_params, {"foo": 1, "bogus": 2, "top_p": 0.5})
    assert "regex" in _error(parse_sampling_params, {"regex": "a+"})
    msg = _error(parse_sampling_params, {"max_new_tokens": "ten"})
    assert "max_new_tokens" in msg and "int" in msg
    assert "must be an object" in _error(parse_sampling_params, [1])


def test_build_generate_req_validation() -> None:
    sp = SamplingParams(max_new_tokens=4)
    assert "empty" in _error(build_generate_req, input_ids=[], sampling=sp, engine=ENGINE)
    msg = _error(build_generate_req, input_ids=[1, 100, -1], sampling=sp, engine=ENGINE)
    assert "outside the vocabulary [0, 100)" in msg and "100" in msg and "-1" in msg
    msg = _error(build_generate_req, input_ids=[1] * 70, sampling=sp, engine=ENGINE)
    assert "70" in msg and "64" in msg
    assert "max_new_tokens must be >= 0" in _error(
        build_generate_req, input_ids=[1], sampling=SamplingParams(max_new_tokens=-1),
        engine=ENGINE)
    assert "top_p" in _error(build_generate_req, input_ids=[1],
                             sampling=SamplingParams(top_p=1.5), engine=ENGINE)
    assert "stop_token_ids" in _error(build_generate_req, input_ids=[1],
                                      sampling=SamplingParams(stop_token_ids=[500]),
                                      engine=ENGINE)
    assert "list of integers" in _error(build_generate_req, input_ids=[1, "2"], sampling=sp,
                                        engine=ENGINE)


def test_build_generate_req_clamps_to_context_and_makes_rid() -> None:
    req = build_generate_req(input_ids=[1] * 60, sampling=SamplingParams(max_new_tokens=100),
                             engine=ENGINE)
    assert req.sampling_params.max_new_tokens == 4
    assert len(req.rid) == 32
    assert build_generate_req(input_ids=[1], sampling=SamplingParams(), engine=ENGINE,
                              rid="abc").rid == "abc"


def test_slo_from_body_and_headers() -> None:
    assert make_slo(None, {}) is None
    slo = make_slo({"ttft_ms": 200}, {"x-slo-tpot-ms": "20"})
    assert slo is not None and slo.ttft_s == 0.2 and slo.tpot_s == 0.02
    assert make_slo({"ttft_ms": 200}, {}, Slo(1.0, 0.05)) == Slo(0.2, 0.05)  # server default per field
    assert "x-slo-ttft-ms" in _error(make_slo, None, {"x-slo-ttft-ms": "soon"})
    assert "slo.tpot_ms must be a positive" in _error(make_slo, {"tpot_ms": 0}, {})
    assert "positive finite" in _error(make_slo, None, {"x-slo-ttft-ms": "nan"})  # NaN passed "<= 0"
    assert "positive finite" in _error(make_slo, {"ttft_ms": float("inf")}, {})


def test_bootstrap_fields() -> None:
    assert make_bootstrap(None, None, None, 8998) is None
    info = make_bootstrap("10.0.0.1", None, 7, 8998)
    assert info is not None and (info.host, info.port, info.room) == ("10.0.0.1", 8998, 7)
    assert "together" in _error(make_bootstrap, "h", 1, None, 8998)
    assert "bootstrap_room must be an integer" in _error(make_bootstrap, "h", 1, "x", 8998)


def test_generate_body_single_and_batch(ctx: ServerContext) -> None:
    reqs, batch = parse_generate_body(
        {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 3}, "rid": "r1",
         "model": "ignored", "return_text_in_logprobs": True, "log_metrics": True,
         "bootstrap_host": "h", "bootstrap_room": 5, "slo": {"ttft_ms": 100}}, ctx, {})
    assert not batch and reqs[0].rid == "r1" and reqs[0].bootstrap is not None
    assert reqs[0].slo is not None and reqs[0].slo.ttft_s == 0.1
    reqs, batch = parse_generate_body(
        {"input_ids": [[1], [2, 3]], "rid": ["a", "b"], "bootstrap_host": ["h1", "h2"],
         "bootstrap_room": [1, 2], "sampling_params": [{"max_new_tokens": 1}, {}],
         "return_logprob": [True, False]}, ctx, {})
    assert batch and [r.rid for r in reqs] == ["a", "b"]
    assert [r.bootstrap.room for r in reqs if r.bootstrap] == [1, 2]
    assert reqs[0].return_logprob and not reqs[1].return_logprob


def test_router_class_used_when_its_count_matches_else_ours_and_counted(ctx: ServerContext) -> None:
    """request_class.py: the router's class headers are used when its token count is ours (its
    threshold may differ); a different count is counted and our own count classifies; without
    headers (SGLang's routers) the server classifies by itself; bad headers are ignored."""
    body = {"input_ids": list(range(10)), "sampling_params": {"max_new_tokens": 1}}
    def mismatches() -> float:
        return ctx.tm.metrics.class_mismatch._value.get()

    assert ctx.tm.class_threshold() == 256  # the one default (request_class.SHORT_PREFILL_THRESHOLD)

    def cls(headers: dict) -> str:
        return parse_generate_body(body, ctx, headers)[0][0].request_class

    assert cls({}) == "short"  # 10 tokens <= 256: ours
    assert cls({"x-sglang-pd-class": "long", "x-sglang-pd-class-tokens": "10"}) == "long"  # the router's
    assert mismatches() == 0
    assert cls({"x-sglang-pd-class": "long", "x-sglang-pd-class-tokens": "9"}) == "short"  # ours wins
    assert mismatches() == 1
    assert cls({"x-sglang-pd-class": "medium", "x-sglang-pd-class-tokens": "10"}) == "short"  # ignored
    assert mismatches() == 1


def test_generate_body_errors(ctx: ServerContext) -> None:
    assert "exactly one of 'text' or 'input_ids'" in _error(parse_generate_body, {}, ctx, {})
    assert "exactly one" in _error(parse_generate_body, {"text": "a", "input_ids": [1]}, ctx, {})
    assert "--skip-tokenizer-init" in _error(parse_generate_body, {"text": "a"}, ctx, {})
    assert "rid has 1 entries but there are 2 prompts" in _error(
        parse_generate_body, {"input_ids": [[1], [2]], "rid": ["a"]}, ctx, {})
    assert _error(parse_generate_body, {"input_ids": [[1], []]}, ctx, {}).startswith("prompt 1:")
    assert "stream must be true or false" in _error(
        parse_generate_body, {"input_ids": [1], "stream": "yes"}, ctx, {})


def test_openai_bodies() -> None:
    req = parse_body({"prompt": "hi", "max_tokens": 3, "stop": "x", "extra_field": 1,
                      "bootstrap_room": 3}, CompletionRequest)
    sp = to_sampling_params(req, req.max_tokens)
    assert sp.max_new_tokens == 3 and sp.stop == ["x"] and sp.temperature == 1.0
    assert "max_tokens" in _error(parse_body, {"prompt": "a", "max_tokens": "x"},
                                  CompletionRequest)
    assert "messages" in _error(parse_body, {"model": "m"}, ChatCompletionRequest)
    assert "n must be 1" in _error(check_supported, parse_body({"prompt": "a", "n": 2},
                                                               CompletionRequest))
    assert "echo" in _error(check_supported, parse_body({"prompt": "a", "echo": True},
                                                        CompletionRequest))
    chat = parse_body({"messages": [], "response_format": {"type": "json_object"}},
                      ChatCompletionRequest)
    assert "response_format" in _error(check_supported, chat)


def test_completion_prompts_and_message_text() -> None:
    assert completion_prompts("a") == (["a"], False)
    assert completion_prompts([1, 2]) == ([[1, 2]], False)
    assert completion_prompts(["a", "b"]) == (["a", "b"], True)
    assert completion_prompts([[1], [2]]) == ([[1], [2]], True)
    assert "empty" in _error(completion_prompts, "")
    assert "prompt must be" in _error(completion_prompts, {"x": 1})
    assert message_text([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], 0) == "a\nb"
    assert "image_url" in _error(message_text, [{"type": "image_url"}], 2)


def test_strict_booleans_and_limits(ctx: ServerContext) -> None:
    """Issue 22 items 4, 5 and 10: truthy strings were read as true; no caps existed."""
    assert "return_logprob must be true or false" in _error(
        parse_generate_body, {"input_ids": [1], "return_logprob": "yes"}, ctx, {})
    assert "top_logprobs_num must be in [0, 20]" in _error(
        parse_generate_body, {"input_ids": [1], "return_logprob": True, "top_logprobs_num": 7000}, ctx, {})
    assert "at most 512 prompts" in _error(parse_generate_body, {"input_ids": [[1]] * 513}, ctx, {})
    assert "at most 32 stop strings" in _error(
        parse_generate_body, {"input_ids": [1], "sampling_params": {"stop": ["ab"] * 33}}, ctx, {})
    assert "at most 256 characters" in _error(
        parse_generate_body, {"input_ids": [1], "sampling_params": {"stop": ["x" * 257]}}, ctx, {})
    assert "not a valid hostname" in _error(
        parse_generate_body, {"input_ids": [1], "bootstrap_host": "x y", "bootstrap_room": 1}, ctx, {})
    assert "63-bit" in _error(
        parse_generate_body, {"input_ids": [1], "bootstrap_host": "h", "bootstrap_room": -1}, ctx, {})


def test_tiny_temperature_and_top_p_run_greedy() -> None:
    """Issue 22 item 10: 1e-38 underflowed in float32 and sampled token 0."""
    assert SamplingParams(temperature=1e-38).is_greedy and SamplingParams(top_p=1e-38).is_greedy
    assert not SamplingParams(temperature=0.7, top_p=0.9).is_greedy
