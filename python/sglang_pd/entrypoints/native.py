"""SGLang's native ``POST /generate``."""

from __future__ import annotations

import time
from typing import Any
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from starlette.responses import Response

from sglang_pd.entrypoints.context import ServerContext
from sglang_pd.entrypoints.responses import (SSE_DONE, OrjsonResponse, list_or_item,
                                             read_json_object, sse)
from sglang_pd.entrypoints.runner import RequestRun, respond
from sglang_pd.frontend.errors import ApiError, bad_request
from sglang_pd.frontend.inputs import (build_generate_req, check_batch_size, make_bootstrap,
                                       make_slo, parse_sampling_params, strict_bool, tokenize)
from sglang_pd.frontend.request_state import ReqState
from sglang_pd.frontend.tokenizer import TokenizerBundle
from sglang_pd.protocol import EngineReady, GenerateReq, TokenLogprob
from sglang_pd_router.request_class import read_class_headers

router = APIRouter()


async def _prompts(body: dict[str, Any], tokenizer: TokenizerBundle | None, engine: EngineReady
                   ) -> tuple[list[list[int]], bool]:
    """(token ids per prompt, is_batch) from exactly one of ``text`` / ``input_ids``."""
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise bad_request("exactly one of 'text' or 'input_ids' must be given")
    if text is not None:
        if tokenizer is None:
            raise bad_request("'text' needs a tokenizer but the server runs with "
                              "--skip-tokenizer-init; send 'input_ids'")
        texts = text if isinstance(text, list) else [text]
        if not texts or not all(isinstance(t, str) for t in texts):
            raise bad_request("'text' must be a string or a non-empty list of strings")
        empty = [i for i, t in enumerate(texts) if not t]
        if empty:
            raise bad_request(f"prompt {empty[0]}: the prompt is empty" if isinstance(text, list)
                              else "the prompt is empty")
        return await tokenize(tokenizer, texts, engine), isinstance(text, list)
    if not isinstance(ids, list):
        raise bad_request("'input_ids' must be a list of integers or a list of such lists")
    is_batch = bool(ids) and isinstance(ids[0], list)
    if is_batch:
        check_batch_size(len(ids))  # before scanning what may be millions of entries
        if not all(isinstance(x, list) for x in ids):
            raise bad_request("'input_ids' must be a list of integers or a list of such lists")
    return (ids if is_batch else [ids]), is_batch


async def parse_generate_body(body: dict[str, Any], ctx: ServerContext, headers: dict[str, str]
                              ) -> tuple[list[GenerateReq], bool]:
    """The /generate body -> GenerateReqs (one per prompt) and whether it was a batch."""
    stream = strict_bool(body.get("stream"), "stream")
    strict_bool(body.get("return_text_in_logprobs"), "return_text_in_logprobs")
    ctx.tm.check_room()  # a full server refuses before tokenizing
    prompts, is_batch = await _prompts(body, ctx.tm.tokenizer, ctx.engine_info)
    n = len(prompts)
    rids = body.get("rid")
    if is_batch and isinstance(rids, str):
        raise bad_request("'rid' must be a list with one id per prompt for a batch request")
    slo = make_slo(body.get("slo"), headers, ctx.default_slo)
    sent_class = read_class_headers(headers)  # the router's, if it came through ours
    arrival = time.time()
    reqs = []
    for i, ids in enumerate(prompts):
        try:
            return_logprob = strict_bool(list_or_item(body.get("return_logprob"), n, i, "return_logprob"),
                                         "return_logprob")
            top_n = list_or_item(body.get("top_logprobs_num"), n, i, "top_logprobs_num") or 0
            if isinstance(top_n, bool) or not isinstance(top_n, int):
                raise bad_request(f"top_logprobs_num must be an integer, got {top_n!r}")
            sampling = parse_sampling_params(
                list_or_item(body.get("sampling_params"), n, i, "sampling_params"))
            bootstrap = make_bootstrap(
                list_or_item(body.get("bootstrap_host"), n, i, "bootstrap_host"),
                list_or_item(body.get("bootstrap_port"), n, i, "bootstrap_port"),
                list_or_item(body.get("bootstrap_room"), n, i, "bootstrap_room"),
                ctx.server_args.disaggregation_bootstrap_port)
            reqs.append(build_generate_req(
                input_ids=ids, sampling=sampling, engine=ctx.engine_info,
                rid=list_or_item(rids, n, i, "rid"), stream=stream,
                return_logprob=return_logprob, top_logprobs_num=top_n, slo=slo,
                bootstrap=bootstrap, arrival_time=arrival,
                request_class=ctx.tm.request_class(len(ids), sent_class)))
        except ApiError as e:
            if is_batch:
                e.message = f"prompt {i}: {e.message}"
            raise
    return reqs, is_batch


def _logprob_triples(items: list[TokenLogprob], state: ReqState, ctx: ServerContext
                     ) -> list[list[Any]]:
    tok = ctx.tm.tokenizer
    with_text = state.return_text_in_logprobs and tok is not None
    return [[lp.logprob, lp.token_id, tok.token_text(lp.token_id) if with_text and tok is not None else None]
            for lp in items]


def generate_result(state: ReqState, ctx: ServerContext) -> dict[str, Any]:
    """Cumulative output of one request in SGLang's /generate shape."""
    meta: dict[str, Any] = {
        "id": state.rid,
        "finish_reason": state.finish_reason,
        "prompt_tokens": state.prompt_tokens,
        "completion_tokens": state.completion_tokens,
        "cached_tokens": state.cached_tokens,
        "e2e_latency": state.e2e_latency,
    }
    if state.req.return_logprob:
        meta["output_token_logprobs"] = _logprob_triples(state.output_token_logprobs, state, ctx)
        meta["output_top_logprobs"] = [_logprob_triples(top, state, ctx)
                                       for top in state.output_top_logprobs]
    out: dict[str, Any] = {}
    if state.text is not None:
        out["text"] = state.visible_text
    out["output_ids"] = state.output_ids  # serialized right away; no copy needed
    out["meta_info"] = meta
    return out


async def _chunks(run: RequestRun, ctx: ServerContext, is_batch: bool) -> AsyncIterator[bytes]:
    async for index, state in run.updates():
        if state.finished and state.error_status:
            yield sse(ApiError(state.error_status, state.error_message).body())
            continue
        chunk = generate_result(state, ctx)
        if is_batch:
            chunk["index"] = index
        yield sse(chunk)
    yield SSE_DONE


@router.post("/generate")
async def generate(request: Request) -> Response:
    ctx: ServerContext = request.app.state.ctx
    body = await read_json_object(request)
    reqs, is_batch = await parse_generate_body(body, ctx, dict(request.headers))

    def on_done(run: RequestRun) -> Response:
        results = [generate_result(s, ctx) for s in run.states]
        return OrjsonResponse(results if is_batch else results[0])

    return await respond(request, ctx.tm, reqs, reqs[0].stream, on_done,
                         lambda run: _chunks(run, ctx, is_batch),
                         return_text_in_logprobs=strict_bool(body.get("return_text_in_logprobs"),
                                                             "return_text_in_logprobs"))
