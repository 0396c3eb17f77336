"""Dual dispatch of one request to a prefill and a decode worker (DESIGN.md §2 and §5).

Each try draws a new 63-bit ``bootstrap_room``, sends the same body (plus ``bootstrap_host`` /
``bootstrap_port`` / ``bootstrap_room``) to both workers at once, and answers the client from
decode's first byte: the prefill's response is never waited for (it carries only the first token,
which decode returns too). Until the first byte of decode's answer is in hand, a failure of either
leg (connect error, 5xx, an SSE error event with a 5xx code, a prefill 5xx) cancels both legs and
tries again after a backoff, with a new room and avoiding the failed worker; a prefill 4xx is the
client's error and is answered at once. After the first byte, errors pass through as decode sends
them, or as an SSE error event when decode's connection breaks. legs.py waits on the two legs
and charges a failed try to the worker that caused it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import random
import time
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable

import aiohttp
import orjson
from aiohttp import web

from .answer import (DecodeHead, LegResult, answer_stream, answer_whole, error_response,
                     open_stream, passthrough, sse_error_status)
from .leg_client import LegClient, LegLimits, LegResponse, header_block
from .legs import RETRY_STATUSES, AttemptError, Legs, RouteError, swallow
from .migrate import Resume, relay_with_migration
from .policies import RouteRequest, RoutingPolicy
from .policies.conditional import LOCAL_PREFILL_HOST, ConditionalConfig, prefill_on_decode
from .request_class import class_headers
from .workers import Worker, WorkerRegistry

logger = logging.getLogger(__name__)

# rooms need to be unique, not secret: a fast generator seeded from the OS
_ROOMS = random.Random(int.from_bytes(os.urandom(16), "little"))
_FORWARDED_HEADERS = ("x-slo-ttft-ms", "x-slo-tpot-ms", "x-request-id")


class Dispatcher:
    def __init__(self, registry: WorkerRegistry, prefill_policy: RoutingPolicy,
                 decode_policy: RoutingPolicy, session: aiohttp.ClientSession, *,
                 worker_headers: dict[str, str], max_retries: int, backoff_initial_s: float,
                 backoff_max_s: float, request_timeout_s: float,
                 kv_deadline_s: float = 30.0, first_byte_timeout_s: float = 10.0,
                 probe_timeout_s: float = 2.0, max_migrations: int = 0,
                 connect_timeout_s: float = 5.0,
                 on_routed: Callable[[str, Worker | None, Worker], None] | None = None,
                 on_retry: Callable[[str], None] | None = None,
                 conditional: ConditionalConfig | None = None) -> None:
        self.registry = registry
        self.prefill_policy = prefill_policy
        self.decode_policy = decode_policy
        self.worker_headers = worker_headers
        self.max_retries = max_retries
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.request_timeout_s = request_timeout_s
        # every read of a leg is bounded by the request's timeout (and a margin: the request's
        # own scope fires first and answers the client)
        self.legs = Legs(session, LegClient(LegLimits(
            connect_timeout_s=connect_timeout_s, read_timeout_s=request_timeout_s + 30.0)),
            worker_headers, kv_deadline_s, first_byte_timeout_s, probe_timeout_s)
        self._static_headers = header_block({"Content-Type": "application/json",
                                             **worker_headers})
        self._class_prefix: dict[str, bytes] = {}
        self.max_migrations = max_migrations  # per request; 0: a broken stream ends in error
        self.on_routed = on_routed
        self.on_retry = on_retry
        self.conditional = conditional  # None: every request takes a prefill leg
        self._background: set[asyncio.Future] = set()  # prefill legs that outlive the answer

    async def close(self) -> None:
        await self.legs.client.close()

    def _class_lines(self, request_class: str) -> bytes:
        """The class header line and the name of the count's line, checked and encoded once
        per class (header_block's checks cost a few us per request); the count, an int, is
        appended per request."""
        lines = self._class_prefix.get(request_class)
        if lines is None:
            block = header_block(class_headers(request_class, 0))
            assert block.endswith(b": 0\r\n"), "class_headers must end with the count"
            lines = self._class_prefix[request_class] = block[:-len(b"0\r\n")]
        return lines

    # ------------------------------------------------------------------ picking
    def _pick(self, kind: str, policy: RoutingPolicy, route_req: RouteRequest,
              avoid: frozenset[str]) -> Worker:
        now = time.monotonic()
        workers, views = self.registry.views(kind, now, avoid)
        index = policy.select(route_req, views, now)
        if index is None:
            raise RouteError(503, f"no healthy {kind} worker", retriable=True)
        return workers[index]

    # ------------------------------------------------------------------ one request
    async def serve(self, request: web.Request, path: str, data: bytes, body: dict[str, Any],
                    route_req: RouteRequest, stream: bool, t_arrival: float,
                    on_first_send: Callable[[float], None]) -> web.StreamResponse:
        headers = self._static_headers  # the legs' header lines, built once per request
        sent = request.headers
        extra = {name: sent[name] for name in _FORWARDED_HEADERS if name in sent}
        if extra:
            try:
                headers += header_block(extra)
            except ValueError as e:  # a client's header that would split the request
                return error_response(400, str(e))
        if route_req.request_class:  # our class and the count it used (request_class.py)
            headers += self._class_lines(route_req.request_class) \
                + str(route_req.prompt_len).encode() + b"\r\n"
        resume = Resume.for_request(path, body, stream, self.max_migrations)
        result = await self._dispatch(request, path, data, body, headers, route_req, stream,
                                      t_arrival, on_first_send, resume)
        assert not isinstance(result, _Handoff)
        return result

    async def _dispatch(self, request: web.Request, path: str, data: bytes,
                        body: dict[str, Any], headers: bytes, route_req: RouteRequest,
                        stream: bool, t_arrival: float, on_first_send: Callable[[float], None],
                        resume: Resume | None, handoff: bool = False,
                        avoid: set[str] | None = None) -> web.StreamResponse | _Handoff:
        """Tries pairs until one answers (or hands its open decode stream over, for a
        migration), with backoff and retries."""
        cls = route_req.request_class
        avoid = set() if avoid is None else avoid
        last_error: RouteError | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                if self.on_retry is not None:
                    self.on_retry(cls)
                delay = min(self.backoff_initial_s * 2 ** (attempt - 1), self.backoff_max_s)
                await asyncio.sleep(delay * (0.5 + random.random() / 2))  # jitter
            excluded = frozenset(avoid)
            try:
                prefill = self._pick("prefill", self.prefill_policy, route_req, excluded)
                hit = self.prefill_policy.last_pick_hit  # expected cached there (cache_aware)
                decode = self._pick("decode", self.decode_policy, route_req, excluded)
            except RouteError as e:
                last_error = e
                continue
            now = time.monotonic()
            # conditional disaggregation (policies/conditional.py): decode prefills it itself
            local = self.conditional is not None and prefill_on_decode(
                route_req, prefill.view(now), decode.view(now), self.conditional,
                self.prefill_policy.cfg)
            if not local:
                prefill.breaker.on_pick(now)  # only once both are picked: a half-open trial
            decode.breaker.on_pick(now)
            # ``data`` is the body serialised once (``{...}``): each try appends its fields
            fields = orjson.dumps({"bootstrap_host": LOCAL_PREFILL_HOST if local
                                   else prefill.bootstrap_host,
                                   "bootstrap_port": prefill.bootstrap_port,
                                   "bootstrap_room": _ROOMS.getrandbits(63)})
            payload = data[:-1] + (b"," if len(data) > 2 else b"") + fields[1:]
            if self.on_routed is not None:
                self.on_routed(cls, None if local else prefill, decode)
            sent_after = time.monotonic() - t_arrival
            result = await self._try_pair(request, path, payload, headers, route_req, stream,
                                          None if local else prefill, decode, body, resume,
                                          handoff, 0 if local else hit)
            if isinstance(result, (web.StreamResponse, _Handoff)):
                on_first_send(sent_after)  # the router's share of the answered try
                return result
            last_error = result
            if not result.retriable:
                break
            for w, failed in ((prefill, result.failed_prefill), (decode, result.failed_decode)):
                if failed and not (local and w is prefill):
                    avoid.add(w.url)
            logger.warning("attempt %d (%s -> %s) failed: %s", attempt + 1, prefill.url,
                           decode.url, result.message)
        if last_error is None:  # only with max_retries < 0
            last_error = RouteError(503, "no attempt made")
        if isinstance(last_error, AttemptError) and last_error.response is not None:
            return last_error.response
        if isinstance(last_error, AttemptError):  # the details (URLs, errors) are in the log
            which = "prefill" if last_error.failed_prefill else "decode"
            return error_response(last_error.status, f"the {which} worker failed "
                                  f"({last_error.status}) on every try")
        return error_response(last_error.status, last_error.message)

    async def _try_pair(self, request: web.Request, path: str, data: bytes,
                        headers: bytes, route_req: RouteRequest, stream: bool,
                        prefill: Worker | None, decode: Worker, body: dict[str, Any],
                        resume: Resume | None = None, handoff: bool = False, hit: int = 0
                        ) -> web.StreamResponse | AttemptError | _Handoff:
        # queued work charged to the prefill: the prompt less what its policy expects cached
        tokens = max(route_req.prompt_len - route_req.cached_len - hit, 0)
        loop = asyncio.get_running_loop()  # create_task: ensure_future's checks cost per leg
        # both requests are written here, before the legs' tasks first run (a loop turn
        # later), when a kept-alive connection is idle (LegClient.start): prefill first, as
        # decode's KV comes from it
        p_start = None if prefill is None else self.legs.start(prefill, path, data, headers,
                                                               loop)
        d_start = self.legs.start(decode, path, data, headers, loop)
        if prefill is None or p_start is None:  # prefilled on decode: no prefill leg
            # (an answered one stands in)
            p_task: asyncio.Future = loop.create_future()
            p_task.set_result(LegResult(200, b"{}"))
        else:
            p_task = loop.create_task(self.legs.prefill(prefill, p_start, tokens))
        decode.in_flight += 1
        d_task = loop.create_task(self.legs.decode_head(d_start, stream))
        if prefill is None:  # decode's own prefill queue, current between its /get_load polls
            decode.outstanding_prefill_tokens += tokens
            d_task.add_done_callback(lambda _t: _add_tokens(decode, -tokens))
        head: DecodeHead | None = None
        answered = False
        answer: web.StreamResponse
        down: asyncio.Future = loop.create_future()
        for w in (prefill, decode):  # resolved if either worker turns unhealthy meanwhile
            if w is not None:
                w.watchers.add(down)
        try:
            failed = await self.legs.await_decode_head(p_task, d_task, down, prefill,
                                                       decode, stream)
            if failed is not None:
                return failed
            try:
                head = d_task.result()
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
                decode.breaker.on_failure(time.monotonic())
                return AttemptError(502, f"decode {decode.url} failed: {e!r}",
                                    failed_decode=True)
            status = head.resp.status
            first_error = sse_error_status(head.first) if stream and status == 200 else None
            if status in RETRY_STATUSES or (first_error is not None and first_error >= 500):
                message = head.first.decode(errors="replace")[:500]
                err = AttemptError(status if first_error is None else first_error,
                                   f"decode {decode.url} answered {status}: {message}",
                                   response=passthrough(head))
                await self.legs.charge_decode_failure(err, p_task, prefill, decode)
                return err
            decode.breaker.on_success()
            if handoff and stream and status == 200:
                answered = True  # the caller reads and closes decode's stream
                handed = head
                head = None
                return _Handoff(handed, decode)
            if not stream or status != 200:
                answer = await answer_whole(head, p_task, body)
            elif resume is not None:
                answer = await self._answer_migrating(request, head, decode, resume, path,
                                                      headers, route_req)
            else:
                answer = await answer_stream(request, head)
            answered = True
            return answer
        finally:
            for w in (prefill, decode):
                if w is not None:
                    w.watchers.discard(down)
            decode.in_flight -= 1
            if head is not None:
                # a fully read body lets the connection go back to the pool; anything else
                # (client gone, timeout, a failed try) closes it, which aborts the request there
                head.resp.release() if answered else head.resp.close()
            if not d_task.done():
                d_task.cancel()
            d_start.drop()  # closes its connection only if its task never ran
            if p_start is not None:
                p_start.drop()
            if p_task.done():
                swallow(p_task)
            elif answered:  # prefill finishes on its own; keep a reference till then
                self._background.add(p_task)
                p_task.add_done_callback(self._background.discard)
                p_task.add_done_callback(swallow)
            else:
                p_task.cancel()

    async def _answer_migrating(self, request: web.Request, head: DecodeHead, decode: Worker,
                                resume: Resume, path: str, headers: bytes,
                                route_req: RouteRequest) -> web.StreamResponse:
        out = await open_stream(request, head)

        async def reopen(body: dict[str, Any], dead: Worker
                         ) -> tuple[LegResponse, bytes, Worker] | None:
            ids = body["input_ids"]
            result = await self._dispatch(
                request, path, orjson.dumps(body), body, headers,
                dataclasses.replace(route_req, prompt_len=len(ids)), True, time.monotonic(),
                lambda _s: None, None, handoff=True, avoid={dead.url})
            if isinstance(result, _Handoff):
                return result.head.resp, result.head.first, result.decode
            return None

        await relay_with_migration(
            out, head.resp, head.first, decode, resume, reopen, self.legs.alive,
            self.legs.first_byte_timeout_s,
            lambda w: w.breaker.on_failure(time.monotonic()))
        await out.write_eof()
        return out


@dataclass
class _Handoff:
    """A decode stream opened to resume a migrated request: the caller owns ``head``."""
    head: DecodeHead
    decode: Worker


def _add_tokens(worker: Worker, tokens: int) -> None:
    worker.outstanding_prefill_tokens += tokens
