"""OpenAI-compatible routes: /v1/completions, /v1/chat/completions, /v1/models."""

from __future__ import annotations

import time
from typing import Any
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from starlette.responses import Response

from sglang_pd.entrypoints.context import ServerContext
from sglang_pd.entrypoints.openai_protocol import (ChatCompletionRequest, CompletionRequest,
                                                   check_supported, completion_prompts,
                                                   message_text, parse_body, to_sampling_params)
from sglang_pd.entrypoints.openai_logprobs import chat_logprobs, completion_logprobs
from sglang_pd.entrypoints.responses import (SSE_DONE, OrjsonResponse, list_or_item,
                                             read_json_object, sse)
from sglang_pd.entrypoints.runner import RequestRun, respond
from sglang_pd.frontend.chat_template import ChatTemplateError
from sglang_pd.frontend.errors import ApiError, bad_request
from sglang_pd.frontend.inputs import (build_generate_req, check_batch_size, make_bootstrap,
                                       make_slo, tokenize)
from sglang_pd.frontend.request_state import ReqState
from sglang_pd.frontend.tokenizer import TokenizerBundle
from sglang_pd.protocol import GenerateReq
from sglang_pd_router.request_class import read_class_headers

router = APIRouter()


def _tokenizer(ctx: ServerContext) -> TokenizerBundle:
    if ctx.tm.tokenizer is None:
        raise bad_request("the OpenAI API needs a tokenizer but the server runs with "
                          "--skip-tokenizer-init; use /generate with input_ids")
    return ctx.tm.tokenizer


def finish_reason(state: ReqState) -> str | None:
    reason = state.finish_reason
    return None if reason is None else str(reason.get("type"))


def matched_stop(state: ReqState) -> Any:
    return (state.finish_reason or {}).get("matched")


def usage(states: list[ReqState]) -> dict[str, Any]:
    prompt = sum(s.prompt_tokens for s in states)
    completion = sum(s.completion_tokens for s in states)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(s.cached_tokens for s in states)}}


def _make_reqs(req: CompletionRequest | ChatCompletionRequest, prompts: list[list[int]],
               max_tokens: int | None, ctx: ServerContext, request: Request, top_n: int,
               return_logprob: bool) -> list[GenerateReq]:
    n = len(prompts)
    headers = dict(request.headers)
    slo = make_slo(req.slo, headers, ctx.default_slo)
    sent_class = read_class_headers(headers)  # the router's, if it came through ours
    arrival = time.time()
    reqs = []
    for i, ids in enumerate(prompts):
        budget = max_tokens
        if budget is None:  # "as many as fit": build_generate_req clamps to the context
            budget = ctx.engine_info.context_length or None
        bootstrap = make_bootstrap(list_or_item(req.bootstrap_host, n, i, "bootstrap_host"),
                                   list_or_item(req.bootstrap_port, n, i, "bootstrap_port"),
                                   list_or_item(req.bootstrap_room, n, i, "bootstrap_room"),
                                   ctx.server_args.disaggregation_bootstrap_port)
        reqs.append(build_generate_req(
            input_ids=ids, sampling=to_sampling_params(req, budget), engine=ctx.engine_info,
            rid=list_or_item(req.rid, n, i, "rid"), stream=req.stream,
            return_logprob=return_logprob, top_logprobs_num=top_n, slo=slo,
            bootstrap=bootstrap, arrival_time=arrival,
            request_class=ctx.tm.request_class(len(ids), sent_class)))
    return reqs


# ---------------------------------------------------------------- /v1/completions
@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    ctx: ServerContext = request.app.state.ctx
    tok = _tokenizer(ctx)
    req = parse_body(await read_json_object(request), CompletionRequest)
    check_supported(req)
    raw_prompts, _ = completion_prompts(req.prompt)
    check_batch_size(len(raw_prompts))
    ctx.tm.check_room(len(raw_prompts))  # a full server refuses before tokenizing
    texts = [p for p in raw_prompts if isinstance(p, str)]
    encoded = iter(await tokenize(tok, texts, ctx.engine_info) if texts else [])
    prompts = [next(encoded) if isinstance(p, str) else p for p in raw_prompts]
    reqs = _make_reqs(req, prompts, req.max_tokens, ctx, request, req.logprobs or 0,
                      req.logprobs is not None)
    created, model = int(time.time()), req.model or ctx.model_name

    def choice(i: int, s: ReqState, text: str, logprobs: Any, final: bool) -> dict[str, Any]:
        return {"index": i, "text": text, "logprobs": logprobs,
                "finish_reason": finish_reason(s) if final else None,
                "matched_stop": matched_stop(s) if final else None}

    def on_done(run: RequestRun) -> Response:
        choices = [choice(i, s, s.visible_text, completion_logprobs(s, tok, 0)
                          if req.logprobs is not None else None, True)
                   for i, s in enumerate(run.states)]
        return OrjsonResponse({"id": run.states[0].rid, "object": "text_completion",
                               "created": created, "model": model, "choices": choices,
                               "usage": usage(run.states)})

    async def chunks(run: RequestRun) -> AsyncIterator[bytes]:
        sent = [0] * len(run.states)
        sent_lp = [0] * len(run.states)
        sent_offset = [0] * len(run.states)  # text_offset of the next logprob token
        base = {"id": run.states[0].rid, "object": "text_completion", "created": created,
                "model": model}
        async for i, s in run.updates():
            if s.finished and s.error_status:
                yield sse(ApiError(s.error_status, s.error_message).body())
                continue
            text = s.visible_text
            delta, sent[i] = text[sent[i]:], len(text)
            logprobs = None
            if req.logprobs is not None:
                logprobs = completion_logprobs(s, tok, sent_lp[i], sent_offset[i])
                sent_lp[i] = len(s.output_token_logprobs)
                sent_offset[i] += sum(map(len, logprobs["tokens"]))
            if delta or s.finished or logprobs:
                yield sse({**base, "choices": [choice(i, s, delta, logprobs, s.finished)]})
        if req.include_usage:
            yield sse({**base, "choices": [], "usage": usage(run.states)})
        yield SSE_DONE

    return await respond(request, ctx.tm, reqs, req.stream, on_done, chunks)


