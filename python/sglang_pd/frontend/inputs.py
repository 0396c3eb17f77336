"""Turning parsed HTTP inputs into validated ``GenerateReq`` messages.

Every check the frontend can make without the engine happens here, so bad requests get a
400 naming the problem and never reach the engine.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from typing import Any

import msgspec

from sglang_pd.disaggregation.addr import validate_bootstrap_addr
from sglang_pd.frontend.errors import ApiError, bad_request
from sglang_pd.frontend.limits import MAX_BATCH_PROMPTS, MAX_CHARS_PER_TOKEN, MAX_TOP_LOGPROBS
from sglang_pd.frontend.tokenizer import TokenizerBundle
from sglang_pd.protocol import BootstrapInfo, EngineReady, GenerateReq, SamplingParams, SloSpec

_SAMPLING_FIELDS = frozenset(SamplingParams.__struct_fields__)
# SGLang sampling keys we accept as long as they are unset/empty (clients send them as null).
_UNSUPPORTED_WHEN_SET = frozenset({
    "json_schema", "regex", "ebnf", "structural_tag", "logit_bias", "custom_params",
    "stop_regex", "lora_path", "dry_multiplier", "dry_base", "dry_allowed_length",
    "dry_sequence_breakers",
})
# SGLang sampling keys that are harmless to ignore whatever their value.
_IGNORED = frozenset({"stream_interval", "no_repeat_ngram_size"})


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
    """SGLang's ``sampling_params`` dict -> SamplingParams (unknown keys are named in a 400)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise bad_request(f"sampling_params must be an object, got {type(raw).__name__}")
    unknown = sorted(k for k in raw if k not in _SAMPLING_FIELDS and k not in
                     _UNSUPPORTED_WHEN_SET and k not in _IGNORED and k != "sampling_seed")
    if unknown:
        raise bad_request(f"unknown sampling_params keys: {', '.join(unknown)}")
    unsupported = sorted(k for k in raw if k in _UNSUPPORTED_WHEN_SET and raw[k] not in
                         (None, "", [], {}))
    if unsupported:
        raise bad_request(f"sampling_params not supported by this server: {', '.join(unsupported)}")
    clean = {k: v for k, v in raw.items() if k in _SAMPLING_FIELDS and v is not None}
    if raw.get("sampling_seed") is not None and "seed" not in clean:
        clean["seed"] = raw["sampling_seed"]  # SGLang's name for the per-request seed
    if isinstance(clean.get("stop"), str):
        clean["stop"] = [clean["stop"]]
    try:
        return msgspec.convert(clean, SamplingParams)
    except msgspec.ValidationError as e:
        raise bad_request(f"invalid sampling_params: {e}") from None


def make_slo(body_slo: Any, headers: dict[str, str]) -> SloSpec | None:
    """``slo`` from the body, or the x-slo-ttft-ms / x-slo-tpot-ms headers."""
    values: dict[str, Any] = {}
    for key, header in (("ttft_ms", "x-slo-ttft-ms"), ("tpot_ms", "x-slo-tpot-ms")):
        if header in headers:
            try:
                values[key] = float(headers[header])
            except ValueError:
                raise bad_request(f"header {header} must be a number, got {headers[header]!r}") from None
    if body_slo is not None:
        if not isinstance(body_slo, dict):
            raise bad_request("slo must be an object like {\"ttft_ms\": 500, \"tpot_ms\": 50}")
        unknown = sorted(str(k) for k in body_slo if k not in SloSpec.__struct_fields__)
        if unknown:  # a misspelt target must not silently fall back to the default
            raise bad_request(f"unknown slo keys: {', '.join(unknown)} (allowed: ttft_ms, tpot_ms)")
        values.update({k: v for k, v in body_slo.items() if v is not None})
    if not values:
        return None
    try:
        slo = msgspec.convert(values, SloSpec, strict=False)
    except msgspec.ValidationError as e:
        raise bad_request(f"invalid slo: {e}") from None
    for name in ("ttft_ms", "tpot_ms"):
        value = getattr(slo, name)
        if value is not None and not (value > 0 and math.isfinite(value)):  # NaN fails too
            raise bad_request(f"slo.{name} must be a positive finite number of ms, got {value}")
    return slo


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
                       slo: SloSpec | None = None, bootstrap: BootstrapInfo | None = None,
                       arrival_time: float = 0.0) -> GenerateReq:
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
                       arrival_time=arrival_time, slo=slo, bootstrap=bootstrap)
