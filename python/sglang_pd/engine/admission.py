"""Admission checks: why a request cannot run on this engine (a 400), or None."""

from __future__ import annotations

from dataclasses import dataclass

from sglang_pd.protocol import GenerateReq


@dataclass(frozen=True)
class Limits:
    """What this engine can hold, fixed at start."""

    context_length: int
    max_total_num_tokens: int
    vocab_size: int
    has_tokenizer: bool  # stop strings need one


def request_error(msg: GenerateReq, limits: Limits, rid_running: bool) -> str | None:
    n = len(msg.input_ids)
    if n == 0:
        return "the prompt is empty"
    if n >= limits.context_length:
        return (f"the prompt has {n} tokens; the model's context length is {limits.context_length} "
                f"tokens (the prompt must be shorter, to leave room for output)")
    if n + 1 > limits.max_total_num_tokens:
        return f"the prompt has {n} tokens; the KV pool holds only {limits.max_total_num_tokens}"
    if any(t < 0 or t >= limits.vocab_size for t in msg.input_ids):
        return f"input_ids must lie in [0, {limits.vocab_size})"
    if rid_running:
        return f"a request with rid {msg.rid!r} is already running"
    if msg.sampling_params.stop and not limits.has_tokenizer:
        return "stop strings need a tokenizer; this server runs with --skip-tokenizer-init"
    return msg.sampling_params.validate(limits.vocab_size)
