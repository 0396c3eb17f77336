"""A scripted fake prefill/decode worker (aiohttp) for the router's tests and its overhead
benchmark: records every body, answers after set delays, fails on demand. Not a model server:
it returns ``n`` fixed tokens in our ``/generate`` shape (OpenAI shapes for the /v1 routes)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web


@dataclass
class FakeBehaviour:
    delay_s: float = 0.0  # before the answer (prefill) or its first byte (decode)
    itl_s: float = 0.0  # between streamed tokens
    status: int = 200  # answer this status instead (with an error body)
    stream_error_code: int = 0  # decode stream: send an SSE error event with this code first
    drop_connection: bool = False  # close the socket without answering
    tokens: int = 4  # tokens answered when the body asks for none
    # a "greedy model": each token a function of the whole sequence before it (input_ids), so a
    # resumed request continues exactly as an uninterrupted one
    deterministic: bool = False
    break_after: int = 0  # decode stream: drop the connection after this many events
    hang_after: int = 0  # decode stream: go silent (health too) after this many events


@dataclass
class FakeWorker:
    kind: str  # "prefill" | "decode"
    behaviour: FakeBehaviour = field(default_factory=FakeBehaviour)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    load: dict[str, Any] = field(default_factory=dict)  # /get_load answer
    server_info: dict[str, Any] = field(default_factory=dict)
    role_requests: list[str] = field(default_factory=list)
    role_route: bool = True  # answer /set_prefill_role (else 404)
    healthy: bool = True
    hung: bool = False  # accept connections, never answer any route (a stopped process)
    cancelled: int = 0  # requests whose client went away before the answer ended
    answered: int = 0  # answers sent in full
    url: str = ""
    _runner: web.AppRunner | None = None

    def _tokens(self, body: dict[str, Any]) -> int:
        n = (body.get("sampling_params") or {}).get("max_new_tokens") or body.get("max_tokens")
        return n if isinstance(n, int) and n > 0 else self.behaviour.tokens

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        b = self.behaviour
        try:
            if b.drop_connection:
                assert request.transport is not None
                request.transport.close()
                await asyncio.sleep(0.05)
                raise ConnectionResetError("dropped on purpose")
            if b.status != 200:
                await asyncio.sleep(b.delay_s)
                return web.json_response({"error": {"message": f"fake {self.kind} failure",
                                                    "code": b.status}}, status=b.status)
            n = self._tokens(body)
            if self.kind == "prefill":
                await asyncio.sleep(b.delay_s)
                self.answered += 1
                return web.json_response(_result(body, 1, n, self.kind))
            if not body.get("stream"):
                await asyncio.sleep(b.delay_s + b.itl_s * (n - 1))
                self.answered += 1
                return web.json_response(_result(body, n, n, self.kind))
            out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await out.prepare(request)
            await asyncio.sleep(b.delay_s)
            if b.stream_error_code:
                await out.write(b"data: " + orjson.dumps(
                    {"error": {"message": "fake stream failure", "code": b.stream_error_code}})
                    + b"\n\n")
            else:
                for i in range(1, n + 1):
                    event = (_greedy(body, i, n) if b.deterministic
                             else _result(body, i, n, self.kind))
                    await out.write(b"data: " + orjson.dumps(event) + b"\n\n")
                    if i == b.break_after:
                        assert request.transport is not None
                        request.transport.abort()
                        raise ConnectionResetError("broke off on purpose")
                    if i == b.hang_after:
                        self.hung = True
                        while self.hung:
                            await asyncio.sleep(0.05)
                    if i < n:
                        await asyncio.sleep(b.itl_s)
            await out.write(b"data: [DONE]\n\n")
            await out.write_eof()
            self.answered += 1
            return out
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    async def _set_role(self, request: web.Request) -> web.Response:
        if not self.role_route:
            return web.json_response({"error": "no route"}, status=404)
        role = orjson.loads(await request.read()).get("role")
        self.role_requests.append(role)
        self.load["prefill_role"] = role
        return web.json_response({"prefill_role": role})

    @web.middleware
    async def _hang(self, request: web.Request, handler):
        while self.hung:
            await asyncio.sleep(0.05)
        return await handler(request)

    async def start(self) -> str:
        app = web.Application(middlewares=[self._hang], client_max_size=64 << 20)
        for path in ("/generate", "/v1/completions", "/v1/chat/completions"):
            app.router.add_post(path, self._generate)

        async def health(_: web.Request) -> web.Response:
            return web.Response(status=200 if self.healthy else 503)

        async def get_load(_: web.Request) -> web.Response:
            return web.json_response(self.load)

        async def server_info(_: web.Request) -> web.Response:
            return web.json_response(self.server_info)

        async def models(_: web.Request) -> web.Response:
            return web.json_response({"object": "list",
                                      "data": [{"id": "fake-model", "object": "model"}]})

        app.router.add_get("/health", health)
        app.router.add_get("/get_load", get_load)
        app.router.add_get("/get_server_info", server_info)
        app.router.add_get("/v1/models", models)
        app.router.add_post("/set_prefill_role", self._set_role)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


def _result(body: dict[str, Any], i: int, n: int, kind: str) -> dict[str, Any]:
    return {"text": " tok" * i, "output_ids": [100 + j for j in range(i)],
            "meta_info": {"id": str(body.get("bootstrap_room")), "completion_tokens": i,
                          "finish_reason": {"type": "length", "length": n} if i == n else None,
                          "served_by": kind, "t": time.monotonic()}}


def _greedy(body: dict[str, Any], i: int, n: int) -> dict[str, Any]:
    seq = list(body.get("input_ids") or [1])
    out: list[int] = []
    for _ in range(i):
        out.append((sum(seq) * 31 + len(seq)) % 997)
        seq.append(out[-1])
    return {"text": "".join(f" t{t}" for t in out), "output_ids": out,
            "meta_info": {"prompt_tokens": len(body.get("input_ids") or []),
                          "completion_tokens": i,
                          "finish_reason": {"type": "length", "length": n} if i == n else None}}
