"""The lean HTTP/1.1 client of the router's generation legs (leg_client.py), against a raw
asyncio server that answers each request with scripted bytes: content-length and chunked
bodies, keep-alive reuse, a worker closing the connection, timeouts, oversized heads/bodies."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from sglang_pd_router.leg_client import (PAUSE_BYTES, LegClient, LegError, LegLimits,
                                         header_block)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[bool]]


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head, await reader.readexactly(length)


class Server:
    """Answers each request with ``handler(reader, writer, n)``; it returns whether to keep the
    connection open for the next request. Counts connections and records request heads."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.heads: list[bytes] = []
        self.bodies: list[bytes] = []
        self.server: asyncio.AbstractServer | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head, body = await read_request(reader)
                self.heads.append(head)
                self.bodies.append(body)
                if not await self.handler(reader, writer, len(self.heads)):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


def fixed(response: bytes, keep: bool = True) -> Handler:
    async def handler(_r: asyncio.StreamReader, w: asyncio.StreamWriter, _n: int) -> bool:
        w.write(response)
        await w.drain()
        return keep
    return handler


OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}"


def run(main: Callable[[], Awaitable[None]]) -> None:
    """Under asyncio's own loop and under uvloop (the router's), when installed."""
    async def bounded() -> None:
        await asyncio.wait_for(main(), 20)
    asyncio.run(bounded())
    try:
        import uvloop
    except ImportError:
        return
    loop = uvloop.new_event_loop()
    try:
        loop.run_until_complete(bounded())
    finally:
        loop.close()


def test_content_length_body_and_request_bytes() -> None:
    async def main() -> None:
        srv = Server(fixed(OK))
        async with srv as url:
            client = LegClient()
            resp = await client.post(url, "/generate", b'{"a":1}',
                                     header_block({"X-Request-Id": "r1"}))
            assert resp.status == 200
            assert resp.content_type == "application/json"
            assert resp.headers == {"content-type": "application/json", "content-length": "11"}
            assert await resp.read() == b'{"ok":true}'
            resp.release()
            await client.close()
        head = srv.heads[0]
        assert head.startswith(b"POST /generate HTTP/1.1\r\n")
        assert b"Content-Length: 7\r\n" in head and b"X-Request-Id: r1\r\n" in head
        assert b"Host: 127.0.0.1:" in head
        assert srv.bodies == [b'{"a":1}']
    run(main)


def test_chunked_stream_arrives_chunk_by_chunk() -> None:
    async def handler(_r: asyncio.StreamReader, w: asyncio.StreamWriter, _n: int) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n")
        for event in (b"data: 1\n\n", b"data: 2\n\n"):
            w.write(b"%x\r\n%s\r\n" % (len(event), event))
            await w.drain()
            await asyncio.sleep(0.05)
        w.write(b"0\r\n\r\n")
        await w.drain()
        return True

    async def main() -> None:
        async with Server(handler) as url:
            client = LegClient()
            resp = await client.post(url, "/generate", b"{}", b"")
            first = await resp.readany()
            assert first == b"data: 1\n\n"  # handed on before the rest was sent
            rest = [chunk async for chunk in resp.iter_any()]
            assert b"".join(rest) == b"data: 2\n\n"
            assert await resp.readany() == b""
            resp.release()
            await client.close()
    run(main)


def test_keep_alive_reuses_one_connection() -> None:
    async def main() -> None:
        srv = Server(fixed(OK))
        async with srv as url:
            client = LegClient()
            for _ in range(3):
                resp = await client.post(url, "/generate", b"{}", b"")
                assert await resp.read() == b'{"ok":true}'
                resp.release()
            await client.close()
        assert srv.connections == 1 and len(srv.heads) == 3
    run(main)


def test_closed_or_unread_connections_are_not_reused() -> None:
    async def main() -> None:
        srv = Server(fixed(OK))
        async with srv as url:
            client = LegClient()
            resp = await client.post(url, "/generate", b"{}", b"")
            resp.close()  # dropped before reading: the connection goes
            resp = await client.post(url, "/generate", b"{}", b"")
            await resp.read()
            resp.release()
            await client.close()
        assert srv.connections == 2
    run(main)


