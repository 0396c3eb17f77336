"""What stands between a hostile client and the router's work: keys per route class, loop
detection, a bounded and timed body read, and errors as JSON with stable messages (tracebacks
at DEBUG only, error logs rate-limited). docs/router.md "Security model" describes the policy."""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import time
from typing import Any
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from . import aio
from .limits import MAX_BODY_BYTES, MAX_JSON_DEPTH, json_too_deep
from .answer import error_response

logger = logging.getLogger(__name__)

HOP_HEADER = "x-sglang-pd-router-hop"  # sent on every request to a worker: this router's id
ID_HEADER = "x-sglang-pd-router-id"  # on /health answers: lets a registration spot the router
OPEN_ROUTES = frozenset({"/health", "/readiness"})
ADMIN_ROUTES = frozenset({"/workers"})
METRICS_ROUTE = "/metrics"
# parsing a body this large happens in a worker thread, so /health stays live meanwhile
THREAD_PARSE_BYTES = 1 << 20


class ClientError(Exception):
    """A 4xx the router answers itself, with a message safe to show the client."""

    def __init__(self, status: int, message: str, close: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.close = close  # the rest of the connection's input is unusable: close it

    def response(self) -> web.Response:
        resp = error_response(self.status, self.message)
        if self.close:
            resp.force_close()
        return resp


class RateLimitedLog:
    """At most one record per key per ``period_s``; the next one says how many were dropped."""

    def __init__(self, log: logging.Logger, period_s: float = 10.0) -> None:
        self.log = log
        self.period_s = period_s
        self._last: dict[str, float] = {}
        self._dropped: dict[str, int] = {}

    def __call__(self, level: int, key: str, msg: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._last.get(key, -1e18) < self.period_s:
            self._dropped[key] = self._dropped.get(key, 0) + 1
            return
        self._last[key] = now
        dropped = self._dropped.pop(key, 0)
        suffix = f" ({dropped} like it dropped in the last {self.period_s:g}s)" if dropped else ""
        self.log.log(level, msg + suffix, *args)  # noqa: G003 (msg is the caller's %-format)


def _key_ok(request: web.Request, keys: tuple[str, ...]) -> bool:
    given = request.headers.get("Authorization", "").encode()
    ok = False
    for key in keys:  # compare with every key: no early exit that times which one matched
        ok |= hmac.compare_digest(given, b"Bearer " + key.encode())
    return ok


class Guard:
    def __init__(self, api_key: str | None, admin_api_key: str | None,
                 metrics_api_key: str | None, body_timeout_s: float) -> None:
        self.router_id = os.urandom(8).hex()
        # client routes are keyed by --api-key alone (an admin key also opens them then)
        self.client_keys = tuple(k for k in (api_key, admin_api_key) if k) if api_key else ()
        self.admin_keys = tuple(k for k in (admin_api_key or api_key,) if k)
        self.metrics_keys = tuple(k for k in (metrics_api_key, api_key, admin_api_key) if k)
        self.body_timeout_s = body_timeout_s
        self.rate_log = RateLimitedLog(logger)

    def check_access(self, request: web.Request) -> web.Response | None:
        """None when the request may proceed, else the refusal."""
        if request.headers.get(HOP_HEADER) == self.router_id:
            return error_response(508, "loop detected: this router is registered as its own "
                                       "worker")
        path = request.path
        if path in OPEN_ROUTES:
            return None
        if path in ADMIN_ROUTES:
            if not self.admin_keys:
                return error_response(403, "the admin API is off: start the router with "
                                           "--admin-api-key (or --api-key) to use /workers")
            keys = self.admin_keys
        elif path == METRICS_ROUTE:
            keys = self.metrics_keys
        else:
            keys = self.client_keys
        if keys and not _key_ok(request, keys):
            return error_response(401, "Unauthorized: missing or wrong API key "
                                       "(send 'Authorization: Bearer <key>')")
        return None

    @web.middleware
    async def middleware(self, request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                         ) -> web.StreamResponse:
        refused = self.check_access(request)
        if refused is not None:
            return refused
        try:
            resp = await handler(request)
        except ClientError as e:
            return e.response()
        except web.HTTPException as e:
            if e.status < 400:
                raise
            return error_response(e.status, e.reason)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a router bug: one line at ERROR (rate-limited), details DEBUG
            self.rate_log(logging.ERROR, f"{request.path}:{type(e).__name__}",
                          "%s %s failed: %s", request.method, request.path, type(e).__name__)
            logger.debug("traceback of the failure", exc_info=True)
            return error_response(500, "internal router error")
        if request.path == "/health":
            resp.headers[ID_HEADER] = self.router_id
        return resp

    async def read_json(self, request: web.Request) -> dict[str, Any]:
        """The body as a JSON object, bounded in bytes (an oversized Content-Length is refused
        before anything is read), time and nesting; malformed input raises ClientError."""
        declared = request.content_length
        if declared is not None and declared > MAX_BODY_BYTES:
            raise ClientError(413, f"the request body has {declared} bytes; the limit is "
                                   f"{MAX_BODY_BYTES}", close=True)
        try:
            if request.content.is_eof():  # the whole body came with the head: nothing to wait for
                raw = await self._read(request)
            else:  # a cancel scope, not wait_for: no extra task per request
                async with aio.timeout(self.body_timeout_s):
                    raw = await self._read(request)
        except TimeoutError:
            request.content.feed_eof()  # nothing more is read from this connection
            raise ClientError(408, f"the request body did not arrive within "
                                   f"{self.body_timeout_s:g}s", close=True) from None
        if len(raw) > THREAD_PARSE_BYTES:
            body = await asyncio.get_running_loop().run_in_executor(None, _parse, raw)
        else:
            body = _parse(raw)
        if not isinstance(body, dict):
            raise ClientError(400, "the body must be a JSON object")
        return body

    @staticmethod
    async def _read(request: web.Request) -> bytes:
        chunks, size = [], 0
        try:
            while True:
                chunk = await request.content.readany()
                if not chunk:
                    break
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise ClientError(413, f"the request body exceeds the limit of "
                                           f"{MAX_BODY_BYTES} bytes", close=True)
                chunks.append(chunk)
        except (HttpProcessingError, RequestPayloadError, ValueError) as e:
            # bad chunking or Content-Encoding: the stream is garbage from here on, and
            # aiohttp's drain of the rest would fail again; mark it read
            request.content.feed_eof()
            raise ClientError(400, f"the request body could not be decoded "
                                   f"({type(e).__name__})", close=True) from None
        return b"".join(chunks)


def _parse(raw: bytes) -> Any:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise ClientError(400, f"the body is not JSON: {e}") from None
    # nesting is at most the count of opening brackets (C-speed): walk only when it could be deep
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and json_too_deep(body):
        raise ClientError(400, f"the body nests JSON deeper than {MAX_JSON_DEPTH} levels")
    return body