# ---------------------------------------------------------------- /v1/chat/completions
async def render_chat(req: ChatCompletionRequest, tok: TokenizerBundle, ctx: ServerContext) -> list[int]:
    if not req.messages:
        raise bad_request("messages must not be empty")
    messages = []
    for i, m in enumerate(req.messages):
        if not isinstance(m.get("role"), str):
            raise bad_request(f"messages[{i}] needs a string 'role'")
        messages.append({**m, "content": message_text(m.get("content"), i)})
    kwargs = dict(req.chat_template_kwargs or {})
    try:
        prompt = tok.apply_chat_template(
            messages, add_generation_prompt=not req.continue_final_message,
            tools=req.tools, **kwargs)
    except (ChatTemplateError, ValueError) as e:
        raise bad_request(str(e)) from None
    if req.continue_final_message:
        # Drop the end-of-turn marker after the last message so the model continues it.
        last = messages[-1].get("content") or ""
        cut = prompt.rfind(last)
        prompt = prompt[: cut + len(last)] if last and cut >= 0 else prompt
    # the template has BOS etc.; long prompts are tokenized off the event loop
    return (await tokenize(tok, [prompt], ctx.engine_info, add_special_tokens=False))[0]


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    ctx: ServerContext = request.app.state.ctx
    tok = _tokenizer(ctx)
    req = parse_body(await read_json_object(request), ChatCompletionRequest)
    check_supported(req)
    ctx.tm.check_room()  # a full server refuses before rendering and tokenizing
    ids = await render_chat(req, tok, ctx)
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None \
        else req.max_tokens
    top_n = (req.top_logprobs or 0) if req.logprobs else 0
    reqs = _make_reqs(req, [ids], max_tokens, ctx, request, top_n, req.logprobs)
    created, model = int(time.time()), req.model or ctx.model_name
    base = {"id": reqs[0].rid, "created": created, "model": model}

    def on_done(run: RequestRun) -> Response:
        s = run.states[0]
        message = {"role": "assistant", "content": s.visible_text, "reasoning_content": None,
                   "tool_calls": None}
        choice = {"index": 0, "message": message,
                  "logprobs": chat_logprobs(s, tok, 0) if req.logprobs else None,
                  "finish_reason": finish_reason(s), "matched_stop": matched_stop(s)}
        return OrjsonResponse({**base, "object": "chat.completion", "choices": [choice],
                               "usage": usage(run.states)})

    async def chunks(run: RequestRun) -> AsyncIterator[bytes]:
        head = {**base, "object": "chat.completion.chunk"}
        yield sse({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                        "logprobs": None, "finish_reason": None}]})
        sent = sent_lp = 0
        async for _, s in run.updates():
            if s.finished and s.error_status:
                yield sse(ApiError(s.error_status, s.error_message).body())
                continue
            text = s.visible_text
            delta, sent = text[sent:], len(text)
            logprobs = None
            if req.logprobs:
                logprobs = chat_logprobs(s, tok, sent_lp)
                sent_lp = len(s.output_token_logprobs)
            if delta or logprobs:
                yield sse({**head, "choices": [{"index": 0, "delta": {"content": delta},
                                                "logprobs": logprobs, "finish_reason": None}]})
            if s.finished:
                yield sse({**head, "choices": [{"index": 0, "delta": {}, "logprobs": None,
                                                "finish_reason": finish_reason(s),
                                                "matched_stop": matched_stop(s)}]})
        if req.include_usage:
            yield sse({**head, "choices": [], "usage": usage(run.states)})
        yield SSE_DONE

    return await respond(request, ctx.tm, reqs, req.stream, on_done, chunks)


# ---------------------------------------------------------------- /v1/models
@router.get("/v1/models")
async def models(request: Request) -> Response:
    ctx: ServerContext = request.app.state.ctx
    card = {"id": ctx.model_name, "object": "model", "created": int(ctx.started_at),
            "owned_by": "sglang-pd", "root": ctx.server_args.model_path,
            "max_model_len": ctx.engine_info.context_length or None}
    return OrjsonResponse({"object": "list", "data": [card]})