def test_worker_closing_after_answer_gets_a_new_connection() -> None:
    async def main() -> None:
        srv = Server(fixed(OK, keep=False))
        async with srv as url:
            client = LegClient()
            for _ in range(3):
                resp = await client.post(url, "/generate", b"{}", b"")
                assert await resp.read() == b'{"ok":true}'
                resp.release()
                await asyncio.sleep(0.05)  # the worker's FIN arrives
            await client.close()
        assert srv.connections == 3
    run(main)


def test_stale_kept_alive_connection_is_retried_once_on_a_new_one() -> None:
    async def main() -> None:
        srv = Server(fixed(OK, keep=False))
        async with srv as url:
            client = LegClient()
            resp = await client.post(url, "/generate", b"{}", b"")
            await resp.read()
            conn = resp._conn
            resp.release()
            conn.closed = False  # as if the worker's FIN had not arrived yet
            resp = await client.post(url, "/generate", b"{}", b"")
            assert await resp.read() == b'{"ok":true}'
            resp.release()
            await client.close()
        assert srv.connections == 2
    run(main)


def test_connection_closed_mid_body_is_an_error() -> None:
    truncated = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"partial\""

    async def main() -> None:
        async with Server(fixed(truncated, keep=False)) as url:
            client = LegClient()
            resp = await client.post(url, "/generate", b"{}", b"")
            with pytest.raises(LegError, match="closed"):
                await resp.read()
            await client.close()
    run(main)


def test_body_until_close_without_length() -> None:
    async def main() -> None:
        async with Server(fixed(b"HTTP/1.1 200 OK\r\n\r\nall of it", keep=False)) as url:
            client = LegClient()
            resp = await client.post(url, "/generate", b"{}", b"")
            assert await resp.read() == b"all of it"
            resp.release()
            assert not client._pools[url][0].idle  # an ended connection is not pooled
            await client.close()
    run(main)


def test_refused_connection_is_an_oserror() -> None:
    async def main() -> None:
        srv = Server(fixed(OK))
        async with srv as url:
            pass  # closed again: nothing listens there now
        with pytest.raises(OSError):
            await LegClient().post(url, "/generate", b"{}", b"")
    run(main)


def test_silent_worker_times_out() -> None:
    async def silent(_r: asyncio.StreamReader, _w: asyncio.StreamWriter, _n: int) -> bool:
        await asyncio.sleep(5)
        return False

    async def main() -> None:
        async with Server(silent) as url:
            client = LegClient(LegLimits(read_timeout_s=0.2))
            with pytest.raises(asyncio.TimeoutError):
                await client.post(url, "/generate", b"{}", b"")
            await client.close()
    run(main)


def test_stream_that_stops_mid_body_times_out() -> None:
    async def stalls(_r: asyncio.StreamReader, w: asyncio.StreamWriter, _n: int) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await w.drain()
        await asyncio.sleep(5)
        return False

    async def main() -> None:
        async with Server(stalls) as url:
            client = LegClient(LegLimits(read_timeout_s=0.3))
            resp = await client.post(url, "/generate", b"{}", b"")
            assert await resp.readany() == b"hello"
            with pytest.raises(asyncio.TimeoutError):
                await resp.readany()
            await client.close()
    run(main)


@pytest.mark.parametrize("head", [
    b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 9000 + b"\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(200))
    + b"Content-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: " % i + b"c" * 8000 + b"\r\n" for i in range(10))
    + b"Content-Length: 0\r\n\r\n",  # each header fits, all of them do not
])
def test_oversized_heads_are_refused(head: bytes) -> None:
    async def main() -> None:
        async with Server(fixed(head, keep=False)) as url:
            client = LegClient()
            with pytest.raises(LegError):
                await client.post(url, "/generate", b"{}", b"")
            await client.close()
    run(main)


def test_head_trickled_without_end_is_bounded() -> None:
    async def endless(_r: asyncio.StreamReader, w: asyncio.StreamWriter, _n: int) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\n")
        for i in range(200):
            w.write(b"X-%d: " % i + b"d" * 1000 + b"\r\n")
            await w.drain()
        await asyncio.sleep(5)
        return False

    async def main() -> None:
        async with Server(endless) as url:
            client = LegClient(LegLimits(max_headers=1000))
            with pytest.raises(LegError, match="head over"):
                await client.post(url, "/generate", b"{}", b"")
            await client.close()
    run(main)


