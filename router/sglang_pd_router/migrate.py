"""Request migration: when a decode dies or hangs after its stream has started, the request is
re-dispatched to another prefill/decode pair with the prompt plus the tokens already streamed,
and the client's stream goes on without a gap or a duplicate (Dynamo does this; SGLang's
routers do not).

Scope: streamed ``/generate`` requests whose prompt is ``input_ids`` (the router can then extend
the prompt exactly; a text prompt would need the server's tokenization) and that have no stop
strings (see ``Resume.for_request``). Our servers stream
cumulative ``output_ids`` / ``text``: events of a resumed leg are rewritten to continue the
first leg's (its ids and text are prefixed, token counts shifted). Until a migration happens,
events are relayed verbatim; the stream is only split at event boundaries, so a client never
gets half an event from a leg that broke.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Awaitable, Callable

import aiohttp
import orjson
from aiohttp import web

from .leg_client import LegResponse

logger = logging.getLogger(__name__)

DONE_EVENT = b"data: [DONE]"
_CONCAT_META = ("output_token_logprobs", "output_top_logprobs")
DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default, when the body gives none


@dataclass
class Resume:
    """What a migration needs: the original body and prompt, and what was relayed so far."""

    body: dict[str, Any]
    prompt_ids: list[int]
    limit: int  # migrations allowed for this request
    migrations: int = 0
    last_event: bytes = b""  # the last data event relayed, as the client saw it
    done: bool = False  # [DONE] relayed
    base: dict[str, Any] = field(default_factory=dict)  # earlier legs' cumulative output

    @staticmethod
    def for_request(path: str, body: dict[str, Any], stream: bool, limit: int
                    ) -> Resume | None:
        ids = body.get("input_ids")
        if limit < 1 or not stream or path != "/generate" or not isinstance(ids, list) \
                or not ids or not all(type(t) is int for t in ids):
            return None
        sp = body.get("sampling_params")
        if isinstance(sp, dict) and sp.get("stop"):
            # a stop string can span the splice (the new leg never sees the dead leg's text as
            # output), and the server holds back a possible stop's prefix from the streamed
            # text while its tokens are out: the spliced text would miss those characters
            return None
        return Resume(body, ids, limit)

    def finished(self) -> bool:
        last = self._last()
        return self.done or bool(last and (last.get("meta_info") or {}).get("finish_reason"))

    def _last(self) -> dict[str, Any] | None:
        if not self.last_event:
            return None
        try:
            last = orjson.loads(self.last_event[5:])
        except ValueError:
            return None
        return last if isinstance(last, dict) else None

    def next_body(self) -> dict[str, Any] | None:
        """The body that continues the request on a new pair (None: nothing left to make).
        Takes the relayed output as the new base."""
        last = self._last() or {}
        ids_, meta_ = last.get("output_ids"), last.get("meta_info")
        ids: list[Any] = ids_ if isinstance(ids_, list) else []
        meta: dict[str, Any] = meta_ if isinstance(meta_, dict) else {}
        self.base = {"output_ids": ids, "text": last.get("text") if isinstance(
            last.get("text"), str) else None, "meta": {k: meta[k] for k in _CONCAT_META
                                                        if isinstance(meta.get(k), list)}}
        sp = dict(self.body.get("sampling_params") or {})
        max_new = sp.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
        if isinstance(max_new, int) and max_new - len(ids) <= 0:
            return None
        if isinstance(max_new, int):
            sp["max_new_tokens"] = max_new - len(ids)
        if isinstance(sp.get("min_new_tokens"), int):
            sp["min_new_tokens"] = max(0, sp["min_new_tokens"] - len(ids))
        return {**self.body, "input_ids": self.prompt_ids + ids, "sampling_params": sp}

    def rewrite(self, event: bytes) -> bytes:
        """A resumed leg's data event as the continuation of what the client has."""
        if not self.base or event == DONE_EVENT:
            return event
        try:
            obj = orjson.loads(event[5:])
        except ValueError:
            return event
        if not isinstance(obj, dict) or "error" in obj:
            return event
        k = len(self.base["output_ids"])
        if isinstance(obj.get("output_ids"), list):
            obj["output_ids"] = self.base["output_ids"] + obj["output_ids"]
        if isinstance(obj.get("text"), str) and self.base["text"] is not None:
            obj["text"] = self.base["text"] + obj["text"]
        meta = obj.get("meta_info")
        if isinstance(meta, dict):
            if isinstance(meta.get("completion_tokens"), int):
                meta["completion_tokens"] += k
            if isinstance(meta.get("prompt_tokens"), int):
                meta["prompt_tokens"] -= k
            finish = meta.get("finish_reason")  # {"type": "length", "length": tokens made}
            if isinstance(finish, dict) and isinstance(finish.get("length"), int):
                finish["length"] += k
            for key, earlier in self.base["meta"].items():
                if isinstance(meta.get(key), list):
                    meta[key] = earlier + meta[key]
        return b"data: " + orjson.dumps(obj)


