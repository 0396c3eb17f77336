"""What the fake server (fake_worker.py) answers: bodies only, no I/O.

Two shapes. ``pd_event`` is the router tests' PD worker answer (our ``/generate`` shape with
the bootstrap room as id and who served it). ``api_event`` / ``api_whole`` are a serving
benchmark's view of a real server: SGLang's ``/generate`` and OpenAI's completions and chat,
streamed or whole, with usage. ``greedy_event`` is a "greedy model" whose every token is a
function of the sequence before it, so a resumed request continues exactly.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

ROUTE_KINDS = {"/generate": "generate", "/v1/completions": "completions", "/v1/chat/completions": "chat"}


def max_tokens(body: dict[str, Any]) -> Any:
    """The body's token limit, SGLang's or OpenAI's spelling (None when it sets none)."""
    return (body.get("sampling_params") or {}).get("max_new_tokens") or body.get("max_tokens")


def prompt_len(route: str, body: dict[str, Any], count: Callable[[str], int]) -> int:
    """Prompt tokens: the ids where the body carries them, else ``count`` over its texts."""
    if route == "generate":
        ids = body.get("input_ids")
        return len(ids) if isinstance(ids, list) else count(str(body.get("text", "")))
    if route == "completions":
        return count(str(body.get("prompt", "")))
    return sum(count(str(m.get("content", ""))) for m in body.get("messages", []))


def pd_event(body: dict[str, Any], i: int, n: int, kind: str) -> dict[str, Any]:
    return {"text": " tok" * i, "output_ids": [100 + j for j in range(i)],
            "meta_info": {"id": str(body.get("bootstrap_room")), "completion_tokens": i,
                          "finish_reason": {"type": "length", "length": n} if i == n else None,
                          "served_by": kind, "t": time.monotonic()}}


def greedy_event(body: dict[str, Any], i: int, n: int) -> dict[str, Any]:
    seq = list(body.get("input_ids") or [1])
    out: list[int] = []
    for _ in range(i):
        out.append((sum(seq) * 31 + len(seq)) % 997)
        seq.append(out[-1])
    return {"text": "".join(f" t{t}" for t in out), "output_ids": out,
            "meta_info": {"prompt_tokens": len(body.get("input_ids") or []),
                          "completion_tokens": i,
                          "finish_reason": {"type": "length", "length": n} if i == n else None}}


def api_event(route: str, rid: str, i: int, n: int, plen: int, t0: float) -> dict[str, Any]:
    """Streamed event for token ``i`` (1-based) of ``n``."""
    if route == "generate":
        return {"text": " tok" * i, "output_ids": [100 + j for j in range(i)],
                "meta_info": {"id": rid, "prompt_tokens": plen, "completion_tokens": i,
                              "finish_reason": {"type": "length", "length": n} if i == n else None,
                              "e2e_latency": time.monotonic() - t0}}
    finish = "length" if i == n else None
    if route == "completions":
        return {"id": rid, "object": "text_completion",
                "choices": [{"index": 0, "text": " tok", "finish_reason": finish}]}
    return {"id": rid, "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"content": " tok"}, "finish_reason": finish}]}


def usage(plen: int, n: int) -> dict[str, int]:
    return {"prompt_tokens": plen, "completion_tokens": n, "total_tokens": plen + n}


def api_whole(route: str, rid: str, n: int, plen: int, t0: float) -> dict[str, Any]:
    if route == "generate":
        return api_event(route, rid, n, n, plen, t0)
    if route == "completions":
        return {"id": rid, "choices": [{"index": 0, "text": " tok" * n, "finish_reason": "length"}],
                "usage": usage(plen, n)}
    return {"id": rid, "choices": [{"index": 0, "finish_reason": "length",
                                    "message": {"role": "assistant", "content": " tok" * n}}],
            "usage": usage(plen, n)}