def test_body_larger_than_the_pause_mark_is_read_whole() -> None:
    body = bytes(range(256)) * (3 * PAUSE_BYTES // 256)
    response = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body

    async def main() -> None:
        async with Server(fixed(response)) as url:
            client = LegClient(LegLimits(read_timeout_s=5))
            resp = await client.post(url, "/generate", b"{}", b"")
            assert await resp.read() == body  # a socket paused at the mark is resumed
            resp.release()
            await client.close()
    run(main)


def test_body_over_the_limit_is_refused() -> None:
    big = b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n" + b"x" * 5000

    async def main() -> None:
        async with Server(fixed(big)) as url:
            client = LegClient(LegLimits(max_body_bytes=1000))
            resp = await client.post(url, "/generate", b"{}", b"")
            with pytest.raises(LegError, match="over 1000 bytes"):
                await resp.read()
            await client.close()
    run(main)


@pytest.mark.parametrize("answer", [
    b"NOT HTTP AT ALL\r\n\r\n",
    b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: x\r\n\r\nzz",
])
def test_malformed_or_upgrading_answer_is_an_error(answer: bytes) -> None:
    async def main() -> None:
        async with Server(fixed(answer, keep=False)) as url:
            client = LegClient()
            with pytest.raises(LegError, match="bad response"):
                await client.post(url, "/generate", b"{}", b"")
            await client.close()
    run(main)


def test_cancelled_leg_closes_its_connection() -> None:
    async def main() -> None:
        seen_eof = asyncio.Event()

        async def waits(r: asyncio.StreamReader, _w: asyncio.StreamWriter, _n: int) -> bool:
            await r.read()  # returns at EOF: the client dropped the request
            seen_eof.set()
            return False

        async with Server(waits) as url:
            client = LegClient()
            task = asyncio.ensure_future(client.post(url, "/generate", b"{}", b""))
            await asyncio.sleep(0.1)
            task.cancel()
            await asyncio.wait_for(seen_eof.wait(), 5)
            await client.close()
    run(main)


def test_header_block_refuses_injection() -> None:
    assert header_block({"A": "1", "B": "x y"}) == b"A: 1\r\nB: x y\r\n"
    for bad in ({"A": "1\r\nEvil: 1"}, {"A\n": "1"}, {"": "1"}, {"A:B": "1"}):
        with pytest.raises(ValueError):
            header_block(bad)


def test_start_writes_on_an_idle_connection_before_any_await() -> None:
    """``start`` sends the request at once on a kept-alive connection (the worker reads it
    while the caller has not yielded yet); ``finish`` reads the answer on it."""
    async def main() -> None:
        srv = Server(fixed(OK))
        async with srv as url:
            client = LegClient()
            resp = await client.post(url, "/generate", b"{}", b"")  # one kept-alive conn
            await resp.read()
            resp.release()
            loop = asyncio.get_running_loop()
            started = client.start(url, "/generate", b'{"a":1}', b"", loop)
            assert started.conn is not None  # written already, on the idle connection
            await asyncio.sleep(0.2)  # nobody has awaited the answer yet: the worker got it
            assert srv.bodies[-1] == b'{"a":1}'
            resp = await client.finish(started)
            assert await resp.read() == b'{"ok":true}'
            resp.release()
            await client.close()
        assert srv.connections == 1
    run(main)


def test_a_started_leg_never_taken_over_is_dropped() -> None:
    """A leg whose task was cancelled before it ran: ``drop`` closes its connection, which the
    worker sees as the request's end (no wait for the read timer)."""
    async def main() -> None:
        seen_eof = asyncio.Event()

        async def first_ok_then_wait(r: asyncio.StreamReader, w: asyncio.StreamWriter,
                                     n: int) -> bool:
            if n == 1:
                w.write(OK)
                await w.drain()
                return True
            await r.read()  # returns at EOF: the client dropped the request
            seen_eof.set()
            return False

        async with Server(first_ok_then_wait) as url:
            client = LegClient()
            resp = await client.post(url, "/generate", b"{}", b"")
            await resp.read()
            resp.release()
            started = client.start(url, "/generate", b"{}", b"", asyncio.get_running_loop())
            task = asyncio.get_running_loop().create_task(client.finish(started))
            task.cancel()  # before its first step: finish never runs
            with pytest.raises(asyncio.CancelledError):
                await task
            assert not started.taken
            started.drop()
            await asyncio.wait_for(seen_eof.wait(), 5)
            started.drop()  # idempotent
            await client.close()
    run(main)