class EventSplitter:
    """Complete SSE events (``data: ...``) out of arbitrary chunks."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        self._buf += chunk
        *events, self._buf = self._buf.split(b"\n\n")
        return [e for e in events if e.strip()]


# re-dispatch: (body, decode to avoid) -> (open response, its first chunk, its decode) or None
Reopen = Callable[[dict[str, Any], Any], Awaitable["tuple[LegResponse, bytes, Any] | None"]]


async def relay_with_migration(out: web.StreamResponse, resp: LegResponse,
                               first: bytes, decode: Any, resume: Resume, reopen: Reopen,
                               alive: Callable[[Any], Awaitable[bool]], idle_s: float,
                               on_broken: Callable[[Any], None]) -> None:
    """Relay decode's stream to ``out``; when it breaks (connection lost, or silent for
    ``idle_s`` and failing a health probe) before [DONE], continue on a new pair."""
    while True:
        splitter = EventSplitter()
        chunk = first
        broke: str | None = None
        try:
            while chunk:
                for event in splitter.feed(chunk):
                    sent = resume.rewrite(event)
                    await out.write(sent + b"\n\n")
                    if event == DONE_EVENT:
                        resume.done = True
                    elif not event.startswith(b"data: {\"error\""):
                        resume.last_event = sent
                chunk = await _next_chunk(resp, decode, idle_s, alive)
            if not resume.done:
                broke = "the stream ended without [DONE]"
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            broke = f"{type(e).__name__}"
        finally:
            resp.close()
        if broke is None:
            return
        on_broken(decode)
        body = None if resume.finished() else resume.next_body()
        if resume.finished() or body is None:
            if not resume.done:
                await out.write(DONE_EVENT + b"\n\n")
            return
        if resume.migrations >= resume.limit:
            await _end_with_error(out, f"decode stream lost ({broke}); migration limit "
                                       f"{resume.limit} reached")
            return
        resume.migrations += 1
        # the splice point (tokens the client already has) is what a parity failure needs
        logger.warning("decode stream broke off (%s): migrating after %d streamed tokens "
                       "(%d of at most %d)", broke, len(resume.base["output_ids"]),
                       resume.migrations, resume.limit)
        opened = await reopen(body, decode)
        if opened is None:
            await _end_with_error(out, f"decode stream lost ({broke}); no pair could resume it")
            return
        resp, first, decode = opened


async def _next_chunk(resp: LegResponse, decode: Any, idle_s: float,
                      alive: Callable[[Any], Awaitable[bool]]) -> bytes:
    while True:
        try:
            return await asyncio.wait_for(resp.content.readany(), idle_s)
        except asyncio.TimeoutError:
            if not await alive(decode):
                raise
            # alive and merely slow (a long gap between tokens): keep waiting


async def _end_with_error(out: web.StreamResponse, message: str) -> None:
    event = {"error": {"message": message, "type": "ServerError", "code": 502}}
    await out.write(b"data: " + orjson.dumps(event) + b"\n\n")
