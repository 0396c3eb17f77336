"""The connection side of the legs' HTTP/1.1 client (leg_client.py): ``_Conn``, the asyncio
Protocol of one keep-alive connection, whose response httptools parses, and ``LegResponse``, the
leg's view of the answer read from it; with ``LegError`` and ``LegLimits``. Split from the pool
(leg_client.py) so each file holds one job.

Every wait is bounded: connecting by ``connect_timeout_s``, and every read of a leg by
``read_timeout_s`` from the moment its request was written (a safety net behind the request's
own timeout scope, which normally fires first). Reads are bounded too: the status line and
headers by ``max_head_bytes`` (and each header by ``max_field_bytes``, their count by
``max_headers``), a body read whole by ``max_body_bytes``; a streamed body is handed on chunk by
chunk and stops the socket's reading while ``PAUSE_BYTES`` wait unread. Failures raise
``LegError`` (a ``ConnectionError``, so an ``OSError``) or ``asyncio.TimeoutError``; a cancelled
or failed leg closes its connection, which is how the worker learns the request was dropped."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import httptools

if TYPE_CHECKING:
    from .leg_client import _Pool

PAUSE_BYTES = 1 << 20  # unread stream bytes at which the socket stops reading until drained


class LegError(ConnectionError):
    """The worker's connection failed: refused, closed early, or a malformed/oversized answer."""


@dataclass(frozen=True)
class LegLimits:
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 600.0
    max_head_bytes: int = 64 * 1024
    max_field_bytes: int = 8190  # one header's name or value (aiohttp's line limit)
    max_headers: int = 128
    max_body_bytes: int = 1 << 30
    idle_ttl_s: float = 2.0  # under uvicorn's 5 s keep-alive: never reuse one it may be closing
    max_idle: int = 256  # idle connections kept per worker


class _Conn(asyncio.Protocol):
    """One keep-alive connection; at most one request on it at a time."""

    def __init__(self, limits: LegLimits) -> None:
        self.limits = limits
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []  # decoded only when asked for
        self.head_done = False
        self.keep_alive = False
        self.complete = False
        self.error: BaseException | None = None
        self.chunks: list[bytes] = []
        self.buffered = 0
        self.head_bytes = 0  # bytes read while the head was incomplete
        self.head_size = 0  # the headers parsed so far
        self.paused = False
        self.waiter: asyncio.Future[None] | None = None
        self.timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of it
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def data_received(self, data: bytes) -> None:
        if self.complete or self.error is not None:
            self._fail(LegError("the worker sent bytes outside a response"))
            return
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as e:
            cause = e.__context__ if isinstance(e.__context__, LegError) else e
            self._fail(LegError(f"bad response from the worker: {cause}"))
            return
        if not self.head_done:
            self.head_bytes += len(data)
            if self.head_bytes > self.limits.max_head_bytes:
                self._fail(LegError(f"response head over {self.limits.max_head_bytes} bytes"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.complete or self.error is not None:
            return
        if self.head_done and not any(name.lower() in (b"content-length", b"transfer-encoding")
                                      for name, _ in self.raw_headers):
            self.on_message_complete()  # a body delimited by the connection's end
            return
        self._fail(LegError("the worker closed the connection" + (f": {exc}" if exc else "")))

    # ------------------------------------------------------------------ httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        limits = self.limits
        size = self.head_size = self.head_size + len(name) + len(value) + 4
        if len(name) > limits.max_field_bytes or len(value) > limits.max_field_bytes:
            raise LegError(f"a response header over {limits.max_field_bytes} bytes")
        if size > limits.max_head_bytes:  # a whole head can come in one read
            raise LegError(f"response head over {limits.max_head_bytes} bytes")
        headers = self.raw_headers
        if len(headers) >= limits.max_headers:
            raise LegError(f"over {limits.max_headers} response headers")
        headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()  # valid while parsing only
        self.head_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered >= PAUSE_BYTES and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self._wake()

    # ------------------------------------------------------------------ the leg's side
    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        self.close()
        self._wake()

    def _expire(self) -> None:
        self.timer = None
        self._fail(asyncio.TimeoutError(f"no complete answer within "
                                        f"{self.limits.read_timeout_s:g}s"))

    def send(self, request: bytes, loop: asyncio.AbstractEventLoop) -> None:
        assert self.transport is not None
        self._reset()
        self.timer = loop.call_later(self.limits.read_timeout_s, self._expire)
        self.transport.write(request)

    async def wait(self) -> None:
        """Until something new arrives (or the connection fails: raises)."""
        if self.error is not None:
            raise self.error
        waiter = self.waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self.waiter = None
        if self.error is not None:
            raise self.error

    def take(self) -> bytes:
        chunks = self.chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self.chunks = []
        self.buffered = 0
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return data

    def reusable(self) -> bool:
        return self.complete and self.error is None and not self.closed \
            and not self.chunks and self.keep_alive

    def close(self) -> None:
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.transport is not None:
            self.transport.close()


class LegResponse:
    """A worker's answer: status and headers at once, the body read whole or chunk by chunk.
    ``release`` returns a fully read connection to its pool; ``close`` drops it (aborting the
    request at the worker when the body was not read to the end)."""

    def __init__(self, conn: _Conn, pool: _Pool) -> None:
        self._conn = conn
        self._pool: _Pool | None = pool
        self.status = conn.status
        self._headers: dict[str, str] | None = None

    @property
    def headers(self) -> dict[str, str]:
        """Names lower-cased (built on first use: the hot path reads only the content type)."""
        if self._headers is None:
            self._headers = {name.decode("latin-1").lower(): value.decode("latin-1")
                             for name, value in self._conn.raw_headers}
        return self._headers

    @property
    def content_type(self) -> str:
        for name, value in self._conn.raw_headers:
            if len(name) == 12 and name.lower() == b"content-type":
                return value.decode("latin-1").split(";", 1)[0].strip()
        return "application/octet-stream"

    @property
    def ended(self) -> bool:
        """The whole body arrived and was read: ``readany`` would return b"" at once."""
        conn = self._conn
        return conn.complete and not conn.chunks

    @property
    def content(self) -> LegResponse:  # aiohttp's spelling: ``resp.content.readany()``
        return self

    async def readany(self) -> bytes:
        """The bytes that arrived since the last read; b"" once the body ended."""
        conn = self._conn
        while not conn.chunks:
            if conn.complete:
                return b""
            await conn.wait()
        return conn.take()

    async def iter_any(self) -> AsyncIterator[bytes]:
        while chunk := await self.readany():
            yield chunk

    async def read(self) -> bytes:
        """The whole body (taken as it comes, so a paused socket resumes), at most
        ``max_body_bytes``."""
        conn = self._conn
        limit = conn.limits.max_body_bytes
        parts: list[bytes] = []
        size = 0
        while True:
            if conn.chunks:
                part = conn.take()
                parts.append(part)
                size += len(part)
                if size > limit:
                    conn.close()
                    raise LegError(f"response body over {limit} bytes")
            if conn.complete:
                return parts[0] if len(parts) == 1 else b"".join(parts)
            await conn.wait()

    def release(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.put(self._conn)

    def close(self) -> None:
        self._pool = None
        self._conn.close()

