"""The client's answer from decode's response (DESIGN.md §5): passing an error through, a whole
body (with the prefill's prompt logprobs merged in), or a stream relayed chunk by chunk that
ends with an SSE error event when decode's connection breaks. proxy.py decides which worker
pair answers; this module only writes what decode sent."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from .leg_client import LegResponse

logger = logging.getLogger(__name__)

# where a started stream is kept on the request, so a timeout can end it in-band
STREAM_KEY: Any = (web.RequestKey("router_stream", web.StreamResponse)
                   if hasattr(web, "RequestKey") else "router_stream")


def error_body(status: int, message: str) -> bytes:
    kind = "ServerError" if status >= 500 else "BadRequestError"
    return orjson.dumps({"error": {"message": message, "type": kind, "code": status}})


def error_response(status: int, message: str, headers: dict[str, str] | None = None
                   ) -> web.Response:
    return web.Response(body=error_body(status, message), status=status,
                        content_type="application/json", headers=headers)


@dataclass
class LegResult:
    status: int
    body: bytes


@dataclass
class DecodeHead:
    """Decode's answer up to the first byte: the open response and what was read."""
    resp: LegResponse
    first: bytes  # stream: the first chunk; otherwise the whole body
    done: bool  # the body was read to the end


def sse_error_status(chunk: bytes) -> int | None:
    """The code of an SSE error event opening ``chunk`` (our servers' shape), else None."""
    if not chunk.startswith(b"data: {\"error\""):
        return None
    try:
        event = orjson.loads(chunk[5:].split(b"\n\n", 1)[0])
        return int(event["error"].get("code", 500))
    except (ValueError, KeyError, TypeError, AttributeError):
        return 500


def passthrough(head: DecodeHead) -> web.Response:
    if head.resp.status == 200:  # an SSE error event: answer it as a JSON error
        status = sse_error_status(head.first) or 502
        body = head.first[5:].split(b"\n\n", 1)[0].strip()
        return web.Response(body=body, status=status, content_type="application/json")
    return web.Response(body=head.first, status=head.resp.status,
                        content_type=head.resp.content_type or "application/json")


async def answer_whole(head: DecodeHead, p_task: asyncio.Future, body: dict[str, Any]
                       ) -> web.Response:
    out = head.first
    if head.resp.status == 200 and body.get("return_logprob"):
        out = await merge_prompt_logprobs(out, p_task)
    return web.Response(body=out, status=head.resp.status,
                        content_type=head.resp.content_type or "application/json")


class _CoalescedStream(web.StreamResponse):
    """A stream whose status line and headers leave with its first body write (aiohttp keeps
    them buffered until then when this class attribute is False, as its ``web.Response``
    does): one socket write and one client wake-up fewer on the first byte's path. Used where
    the first body bytes are written at once (``answer_stream``). On an aiohttp without the
    attribute it is ignored and the headers go out at ``prepare``, as before."""

    _send_headers_immediately = False


async def open_stream(request: web.Request, head: DecodeHead, *, with_first_write: bool = False
                      ) -> web.StreamResponse:
    """The client's stream, prepared; ``with_first_write``: its head leaves with the first body
    write (the caller writes at once), else at once."""
    cls = _CoalescedStream if with_first_write else web.StreamResponse
    out = cls(status=200, headers={
        "Content-Type": head.resp.headers.get("content-type", "text/event-stream"),
        "Cache-Control": "no-cache"})
    await out.prepare(request)
    request[STREAM_KEY] = out  # a timeout after this point ends the stream in-band
    return out


async def answer_stream(request: web.Request, head: DecodeHead) -> web.StreamResponse:
    out = await open_stream(request, head, with_first_write=True)
    resp = head.resp
    chunk = head.first
    try:
        # each chunk is written as it comes, but the last one (decode's answer has ended
        # with it) leaves with the stream's end below: one write and one client wake-up fewer
        while not resp.ended:
            await out.write(chunk)
            try:
                chunk = await resp.readany()
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
                # decode went away mid-stream: bytes were sent, so no retry; end with an error
                logger.warning("decode stream broke off: %r", e)
                chunk = b"data: " + error_body(502, f"decode connection lost: {e!r}") + b"\n\n"
                break
        await out.write_eof(chunk)
    except ConnectionResetError:
        # a write met the client's closed socket: it left, often right after reading
        # "[DONE]" while decode's stream had not ended yet (bench_serving does so); nothing
        # to answer, and not a router failure (the legs are released by the dispatcher)
        logger.debug("client left mid-stream: %s %s", request.method, request.path)
    return out


async def merge_prompt_logprobs(decode_body: bytes, p_task: asyncio.Future) -> bytes:
    """Copy the prompt logprobs (``input_*`` meta fields) that only a prefill computes into
    decode's answer, when decode's lacks them; waits briefly for prefill's answer."""
    try:
        result: LegResult = await asyncio.wait_for(asyncio.shield(p_task), 5.0)
        prefill_meta = orjson.loads(result.body).get("meta_info") or {}
        answer = orjson.loads(decode_body)
    except (asyncio.TimeoutError, aiohttp.ClientError, OSError, ValueError, AttributeError):
        return decode_body
    meta = answer.get("meta_info") if isinstance(answer, dict) else None
    if not isinstance(meta, dict):
        return decode_body
    merged = False
    for key, value in prefill_meta.items():
        if key.startswith("input_") and value and not meta.get(key):
            meta[key] = value
            merged = True
    return orjson.dumps(answer) if merged else decode_body
