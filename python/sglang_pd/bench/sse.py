"""Reading replies: server-sent events, and folding them into per-request timings.

A chunk "carries output" when the server's cumulative completion count grew (native API) or it
has non-empty text; only such chunks count for TTFT and ITL, so role-only or usage-only chunks
do not distort the gaps.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp


class ProtocolError(Exception):
    """The reply does not follow the API (e.g. no output at all, or endless events)."""


class StreamError(Exception):
    """The server reported an error inside the stream."""


async def sse_data(
    resp: aiohttp.ClientResponse, max_events: int
) -> AsyncIterator[tuple[float, bytes]]:
    """Yield (arrival time, payload) for each ``data:`` line, reading raw chunks.

    We split lines ourselves rather than use aiohttp's readline, whose line-length cap a long
    cumulative-text event could exceed.
    """
    buf = bytearray()
    events = 0
    async for chunk in resp.content.iter_any():
        now = time.perf_counter()
        buf.extend(chunk)
        while (nl := buf.find(b"\n")) >= 0:
            line = bytes(buf[:nl]).strip()
            del buf[: nl + 1]
            if line.startswith(b"data:"):
                events += 1
                if events > max_events:
                    raise ProtocolError(f"more than {max_events} stream events")
                yield now, line[5:].strip()
    if buf.strip().startswith(b"data:"):
        yield time.perf_counter(), bytes(buf).strip()[5:].strip()


def error_text(obj: Any) -> str:
    if isinstance(obj, dict):
        err = obj.get("error", obj.get("detail", obj))
        if isinstance(err, dict):
            return str(err.get("message", err))
        return str(err)
    return str(obj)


class Tracker:
    """Folds stream events into TTFT/ITL/output counters for one request."""

    def __init__(self, st: float) -> None:
        self.st = st
        self.last_t: float | None = None
        self.ttft = 0.0
        self.itl: list[float] = []
        self.text = ""
        self.count = 0  # server's completion count, or output-carrying chunks as a fallback
        self.server_count: int | None = None
        self.output_ids: list[int] | None = None

    def tick(self, now: float) -> None:
        if self.last_t is None:
            self.ttft = now - self.st
        else:
            self.itl.append(now - self.last_t)
        self.last_t = now

    def native(self, now: float, obj: dict[str, Any]) -> None:
        meta = obj.get("meta_info") or {}
        text = obj.get("text") or ""
        ct = meta.get("completion_tokens")
        grew = (
            (ct > (self.server_count or 0)) if isinstance(ct, int) else len(text) > len(self.text)
        )
        ids = obj.get("output_ids")
        if isinstance(ids, list):
            # Cumulative in SGLang's default mode; incremental when the server streams deltas.
            cumulative = isinstance(ct, int) and len(ids) == ct
            self.output_ids = (
                list(ids) if cumulative or self.output_ids is None else self.output_ids + ids
            )
        if isinstance(ct, int):
            self.server_count = ct
        if grew:
            self.tick(now)
            self.count += 1
        self.text = text  # cumulative in SGLang's stream (only kept for --output-details)

    def openai(self, now: float, obj: dict[str, Any], chat: bool) -> None:
        usage = obj.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.server_count = usage["completion_tokens"]
        choices = obj.get("choices") or []
        if not choices:
            return
        piece = (choices[0].get("delta") or {}).get("content") if chat else choices[0].get("text")
        if piece:
            self.tick(now)
            self.count += 1
            self.text += piece


def fold_whole_reply(tr: Tracker, obj: dict[str, Any], backend: str) -> None:
    """Non-streaming reply: everything arrives at once, so TTFT equals E2E and there is no ITL."""
    tr.tick(time.perf_counter())
    tr.count = 1
    if backend == "sglang":
        meta = obj.get("meta_info") or {}
        tr.text = obj.get("text") or ""
        tr.server_count = meta.get("completion_tokens")
        ids = obj.get("output_ids")
        tr.output_ids = list(ids) if isinstance(ids, list) else None
        return
    choice = (obj.get("choices") or [{}])[0]
    if backend == "sglang-oai-chat":
        tr.text = (choice.get("message") or {}).get("content") or ""
    else:
        tr.text = choice.get("text") or ""
    tr.server_count = (obj.get("usage") or {}).get("completion_tokens")
