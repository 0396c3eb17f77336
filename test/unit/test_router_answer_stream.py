"""``answer_stream`` when the client leaves: a streaming client may close as soon as it reads
``[DONE]`` (bench_serving does), before decode's stream has ended, so the router's next write
meets a closed socket. That is the client leaving, not a router failure: the handler returns
quietly (aiohttp's own write_eof then sees the closed socket and lets it go), and no ERROR line
is logged. A decode that breaks off still ends the client's stream with an error event."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import aiohttp
import pytest

from sglang_pd_router import answer
from sglang_pd_router.answer import DecodeHead, answer_stream

DONE = b"data: [DONE]\n\n"


@dataclass
class FakeDecodeStream:
    """Decode's open stream: ``chunks`` in order, then its end (``ended``) or a break."""
    chunks: list[bytes]
    break_with: Exception | None = None
    ended: bool = False

    async def readany(self) -> bytes:
        if not self.chunks:
            if self.break_with is not None:
                raise self.break_with
            self.ended = True
            return b""
        return self.chunks.pop(0)


@dataclass
class FakeClientStream:
    """The client's stream; the socket closes after ``open_writes`` writes."""
    open_writes: int
    written: list[bytes] = field(default_factory=list)
    eof: bytes | None = None

    def _send(self, data: bytes) -> None:
        if len(self.written) >= self.open_writes:
            raise aiohttp.ClientConnectionResetError("Cannot write to closing transport")
        self.written.append(data)

    async def write(self, data: bytes) -> None:
        self._send(data)

    async def write_eof(self, data: bytes = b"") -> None:
        self._send(data)
        self.eof = data


@dataclass
class FakeRequest:
    method: str = "POST"
    path: str = "/generate"


async def _answer(monkeypatch: pytest.MonkeyPatch, decode: FakeDecodeStream,
                  client: FakeClientStream) -> None:
    async def fake_open(request, head, with_first_write=False):  # type: ignore[no-untyped-def]
        return client
    monkeypatch.setattr(answer, "open_stream", fake_open)
    first = decode.chunks.pop(0)
    head = DecodeHead(resp=decode, first=first, done=False)  # type: ignore[arg-type]
    assert await answer_stream(FakeRequest(), head) is client  # type: ignore[arg-type]


async def test_client_gone_after_done_returns_quietly(monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    # decode sends a token, then [DONE], then ends; the client reads both and closes
    client = FakeClientStream(open_writes=2)
    with caplog.at_level(logging.DEBUG, logger="sglang_pd_router"):
        await _answer(monkeypatch, FakeDecodeStream([b"data: {\"text\": \"a\"}\n\n", DONE]), client)
    assert client.written[-1] == DONE and client.eof is None
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "client left mid-stream" in caplog.text


async def test_client_gone_mid_stream_is_not_a_decode_break(monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    client = FakeClientStream(open_writes=1)
    with caplog.at_level(logging.DEBUG, logger="sglang_pd_router"):
        await _answer(monkeypatch, FakeDecodeStream([b"data: 1\n\n", b"data: 2\n\n", DONE]), client)
    assert client.written == [b"data: 1\n\n"]
    assert "decode stream broke off" not in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_whole_stream_ends_with_its_last_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    client = FakeClientStream(open_writes=10)
    await _answer(monkeypatch, FakeDecodeStream([b"data: 1\n\n", DONE]), client)
    assert client.written == [b"data: 1\n\n", DONE, b""] and client.eof == b""


async def test_decode_break_ends_the_stream_with_an_error_event(monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    client = FakeClientStream(open_writes=10)
    decode = FakeDecodeStream([b"data: 1\n\n", b"data: 2\n\n"],
                              break_with=aiohttp.ClientPayloadError("decode died"))
    with caplog.at_level(logging.DEBUG, logger="sglang_pd_router"):
        await _answer(monkeypatch, decode, client)
    assert client.written[:2] == [b"data: 1\n\n", b"data: 2\n\n"]
    assert client.eof is not None and b"decode connection lost" in client.eof
    assert "decode stream broke off" in caplog.text
