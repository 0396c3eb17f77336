"""Logprobs in the two OpenAI shapes (legacy completions and chat), from the engine's lists."""

from __future__ import annotations

import itertools
from typing import Any

from sglang_pd.frontend.request_state import ReqState
from sglang_pd.frontend.tokenizer import TokenizerBundle


def completion_logprobs(state: ReqState, tok: TokenizerBundle, start: int,
                        start_offset: int = 0) -> dict[str, Any]:
    """``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`` for tokens[start:].

    ``start_offset`` is the text offset of token ``start``: a stream carries it from chunk
    to chunk, so no update looks at the tokens it sent before (that was quadratic).
    """
    items = state.output_token_logprobs[start:]
    texts = [tok.token_text(lp.token_id) for lp in items]
    offsets = list(itertools.accumulate(map(len, texts), initial=start_offset))[: len(texts)]
    tops: list[dict[str, float] | None] = []
    for k in range(start, start + len(items)):
        if state.req.top_logprobs_num and k < len(state.output_top_logprobs):
            tops.append({tok.token_text(t.token_id): t.logprob
                         for t in state.output_top_logprobs[k]})
        else:
            tops.append(None)
    return {"tokens": texts,
            "token_logprobs": [lp.logprob for lp in items],
            "top_logprobs": tops if state.req.top_logprobs_num else None,
            "text_offset": offsets}


def _entry(tok: TokenizerBundle, token_id: int, logprob: float) -> dict[str, Any]:
    text = tok.token_text(token_id)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(state: ReqState, tok: TokenizerBundle, start: int) -> dict[str, Any]:
    """``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}, ...]}``."""
    content = []
    for k in range(start, len(state.output_token_logprobs)):
        lp = state.output_token_logprobs[k]
        entry = _entry(tok, lp.token_id, lp.logprob)
        tops = state.output_top_logprobs[k] if k < len(state.output_top_logprobs) else []
        entry["top_logprobs"] = [_entry(tok, t.token_id, t.logprob) for t in tops]
        content.append(entry)
    return {"content": content}
