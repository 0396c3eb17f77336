"""A router in front of scripted fake workers on loopback, served the way ``serve`` does
(``make_runner``: slow-client guards included), for the router's hostile-input tests."""

from __future__ import annotations

import asyncio
import contextlib
from typing import NamedTuple
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from sglang_pd_router.app import RouterService
from sglang_pd_router.server import make_runner
from sglang_pd_router.config import PrefillSpec, RouterConfig
from sglang_pd_router.fake_worker import FakeWorker

GEN = {"text": "hello there", "sampling_params": {"max_new_tokens": 3}}


class Cluster(NamedTuple):
    url: str
    port: int
    client: aiohttp.ClientSession
    prefills: list[FakeWorker]
    decodes: list[FakeWorker]
    service: RouterService


@contextlib.asynccontextmanager
async def router_cluster(n_prefill: int = 1, n_decode: int = 1, **cfg_kw) -> AsyncIterator[Cluster]:
    prefills = [FakeWorker("prefill") for _ in range(n_prefill)]
    decodes = [FakeWorker("decode") for _ in range(n_decode)]
    for w in prefills + decodes:
        await w.start()
    base = dict(health_check_interval_s=3600, load_poll_interval_s=3600, pool_controller=False,
                retry_initial_backoff_ms=1, retry_max_backoff_ms=5)
    base.update(cfg_kw)
    cfg = RouterConfig(prefills=[PrefillSpec(p.url, 9000 + i) for i, p in enumerate(prefills)],
                       decodes=[d.url for d in decodes], **base)
    service = RouterService(cfg)
    runner = await make_runner(service)
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with aiohttp.ClientSession() as client:
            yield Cluster(f"http://127.0.0.1:{port}", port, client, prefills, decodes, service)
    finally:
        await runner.cleanup()
        for w in prefills + decodes:
            w.hung = False
            await w.stop()


async def raw_exchange(port: int, data: bytes, read_timeout_s: float = 5.0) -> bytes:
    """Send raw bytes on a fresh connection; everything the router answers until it closes
    (or ``read_timeout_s`` passes)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    out = b""
    try:
        while True:
            chunk = await asyncio.wait_for(reader.read(65536), read_timeout_s)
            if not chunk:
                break
            out += chunk
    except (asyncio.TimeoutError, ConnectionError):
        pass
    writer.close()
    return out
