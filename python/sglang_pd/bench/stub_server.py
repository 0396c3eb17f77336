"""A fake SGLang/OpenAI server with scripted timing, for testing the benchmark without a model:
the project's one fake server (``sglang_pd_router.fake_worker``) behind a command line.

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
import dataclasses
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from sglang_pd_router.fake_worker import FakeBehaviour, FakeWorker

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

    def behaviour(self) -> FakeBehaviour:
        return FakeBehaviour(delay_s=self.first_ms / 1e3, itl_s=self.itl_ms / 1e3,
                             prefill_s_per_token=self.prefill_ms_per_token / 1e3,
                             serial_prefill=self.serial_prefill, decode_slowdown=self.decode_slowdown,
                             fail_every=self.fail_every, stream_error_every=self.stream_error_every)


def make_worker(cfg: StubConfig, tokenizer_path: str | None = None) -> FakeWorker:
    tokenizer = load_tokenizer(tokenizer_path)

    def count(text: str) -> int:
        if tokenizer is not None:
            return len(tokenizer.encode(text, add_special_tokens=False).ids)
        return len(text.split())

    info = {"model_path": cfg.model_path, "is_generation": True, "version": "0.0-stub"}
    return FakeWorker("colocated", cfg.behaviour(), api_shapes=True, count_tokens=count, keep_bodies=1000,
                      model=cfg.model_path, server_info=info,
                      load={"num_reqs": 0, "num_running_reqs": 0, "token_usage": 0.0})


def make_stub(cfg: StubConfig, tokenizer_path: str | None = None) -> tuple[FakeWorker, web.Application]:
    """The fake server and its app, plus ``/stub/config`` (change settings, forget requests) and
    ``/stub/requests`` (the bodies received, the last 1000)."""
    worker = make_worker(cfg, tokenizer_path)
    app = worker.make_app()
    names = {f.name for f in dataclasses.fields(StubConfig)}

    async def config(request: web.Request) -> web.Response:
        settings: dict[str, Any] = await request.json()
        unknown = sorted(set(settings) - names)
        if unknown:
            return web.json_response({"detail": f"unknown stub setting {unknown[0]!r}"}, status=400)
        for k, v in settings.items():
            setattr(cfg, k, v)
        worker.behaviour = cfg.behaviour()
        worker.reset()
        return web.json_response({"ok": True})

    async def requests(_: web.Request) -> web.Response:
        return web.json_response(list(worker.bodies))

    app.router.add_post("/stub/config", config)
    app.router.add_get("/stub/requests", requests)
    return worker, app


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
        stream_error_every=args.stream_error_every,
        model_path=args.model_path or "stub-model",
    )
    worker, app = make_stub(cfg, args.tokenizer or args.model_path)
    url = await worker.start(app, args.host, args.port)  # port 0: the kernel's choice
    print(f"STUB_READY port={url.rsplit(':', 1)[1]}", flush=True)
    try:
        await asyncio.sleep(args.lifetime)  # bounded: a forgotten stub exits by itself
    finally:
        await worker.stop()


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
    p.add_argument("--stream-error-every", type=int, default=0)
    p.add_argument("--model-path", default=None, help="reported by /get_model_info")
    p.add_argument("--tokenizer", default=None, help="tokenizer.json dir for counting text prompts")
    p.add_argument(
        "--write-toy-tokenizer",
        default=None,
        metavar="DIR",
        help="write a small BPE tokenizer.json into DIR and serve DIR as model_path",
    )
    p.add_argument("--lifetime", type=float, default=3600.0, help="exit after this many seconds")
    try:  # the loop the router runs on: a stub on the stock loop costs the shared core more
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(_main(p.parse_args(argv)))


if __name__ == "__main__":
    main()
