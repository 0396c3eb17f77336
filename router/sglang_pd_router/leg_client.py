"""A lean HTTP/1.1 client for the generation legs (the prefill and decode requests, two per
routed request): one small pool of keep-alive connections per worker, the request written as one
pre-built bytes object. aiohttp's client spent about 40% of the router's CPU on these two
requests; aiohttp stays for everything else (health and load probes, discovery, admin).

This file holds the pool, the client and ``header_block``; the connection protocol and response
reading live in leg_conn.py (their bounds and failures are described there), whose public names
are re-exported here so callers import everything from leg_client."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from .aio import timeout
from .leg_conn import PAUSE_BYTES, LegError, LegLimits, LegResponse, _Conn

__all__ = ["PAUSE_BYTES", "LegClient", "LegError", "LegLimits", "LegResponse", "LegStart",
           "header_block"]


class _Pool:
    """Idle keep-alive connections to one worker (most recently used first out)."""

    def __init__(self, host: str, port: int, limits: LegLimits) -> None:
        self.host = host
        self.port = port
        self.limits = limits
        self.idle: list[_Conn] = []

    def get_idle(self) -> _Conn | None:
        idle = self.idle
        if idle:
            oldest_ok = time.monotonic() - self.limits.idle_ttl_s
            while idle:
                conn = idle.pop()
                if not conn.closed and conn.idle_since >= oldest_ok:
                    return conn
                conn.close()
        return None

    async def connect(self, loop: asyncio.AbstractEventLoop) -> _Conn:
        limits = self.limits
        try:
            async with timeout(limits.connect_timeout_s):
                _, proto = await loop.create_connection(lambda: _Conn(limits), self.host,
                                                        self.port)
        except TimeoutError:
            raise asyncio.TimeoutError(f"connecting to {self.host}:{self.port} took over "
                                       f"{limits.connect_timeout_s:g}s") from None
        assert isinstance(proto, _Conn)
        return proto

    def put(self, conn: _Conn) -> None:
        if conn.reusable() and len(self.idle) < self.limits.max_idle:
            conn.idle_since = time.monotonic()
            self.idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        for conn in self.idle:
            conn.close()
        self.idle.clear()


class LegClient:
    """``post(url, path, body, headers)`` -> an open ``LegResponse``; one pool per worker URL.
    ``headers`` is a block of ``Name: value\\r\\n`` lines (see ``header_block``)."""

    def __init__(self, limits: LegLimits | None = None) -> None:
        self.limits = limits or LegLimits()
        self._pools: dict[str, tuple[_Pool, bytes]] = {}

    def _pool(self, url: str) -> tuple[_Pool, bytes]:
        found = self._pools.get(url)
        if found is None:
            parts = urlsplit(url)
            if parts.scheme != "http" or not parts.hostname:
                raise LegError(f"the legs speak plain http, not {url!r}")
            port = parts.port or 80
            host = parts.hostname
            netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            found = self._pools[url] = (_Pool(host, port, self.limits),
                                        f"Host: {netloc}\r\n".encode("latin-1"))
        return found

    def start(self, url: str, path: str, body: bytes, headers: bytes,
              loop: asyncio.AbstractEventLoop) -> LegStart:
        """Builds the request and, when a kept-alive connection is idle, writes it now, in the
        caller's step: the worker gets it before the caller's task yields, instead of on the
        next loop turn when the leg's task first runs (its share of the first byte's path).
        ``finish`` reads the answer (or connects and writes first, when none was idle)."""
        try:
            pool, host_line = self._pool(url)
        except LegError as e:  # raised by ``finish``, in the leg's task, as it was before
            failed = LegStart(None, b"", None)
            failed.error = e
            return failed
        request = b"".join((b"POST ", path.encode("latin-1"), b" HTTP/1.1\r\n", host_line,
                            b"Content-Length: ", str(len(body)).encode(), b"\r\n", headers,
                            b"\r\n", body))
        started = LegStart(pool, request, pool.get_idle())
        if started.conn is not None:
            try:
                started.conn.send(request, loop)
            except (RuntimeError, OSError) as e:  # raised in the leg's task by ``finish``
                started.conn.close()
                started.error = e
        return started

    async def finish(self, started: LegStart) -> LegResponse:
        started.taken = True
        pool, request, conn = started.pool, started.request, started.conn
        if started.error is not None:
            raise started.error
        assert pool is not None
        loop = asyncio.get_running_loop()
        if conn is not None:
            try:
                return await self._answer(conn, pool)
            except LegError:
                # a kept-alive connection the worker closed as we reused it (nothing came
                # back, so the worker never read the request): once more on a new one
                if conn.head_bytes or conn.head_done:
                    raise
        return await self._exchange(await pool.connect(loop), pool, request, loop)

    async def post(self, url: str, path: str, body: bytes, headers: bytes) -> LegResponse:
        return await self.finish(self.start(url, path, body, headers,
                                            asyncio.get_running_loop()))

    @classmethod
    async def _exchange(cls, conn: _Conn, pool: _Pool, request: bytes,
                        loop: asyncio.AbstractEventLoop) -> LegResponse:
        try:
            conn.send(request, loop)
        except BaseException:
            conn.close()
            raise
        return await cls._answer(conn, pool)

    @staticmethod
    async def _answer(conn: _Conn, pool: _Pool) -> LegResponse:
        """The response's head, on a connection whose request was written."""
        try:
            while not conn.head_done:
                await conn.wait()
        except BaseException:
            conn.close()
            raise
        return LegResponse(conn, pool)

    async def close(self) -> None:
        for pool, _ in self._pools.values():
            pool.close()
        self._pools.clear()


@dataclass(slots=True, eq=False)
class LegStart:
    """A leg's request, built (and written when a connection was idle) by ``LegClient.start``;
    ``LegClient.finish`` takes it over. One never taken over (its task cancelled before it
    ran) must be ``drop``ped, so its written request does not wait for the read timer."""

    pool: _Pool | None
    request: bytes
    conn: _Conn | None  # None: no idle connection, ``finish`` connects
    taken: bool = False
    error: Exception | None = None  # writing on the idle connection failed

    def drop(self) -> None:
        if not self.taken and self.conn is not None:
            self.taken = True
            self.conn.close()  # aborts the request at the worker


def header_block(headers: dict[str, str]) -> bytes:
    """``Name: value\\r\\n`` lines; a name or value that would split the request is refused."""
    text = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
    # one CR and one LF per line: any other in a name or value would end a line early
    if text.count("\r") != len(headers) or text.count("\n") != len(headers) or "\0" in text \
            or any(not name or ":" in name for name in headers):
        raise ValueError(f"a header in {list(headers)!r} cannot be sent")
    # aiohttp's server decodes header bytes as UTF-8 with surrogateescape: this restores them
    return text.encode("utf-8", "surrogateescape")
