"""A fake SGLang/OpenAI server with scripted timing, for testing the benchmark without a model.

``python -m sglang_pd.bench.stub_server --port 0`` prints ``STUB_READY port=N`` once listening.
Each request gets its first token after ``first_ms + prefill_ms_per_token * prompt_tokens`` and
then one token every ``itl_ms`` (times are absolute from the request's arrival, so delays do not
accumulate). Optional load effects make rate sweeps look like a real server: ``--serial-prefill``
queues prefills one at a time, ``--decode-slowdown`` stretches ITL by that fraction per other
request decoding. ``POST /stub/config`` changes settings and resets the request counter;
``GET /stub/requests`` returns the bodies received (the last 1000).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from sglang_pd.bench.prompts import load_tokenizer
from sglang_pd.bench.stub_harness import write_toy_tokenizer


@dataclass
class StubConfig:
    first_ms: float = 50.0
    itl_ms: float = 20.0
    prefill_ms_per_token: float = 0.0
    serial_prefill: bool = False
    decode_slowdown: float = 0.0
    fail_every: int = 0  # the k-th, 2k-th, ... request gets HTTP 400 (0: never)
    stream_error_every: int = 0  # the k-th, ... streamed request breaks off with an error event
    model_path: str = "stub-model"


@dataclass
class _State:
    cfg: StubConfig
    tokenizer: Any = None
    counter: int = 0
    decoding: int = 0
    prefill_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    bodies: deque = field(default_factory=lambda: deque(maxlen=1000))


def _count(state: _State, text: str) -> int:
    if state.tokenizer is not None:
        return len(state.tokenizer.encode(text, add_special_tokens=False).ids)
    return len(text.split())


def _prompt_len(state: _State, kind: str, body: dict[str, Any]) -> int:
    if kind == "generate":
        ids = body.get("input_ids")
        return len(ids) if isinstance(ids, list) else _count(state, str(body.get("text", "")))
    if kind == "completions":
        return _count(state, str(body.get("prompt", "")))
    return sum(_count(state, str(m.get("content", ""))) for m in body.get("messages", []))


def _chunk(kind: str, rid: str, i: int, n: int, plen: int, t0: float) -> dict[str, Any]:
    """Event for token ``i`` (1-based) of ``n``."""
    if kind == "generate":
        return {
            "text": " tok" * i,
            "output_ids": [100 + j for j in range(i)],
            "meta_info": {
                "id": rid,
                "prompt_tokens": plen,
                "completion_tokens": i,
                "finish_reason": {"type": "length", "length": n} if i == n else None,
                "e2e_latency": time.monotonic() - t0,
            },
        }
    if kind == "completions":
        return {
            "id": rid,
            "object": "text_completion",
            "choices": [
                {"index": 0, "text": " tok", "finish_reason": "length" if i == n else None}
            ],
        }
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "choices": [
            {
                "index": 0,
                "delta": {"content": " tok"},
                "finish_reason": "length" if i == n else None,
            }
        ],
    }


def _whole(kind: str, rid: str, n: int, plen: int, t0: float) -> dict[str, Any]:
    usage = {"prompt_tokens": plen, "completion_tokens": n, "total_tokens": plen + n}
    if kind == "generate":
        return _chunk(kind, rid, n, n, plen, t0)
    if kind == "completions":
        return {
            "id": rid,
            "choices": [{"index": 0, "text": " tok" * n, "finish_reason": "length"}],
            "usage": usage,
        }
    return {
        "id": rid,
        "choices": [
            {
                "index": 0,
                "finish_reason": "length",
                "message": {"role": "assistant", "content": " tok" * n},
            }
        ],
        "usage": usage,
    }


async def _sleep_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


async def _serve(state: _State, kind: str, request: web.Request) -> web.StreamResponse:
    t0 = time.monotonic()
    body = await request.json()
    state.bodies.append(body)
    state.counter += 1
    num = state.counter  # this request's number; the shared counter moves on meanwhile
    cfg = state.cfg
    if cfg.fail_every and num % cfg.fail_every == 0:
        return web.json_response({"error": {"message": "stub: rejected on purpose"}}, status=400)
    n = (
        body.get("sampling_params", {}).get("max_new_tokens")
        if kind == "generate"
        else body.get("max_tokens")
    )
    if not isinstance(n, int) or n < 1:
        return web.json_response({"detail": "max tokens must be a positive integer"}, status=422)
    plen = _prompt_len(state, kind, body)
    rid = f"stub-{num}"
    prefill_s = (cfg.first_ms + cfg.prefill_ms_per_token * plen) / 1000.0
    if cfg.serial_prefill:
        async with state.prefill_lock:
            await asyncio.sleep(prefill_s)
        t_tok = time.monotonic()
    else:
        t_tok = t0 + prefill_s
    if not body.get("stream"):
        state.decoding += 1
        try:
            await _sleep_until(t_tok + (n - 1) * cfg.itl_ms / 1000.0)
        finally:
            state.decoding -= 1
        return web.json_response(_whole(kind, rid, n, plen, t0))
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await resp.prepare(request)
    if kind == "chat":  # real servers open with a role-only delta; the client must skip it
        await resp.write(
            b"data: "
            + orjson.dumps(
                {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
            )
            + b"\n\n"
        )
    state.decoding += 1
    try:
        for i in range(1, n + 1):
            await _sleep_until(t_tok)
            await resp.write(b"data: " + orjson.dumps(_chunk(kind, rid, i, n, plen, t0)) + b"\n\n")
            if cfg.stream_error_every and num % cfg.stream_error_every == 0:
                await resp.write(b'data: {"error": {"message": "stub: failed mid-stream"}}\n\n')
                break
            others = max(state.decoding - 1, 0)
            t_tok += cfg.itl_ms / 1000.0 * (1.0 + cfg.decode_slowdown * others)
    finally:
        state.decoding -= 1
    if kind != "generate" and (body.get("stream_options") or {}).get("include_usage"):
        usage = {"prompt_tokens": plen, "completion_tokens": n, "total_tokens": plen + n}
        await resp.write(
            b"data: " + orjson.dumps({"id": rid, "choices": [], "usage": usage}) + b"\n\n"
        )
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def make_app(cfg: StubConfig, tokenizer_path: str | None = None) -> web.Application:
    state = _State(cfg, load_tokenizer(tokenizer_path))
    app = web.Application()

    async def config(request: web.Request) -> web.Response:
        for k, v in (await request.json()).items():
            if not hasattr(state.cfg, k):
                return web.json_response({"detail": f"unknown stub setting {k!r}"}, status=400)
            setattr(state.cfg, k, v)
        state.counter = 0
        state.bodies.clear()
        return web.json_response({"ok": True})

    async def model_info(_: web.Request) -> web.Response:
        return web.json_response({"model_path": state.cfg.model_path, "is_generation": True})

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def requests_seen(_: web.Request) -> web.Response:
        return web.json_response(list(state.bodies))

    app.router.add_get("/health", health)
    app.router.add_get("/get_model_info", model_info)
    app.router.add_post("/generate", lambda r: _serve(state, "generate", r))
    app.router.add_post("/v1/completions", lambda r: _serve(state, "completions", r))
    app.router.add_post("/v1/chat/completions", lambda r: _serve(state, "chat", r))
    app.router.add_post("/stub/config", config)
    app.router.add_get("/stub/requests", requests_seen)
    return app


async def _main(args: argparse.Namespace) -> None:
    if args.write_toy_tokenizer:
        write_toy_tokenizer(args.write_toy_tokenizer)
        args.model_path = args.model_path or args.write_toy_tokenizer
    cfg = StubConfig(
        first_ms=args.first_ms,
        itl_ms=args.itl_ms,
        prefill_ms_per_token=args.prefill_ms_per_token,
        serial_prefill=args.serial_prefill,
        decode_slowdown=args.decode_slowdown,
        fail_every=args.fail_every,
        model_path=args.model_path or "stub-model",
    )
    runner = web.AppRunner(make_app(cfg, args.tokenizer or args.model_path), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    port = runner.addresses[0][1]  # the kernel's choice when --port 0
    print(f"STUB_READY port={port}", flush=True)
    try:
        await asyncio.sleep(args.lifetime)  # bounded: a forgotten stub exits by itself
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m sglang_pd.bench.stub_server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--first-ms", type=float, default=50.0)
    p.add_argument("--itl-ms", type=float, default=20.0)
    p.add_argument("--prefill-ms-per-token", type=float, default=0.0)
    p.add_argument("--serial-prefill", action="store_true")
    p.add_argument("--decode-slowdown", type=float, default=0.0)
    p.add_argument("--fail-every", type=int, default=0)
    p.add_argument("--model-path", default=None, help="reported by /get_model_info")
    p.add_argument("--tokenizer", default=None, help="tokenizer.json dir for counting text prompts")
    p.add_argument(
        "--write-toy-tokenizer",
        default=None,
        metavar="DIR",
        help="write a small BPE tokenizer.json into DIR and serve DIR as model_path",
    )
    p.add_argument("--lifetime", type=float, default=3600.0, help="exit after this many seconds")
    asyncio.run(_main(p.parse_args(argv)))


if __name__ == "__main__":
    main()
