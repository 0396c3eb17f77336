"""The project's one fake server (aiohttp), for tests and benchmarks that need no model.

A ``FakeWorker`` answers SGLang's and OpenAI's generation routes after scripted delays,
records every body and header, and fails on demand. As a ``prefill`` or ``decode`` worker it
answers in the PD shape the router's tests check (fake_answers.pd_event); with
``api_shapes=True`` it answers as a serving benchmark sees a real server (ids, usage, OpenAI
chunks), and its load model (per-token prefill, serial prefill, decode slowdown) makes rate
sweeps look real: ``python -m sglang_pd.bench.stub_server`` is this server behind a CLI.
Token times are absolute from the request's arrival, so delays do not accumulate.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from sglang_pd_router.fake_answers import (
    ROUTE_KINDS,
    api_event,
    api_whole,
    greedy_event,
    max_tokens,
    pd_event,
    prompt_len,
    usage,
)


@dataclass
class FakeBehaviour:
    delay_s: float = 0.0  # before the answer (prefill) or its first token (decode)
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
    # load model of a serving benchmark's stub
    prefill_s_per_token: float = 0.0  # first token after delay_s + this x prompt tokens
    serial_prefill: bool = False  # prefills queue one at a time
    decode_slowdown: float = 0.0  # ITL stretched by this fraction per other request decoding
    fail_every: int = 0  # the k-th, 2k-th, ... request gets HTTP 400 (0: never)
    stream_error_every: int = 0  # the k-th, ... streamed request breaks off with an error event


def _words(text: str) -> int:
    return len(text.split())


@dataclass
class FakeWorker:
    kind: str  # "prefill" | "decode" | "colocated"
    behaviour: FakeBehaviour = field(default_factory=FakeBehaviour)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    load: dict[str, Any] = field(default_factory=dict)  # /get_load answer
    server_info: dict[str, Any] = field(default_factory=dict)  # /get_server_info and the like
    model: str = "fake-model"  # /v1/models
    api_shapes: bool = False  # answer as a real server (see the module doc), else the PD shape
    count_tokens: Callable[[str], int] = _words  # prompt tokens of a text (api_shapes)
    keep_bodies: int = 0  # remember only the last N bodies and headers (0: all)
    role_requests: list[str] = field(default_factory=list)
    role_route: bool = True  # answer /set_prefill_role (else 404)
    healthy: bool = True
    hung: bool = False  # accept connections, never answer any route (a stopped process)
    cancelled: int = 0  # requests whose client went away before the answer ended
    answered: int = 0  # answers sent in full
    received: int = 0  # generation requests received (numbers them: fail_every, ids)
    url: str = ""
    _decoding: int = 0
    _prefill_lock: asyncio.Lock | None = None
    _runner: web.AppRunner | None = None

    def reset(self) -> None:
        """Forget the requests seen (the stub's /stub/config does this)."""
        self.received = 0
        self.bodies.clear()
        self.headers.clear()

    def _record(self, body: dict[str, Any], request: web.Request) -> int:
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        if self.keep_bodies and len(self.bodies) > self.keep_bodies:
            del self.bodies[:-self.keep_bodies], self.headers[:-self.keep_bodies]
        self.received += 1
        return self.received

    async def _first_token_at(self, t0: float, plen: int) -> float:
        b = self.behaviour
        prefill_s = b.delay_s + b.prefill_s_per_token * plen
        if not b.serial_prefill:
            return t0 + prefill_s
        if self._prefill_lock is None:
            self._prefill_lock = asyncio.Lock()
        async with self._prefill_lock:
            await asyncio.sleep(prefill_s)
        return time.monotonic()

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        t0 = time.monotonic()
        route = ROUTE_KINDS[request.path]
        body = orjson.loads(await request.read())
        num = self._record(body, request)
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
            if b.fail_every and num % b.fail_every == 0:
                return web.json_response({"error": {"message": "stub: rejected on purpose"}}, status=400)
            n = max_tokens(body)
            if not isinstance(n, int) or n < 1:
                if self.api_shapes:
                    return web.json_response({"detail": "max tokens must be a positive integer"}, status=422)
                n = b.tokens
            if self.kind == "prefill":
                await asyncio.sleep(b.delay_s)
                self.answered += 1
                return web.json_response(pd_event(body, 1, n, self.kind))
            plen = prompt_len(route, body, self.count_tokens) if self.api_shapes else 0
            t_tok = await self._first_token_at(t0, plen)
            if not body.get("stream"):
                self._decoding += 1
                try:
                    await _sleep_until(t_tok + (n - 1) * b.itl_s)
                finally:
                    self._decoding -= 1
                self.answered += 1
                return web.json_response(api_whole(route, f"stub-{num}", n, plen, t0) if self.api_shapes
                                         else pd_event(body, n, n, self.kind))
            return await self._stream(request, route, body, num, n, plen, t0, t_tok)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    async def _stream(self, request: web.Request, route: str, body: dict[str, Any], num: int, n: int,
                      plen: int, t0: float, t_tok: float) -> web.StreamResponse:
        b = self.behaviour
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await out.prepare(request)
        if self.api_shapes and route == "chat":  # real servers open with a role-only delta
            await _event(out, {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        if b.stream_error_code:
            await _sleep_until(t_tok)
            await _event(out, {"error": {"message": "fake stream failure", "code": b.stream_error_code}})
        else:
            self._decoding += 1
            try:
                for i in range(1, n + 1):
                    await _sleep_until(t_tok)
                    if self.api_shapes:
                        await _event(out, api_event(route, f"stub-{num}", i, n, plen, t0))
                    else:
                        await _event(out, greedy_event(body, i, n) if b.deterministic
                                     else pd_event(body, i, n, self.kind))
                    if b.stream_error_every and num % b.stream_error_every == 0:
                        await _event(out, {"error": {"message": "stub: failed mid-stream"}})
                        break
                    if i == b.break_after:
                        assert request.transport is not None
                        request.transport.abort()
                        raise ConnectionResetError("broke off on purpose")
                    if i == b.hang_after:
                        self.hung = True
                        while self.hung:
                            await asyncio.sleep(0.05)
                        t_tok = time.monotonic()
                    t_tok += b.itl_s * (1.0 + b.decode_slowdown * max(self._decoding - 1, 0))
            finally:
                self._decoding -= 1
        if self.api_shapes and route != "generate" and (body.get("stream_options") or {}).get("include_usage"):
            await _event(out, {"id": f"stub-{num}", "choices": [], "usage": usage(plen, n)})
        await out.write(b"data: [DONE]\n\n")
        await out.write_eof()
        self.answered += 1
        return out

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

    def make_app(self) -> web.Application:
        app = web.Application(middlewares=[self._hang], client_max_size=64 << 20)
        for path in ROUTE_KINDS:
            app.router.add_post(path, self._generate)

        async def health(_: web.Request) -> web.Response:
            return web.Response(text="ok") if self.healthy else web.Response(status=503)

        async def get_load(_: web.Request) -> web.Response:
            return web.json_response(self.load)

        async def server_info(_: web.Request) -> web.Response:
            return web.json_response(self.server_info)

        async def models(_: web.Request) -> web.Response:
            return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model"}]})

        app.router.add_get("/health", health)
        app.router.add_get("/get_load", get_load)
        # the info routes a router (ours, or sgl-model-gateway) probes
        for path in ("/get_server_info", "/server_info", "/get_model_info", "/model_info", "/version"):
            app.router.add_get(path, server_info)
        app.router.add_get("/v1/models", models)
        app.router.add_post("/set_prefill_role", self._set_role)
        return app

    async def start(self, app: web.Application | None = None, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve ``app`` (default: make_app()) on host:port (0: the kernel's choice); the URL."""
        self._runner = web.AppRunner(app or self.make_app(), handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://{host}:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


async def _sleep_until(t: float) -> None:
    # always yields, even when late: each event then reaches the socket before the next step
    # (a scripted break_after aborts the transport and would drop what was still buffered)
    await asyncio.sleep(max(t - time.monotonic(), 0.0))


async def _event(out: web.StreamResponse, event: dict[str, Any]) -> None:
    await out.write(b"data: " + orjson.dumps(event) + b"\n\n")
