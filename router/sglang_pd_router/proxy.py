"""Dual dispatch of one request to a prefill and a decode worker (DESIGN.md §2 and §5).

Each try draws a new 63-bit ``bootstrap_room``, sends the same body (plus ``bootstrap_host`` /
``bootstrap_port`` / ``bootstrap_room``) to both workers at once, and answers the client from
decode's first byte: the prefill's response is never waited for (it carries only the first token,
which decode returns too). Until the first byte of decode's answer is in hand, a failure of either
leg (connect error, 5xx, an SSE error event with a 5xx code, a prefill 5xx) cancels both legs and
tries again after a backoff, with a new room and avoiding the failed worker; a prefill 4xx is the
client's error and is answered at once. After the first byte, errors pass through as decode sends
them, or as an SSE error event when decode's connection breaks.
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

from .answer import (DecodeHead, LegResult, answer_stream, answer_whole, error_response, open_stream, passthrough, sse_error_status)
from .migrate import Resume, relay_with_migration
from .policies import RouteRequest, RoutingPolicy
from .policies.conditional import LOCAL_PREFILL_HOST, ConditionalConfig, prefill_on_decode
from .request_class import class_headers
from .workers import Worker, WorkerRegistry

logger = logging.getLogger(__name__)

# rooms need to be unique, not secret: a fast generator seeded from the OS
_ROOMS = random.Random(int.from_bytes(os.urandom(16), "little"))
_RETRY_STATUSES = frozenset({500, 502, 503, 504})
_FORWARDED_HEADERS = ("x-slo-ttft-ms", "x-slo-tpot-ms", "x-request-id")


class RouteError(Exception):
    """An answer the router gives itself (no worker's response to pass on)."""

    def __init__(self, status: int, message: str, retriable: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retriable = retriable


class Dispatcher:
    def __init__(self, registry: WorkerRegistry, prefill_policy: RoutingPolicy,
                 decode_policy: RoutingPolicy, session: aiohttp.ClientSession, *,
                 worker_headers: dict[str, str], max_retries: int, backoff_initial_s: float,
                 backoff_max_s: float, request_timeout_s: float,
                 kv_deadline_s: float = 30.0, first_byte_timeout_s: float = 10.0,
                 probe_timeout_s: float = 2.0, max_migrations: int = 0,
                 on_routed: Callable[[str, Worker | None, Worker], None] | None = None,
                 on_retry: Callable[[str], None] | None = None,
                 conditional: ConditionalConfig | None = None) -> None:
        self.registry = registry
        self.prefill_policy = prefill_policy
        self.decode_policy = decode_policy
        self.session = session
        self.worker_headers = worker_headers
        self.max_retries = max_retries
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.request_timeout_s = request_timeout_s
        self.kv_deadline_s = kv_deadline_s
        self.first_byte_timeout_s = first_byte_timeout_s
        self.probe_timeout_s = probe_timeout_s
        self.max_migrations = max_migrations  # per request; 0: a broken stream ends in error
        self.on_routed = on_routed
        self.on_retry = on_retry
        self.conditional = conditional  # None: every request takes a prefill leg
        self._background: set[asyncio.Future] = set()  # prefill legs that outlive the answer

    # ------------------------------------------------------------------ picking
    def _pick(self, kind: str, policy: RoutingPolicy, route_req: RouteRequest,
              avoid: frozenset[str]) -> Worker:
        now = time.monotonic()
        workers, views = self.registry.views(kind, now, avoid)
        index = policy.select(route_req, views, now)
        if index is None:
            raise RouteError(503, f"no healthy {kind} worker", retriable=True)
        return workers[index]

    # ------------------------------------------------------------------ legs
    async def _prefill_leg(self, worker: Worker, path: str, data: bytes,
                           headers: dict[str, str], tokens: int) -> LegResult:
        worker.in_flight += 1
        worker.outstanding_prefill_tokens += tokens
        try:
            async with self.session.post(worker.url + path, data=data, headers=headers) as resp:
                return LegResult(resp.status, await resp.read())
        finally:
            worker.in_flight -= 1
            worker.outstanding_prefill_tokens -= tokens

    async def _decode_head(self, worker: Worker, path: str, data: bytes,
                           headers: dict[str, str], stream: bool) -> DecodeHead:
        resp = await self.session.post(worker.url + path, data=data, headers=headers)
        try:
            if stream and resp.status == 200:
                first = await resp.content.readany()
                return DecodeHead(resp, first, done=not first)
            return DecodeHead(resp, await resp.read(), done=True)
        except BaseException:
            resp.close()
            raise

    # ------------------------------------------------------------------ one request
    async def serve(self, request: web.Request, path: str, data: bytes, body: dict[str, Any],
                    route_req: RouteRequest, stream: bool, t_arrival: float,
                    on_first_send: Callable[[float], None]) -> web.StreamResponse:
        headers = {"Content-Type": "application/json", **self.worker_headers}
        for name in _FORWARDED_HEADERS:
            if name in request.headers:
                headers[name] = request.headers[name]
        if route_req.request_class:  # our class and the count it used (request_class.py)
            headers.update(class_headers(route_req.request_class, route_req.prompt_len))
        resume = Resume.for_request(path, body, stream, self.max_migrations)
        result = await self._dispatch(request, path, data, body, headers, route_req, stream,
                                      t_arrival, on_first_send, resume)
        assert not isinstance(result, _Handoff)
        return result

    async def _dispatch(self, request: web.Request, path: str, data: bytes,
                        body: dict[str, Any], headers: dict[str, str], route_req: RouteRequest,
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
                                          handoff)
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
        if isinstance(last_error, _AttemptError) and last_error.response is not None:
            return last_error.response
        if isinstance(last_error, _AttemptError):  # the details (URLs, errors) are in the log
            which = "prefill" if last_error.failed_prefill else "decode"
            return error_response(last_error.status, f"the {which} worker failed "
                                  f"({last_error.status}) on every try")
        return error_response(last_error.status, last_error.message)

    async def _try_pair(self, request: web.Request, path: str, data: bytes,
                        headers: dict[str, str], route_req: RouteRequest, stream: bool,
                        prefill: Worker | None, decode: Worker, body: dict[str, Any],
                        resume: Resume | None = None, handoff: bool = False
                        ) -> web.StreamResponse | _AttemptError | _Handoff:
        tokens = max(route_req.prompt_len - route_req.cached_len, 0)
        loop = asyncio.get_running_loop()  # create_task: ensure_future's checks cost per leg
        if prefill is None:  # prefilled on decode: no prefill leg (an answered one stands in)
            p_task: asyncio.Future = loop.create_future()
            p_task.set_result(LegResult(200, b"{}"))
        else:
            p_task = loop.create_task(self._prefill_leg(prefill, path, data, headers, tokens))
        decode.in_flight += 1
        d_task = loop.create_task(self._decode_head(decode, path, data, headers, stream))
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
            failed = await self._await_decode_head(p_task, d_task, down, prefill, decode,
                                                   stream)
            if failed is not None:
                return failed
            try:
                head = d_task.result()
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
                decode.breaker.on_failure(time.monotonic())
                return _AttemptError(502, f"decode {decode.url} failed: {e!r}",
                                     failed_decode=True)
            status = head.resp.status
            first_error = sse_error_status(head.first) if stream and status == 200 else None
            if status in _RETRY_STATUSES or (first_error is not None and first_error >= 500):
                decode.breaker.on_failure(time.monotonic())
                message = head.first.decode(errors="replace")[:500]
                # the prefill's failure explains decode's 502 better, when it has one
                return _AttemptError(status if first_error is None else first_error,
                                     f"decode {decode.url} answered {status}: {message}",
                                     failed_decode=True,
                                     response=passthrough(head))
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
            if p_task.done():
                _swallow(p_task)
            elif answered:  # prefill finishes on its own; keep a reference till then
                self._background.add(p_task)
                p_task.add_done_callback(self._background.discard)
                p_task.add_done_callback(_swallow)
            else:
                p_task.cancel()

    async def _await_decode_head(self, p_task: asyncio.Future, d_task: asyncio.Future,
                                 down: asyncio.Future, prefill: Worker | None, decode: Worker,
                                 stream: bool) -> _AttemptError | None:
        """Wait for decode's first byte with the legs' liveness checks: the prefill's answer
        (its KV sent) by ``kv_deadline_s``, then a streamed decode's first byte by
        ``first_byte_timeout_s``. At a deadline the workers are probed: a silent one fails
        the try; if both answer, the request is slow, not stuck, and waits on. A worker turning
        unhealthy fails the try at once. Failures are charged to the worker that caused them:
        a prefill error while decode is silent is decode's (it never fetched its KV)."""
        loop = asyncio.get_running_loop()
        pending = {p_task, d_task, down}
        prefill_done = False
        wake_at = loop.time() + self.kv_deadline_s
        while d_task in pending:
            done, pending = await _first_done(pending, max(wake_at - loop.time(), 0))
            if down in done:
                sick: Worker = down.result()
                return _AttemptError(503, f"{sick.kind} {sick.url} turned unhealthy",
                                     failed_prefill=sick is prefill,
                                     failed_decode=sick is decode)
            if p_task in done and prefill is None:  # prefilled on decode: its first byte comes
                prefill_done = True  # after its own prefill, which gets the prefill's deadline
                wake_at = loop.time() + self.kv_deadline_s
            elif p_task in done and prefill is not None:
                err = self._prefill_failure(p_task, prefill)
                if err is not None:
                    if err.failed_prefill and d_task not in done \
                            and not await self._alive(decode):
                        return self._decode_silent(decode, "the prefill's KV transfer failed")
                    if err.failed_prefill:
                        prefill.breaker.on_failure(time.monotonic())
                    return err
                prefill.breaker.on_success()
                prefill_done = True
                wake_at = loop.time() + self.first_byte_timeout_s
            if done or d_task not in pending:
                continue
            # a deadline passed with nothing new
            if not await self._alive(decode):
                return self._decode_silent(decode, "no first byte")
            if prefill is not None and not prefill_done and not await self._alive(prefill):
                prefill.breaker.on_failure(time.monotonic())
                return _AttemptError(504, f"prefill {prefill.url} did not answer within "
                                     f"{self.kv_deadline_s:g}s nor its health probe",
                                     failed_prefill=True)
            if prefill_done and stream:
                decode.breaker.on_failure(time.monotonic())
                return _AttemptError(504, f"decode {decode.url} sent no first byte within "
                                     f"{self.first_byte_timeout_s:g}s of the prefill's answer",
                                     failed_decode=True)
            wake_at = loop.time() + (self.first_byte_timeout_s if prefill_done
                                     else self.kv_deadline_s)
        return None

    def _decode_silent(self, decode: Worker, what: str) -> _AttemptError:
        decode.breaker.on_failure(time.monotonic())
        return _AttemptError(504, f"decode {decode.url} is not answering ({what}; its health "
                             f"probe failed)", failed_decode=True)

    async def _alive(self, worker: Worker) -> bool:
        """One quick /health probe (an attribution, not the monitor's verdict)."""
        try:
            async with self.session.get(worker.url + "/health", headers=self.worker_headers,
                                        timeout=aiohttp.ClientTimeout(
                                            total=self.probe_timeout_s)) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
            return False

    def _prefill_failure(self, p_task: asyncio.Future, prefill: Worker) -> _AttemptError | None:
        try:
            result: LegResult = p_task.result()
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            return _AttemptError(502, f"prefill {prefill.url} failed: {e!r}", failed_prefill=True)
        if result.status in _RETRY_STATUSES:  # the caller charges the right worker
            return _AttemptError(result.status, f"prefill {prefill.url} answered "
                                 f"{result.status}: {result.body[:500].decode(errors='replace')}",
                                 failed_prefill=True)
        if result.status >= 400:  # the request itself is bad: decode can never get its KV
            prefill.breaker.on_success()
            resp = web.Response(body=result.body, status=result.status,
                                content_type="application/json")
            return _AttemptError(result.status, "prefill refused the request",
                                 retriable=False, response=resp)
        return None

    async def _answer_migrating(self, request: web.Request, head: DecodeHead, decode: Worker,
                                resume: Resume, path: str, headers: dict[str, str],
                                route_req: RouteRequest) -> web.StreamResponse:
        out = await open_stream(request, head)

        async def reopen(body: dict[str, Any], dead: Worker
                         ) -> tuple[aiohttp.ClientResponse, bytes, Worker] | None:
            ids = body["input_ids"]
            result = await self._dispatch(
                request, path, orjson.dumps(body), body, headers,
                dataclasses.replace(route_req, prompt_len=len(ids)), True, time.monotonic(),
                lambda _s: None, None, handoff=True, avoid={dead.url})
            if isinstance(result, _Handoff):
                return result.head.resp, result.head.first, result.decode
            return None

        await relay_with_migration(
            out, head.resp, head.first, decode, resume, reopen, self._alive,
            self.first_byte_timeout_s,
            lambda w: w.breaker.on_failure(time.monotonic()))
        await out.write_eof()
        return out


@dataclass
class _Handoff:
    """A decode stream opened to resume a migrated request: the caller owns ``head``."""
    head: DecodeHead
    decode: Worker


class _AttemptError(RouteError):
    def __init__(self, status: int, message: str, *, retriable: bool = True,
                 failed_prefill: bool = False, failed_decode: bool = False,
                 response: web.Response | None = None) -> None:
        super().__init__(status, message, retriable)
        self.failed_prefill = failed_prefill
        self.failed_decode = failed_decode
        self.response = response  # what to answer if this is the last try


async def _first_done(futures: set[asyncio.Future], timeout: float
                      ) -> tuple[set[asyncio.Future], set[asyncio.Future]]:
    """``asyncio.wait(futures, timeout=timeout, return_when=FIRST_COMPLETED)`` without its
    argument checks and per-call set copies: it runs once or twice per request."""
    done = {f for f in futures if f.done()}
    if not done:
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()

        def wake(_: object = None) -> None:
            if not waiter.done():
                waiter.set_result(None)

        timer = loop.call_later(timeout, wake)
        for f in futures:
            f.add_done_callback(wake)
        try:
            await waiter
        finally:
            timer.cancel()
            for f in futures:
                f.remove_done_callback(wake)
        done = {f for f in futures if f.done()}
    return done, futures - done


def _swallow(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: no "exception never retrieved" noise


def _add_tokens(worker: Worker, tokens: int) -> None:
    worker.outstanding_prefill_tokens += tokens
