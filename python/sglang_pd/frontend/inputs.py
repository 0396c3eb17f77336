"""Turning parsed HTTP inputs into validated ``GenerateReq`` messages.

Every check the frontend can make without the engine happens here, so bad requests get a
400 naming the problem and never reach the engine.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from typing import Any

import msgspec

from sglang_pd import request_params
from sglang_pd.disaggregation.addr import validate_bootstrap_addr
from sglang_pd.frontend.errors import ApiError, bad_request
from sglang_pd.frontend.limits import MAX_BATCH_PROMPTS, MAX_CHARS_PER_TOKEN, MAX_TOP_LOGPROBS
from sglang_pd.frontend.tokenizer import TokenizerBundle
from sglang_pd.protocol import BootstrapInfo, EngineReady, GenerateReq, SamplingParams, Slo

# below this many characters tokenizing inline is cheaper than a thread hop
INLINE_TOKENIZE_CHARS = 8192


def new_rid() -> str:
    return uuid.uuid4().hex


def strict_bool(value: Any, name: str, default: bool = False) -> bool:
    """JSON true/false (or absent): "false" or 1 are refused rather than read as truthy."""
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    raise bad_request(f"{name} must be true or false, got {value!r}")


def check_batch_size(n: int) -> None:
    if n > MAX_BATCH_PROMPTS:
        raise bad_request(f"a request may carry at most {MAX_BATCH_PROMPTS} prompts, got {n}")


async def tokenize(tokenizer: TokenizerBundle, texts: list[str], engine: EngineReady,
                   add_special_tokens: bool = True) -> list[list[int]]:
    """Token ids of ``texts``. A text longer than any prompt that fits the context is refused
    by its length first; big texts are tokenized off the event loop (/health stays live)."""
    check_batch_size(len(texts))
    if engine.context_length:
        limit = engine.context_length * MAX_CHARS_PER_TOKEN
        for i, text in enumerate(texts):
            if len(text) > limit:
                which = f"prompt {i}" if len(texts) > 1 else "the prompt"
                raise bad_request(f"{which} has {len(text)} characters; no prompt over {limit} "
                                  f"characters fits the model's context of {engine.context_length} tokens")
    if sum(map(len, texts)) <= INLINE_TOKENIZE_CHARS:
        return tokenizer.encode_batch(texts, add_special_tokens)
    return await asyncio.to_thread(tokenizer.encode_batch, texts, add_special_tokens)


def parse_sampling_params(raw: Any) -> SamplingParams:
    """SGLang's ``sampling_params`` dict -> SamplingParams (``request_params``; problems are 400s)."""
    try:
        return request_params.parse_sampling_params(raw)
    except ValueError as e:
        raise bad_request(str(e)) from None


def make_slo(body_slo: Any, headers: Mapping[str, str], default: Slo | None = None) -> Slo | None:
    """The request's SLO, resolved once (``request_params.parse_slo``: body, headers, then
    ``default``, the server's ``--slo-*-ms``); problems are 400s."""
    try:
        return request_params.parse_slo(body_slo, headers, default)
    except ValueError as e:
        raise bad_request(str(e)) from None


def make_bootstrap(host: Any, port: Any, room: Any, default_port: int) -> BootstrapInfo | None:
    """SGLang's PD fields for one request (None when the request carries none)."""
    if host is None and room is None:
        return None
    if host is None or room is None:
        raise bad_request("bootstrap_host and bootstrap_room must be given together")
    if not isinstance(host, str) or not host:
        raise bad_request(f"bootstrap_host must be a non-empty string, got {host!r}")
    for name, value in (("bootstrap_port", port), ("bootstrap_room", room)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise bad_request(f"{name} must be an integer, got {value!r}")
    port = default_port if port is None else port
    problem = validate_bootstrap_addr(host, port)
    if problem:
        raise bad_request(problem)
    if not 0 <= room < 2**63:
        raise bad_request(f"bootstrap_room must be a 63-bit non-negative integer, got {room}")
    return BootstrapInfo(host=host, port=port, room=room)


def check_input_ids(ids: Any, engine: EngineReady) -> list[int]:
    if not isinstance(ids, list):
        raise bad_request("input_ids must be a list of integers")
    if not ids:
        raise bad_request("the prompt is empty (0 tokens)")
    # the length first: scanning millions of ids (a 16 MiB body) would block the event loop
    if engine.context_length and len(ids) >= engine.context_length:
        raise bad_request(f"the prompt has {len(ids)} tokens but the model's context length is "
                          f"{engine.context_length} tokens (the prompt must be shorter)")
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise bad_request("input_ids must be a list of integers")
    if engine.vocab_size:
        bad = [t for t in ids if not 0 <= t < engine.vocab_size]
        if bad:
            shown = ", ".join(map(str, bad[:8])) + (", ..." if len(bad) > 8 else "")
            raise bad_request(f"input_ids contain token ids outside the vocabulary "
                              f"[0, {engine.vocab_size}): {shown}")
    return ids


def build_generate_req(*, input_ids: list[int], sampling: SamplingParams, engine: EngineReady,
                       rid: str | None = None, stream: bool = False,
                       return_logprob: bool = False, top_logprobs_num: int = 0,
                       slo: Slo | None = None, bootstrap: BootstrapInfo | None = None,
                       arrival_time: float = 0.0, request_class: str = "") -> GenerateReq:
    check_input_ids(input_ids, engine)
    problem = sampling.validate(engine.vocab_size or None)
    if problem:
        raise bad_request(problem)
    if not 0 <= top_logprobs_num <= MAX_TOP_LOGPROBS:
        raise bad_request(f"top_logprobs_num must be in [0, {MAX_TOP_LOGPROBS}], got {top_logprobs_num}")
    if engine.context_length:
        # Never ask for more tokens than fit; the engine then reports finish_reason "length".
        room = engine.context_length - len(input_ids)
        if sampling.max_new_tokens > room:
            sampling = msgspec.structs.replace(sampling, max_new_tokens=room,
                                               min_new_tokens=min(sampling.min_new_tokens, room))
    if rid is not None and (not isinstance(rid, str) or not rid):
        raise ApiError(400, f"rid must be a non-empty string, got {rid!r}")
    return GenerateReq(rid=rid or new_rid(), input_ids=input_ids, sampling_params=sampling,
                       stream=stream, return_logprob=return_logprob,
                       top_logprobs_num=top_logprobs_num if return_logprob else 0,
                       arrival_time=arrival_time, slo=slo, bootstrap=bootstrap,
                       request_class=request_class)
