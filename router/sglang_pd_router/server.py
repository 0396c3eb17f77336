"""Serving a ``RouterService``: the aiohttp runner with the slow-client guards, the listening
socket, and the process's life (signals, the collector's settings)."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from typing import Any

from aiohttp import web

from .app import RouterService
from .config import RouterConfig

logger = logging.getLogger(__name__)


async def make_runner(service: RouterService) -> web.AppRunner:
    """The service's runner, set up, with the slow-client guards: a connection that has not
    delivered a request head within ``client_idle_timeout_s`` (aiohttp's keep-alive timer also
    runs from the connection's start) is closed, and connections past ``max_connections`` are
    closed as they arrive."""
    cfg = service.cfg
    runner = web.AppRunner(service.make_app(), handler_cancellation=True, access_log=None,
                           keepalive_timeout=cfg.client_idle_timeout_s)
    await runner.setup()
    server = runner.server
    assert server is not None
    accept = server.connection_made

    def capped(handler: Any, transport: Any) -> None:
        accept(handler, transport)
        if len(server.connections) > cfg.max_connections:
            service.metrics.rejected.labels("connections").inc()
            handler.force_close()
            transport.close()

    server.connection_made = capped  # type: ignore[method-assign]
    return runner


async def serve(cfg: RouterConfig) -> None:
    service = RouterService(cfg)
    runner = await make_runner(service)
    site = web.TCPSite(runner, cfg.host, cfg.port, backlog=1024)
    await site.start()
    # start-up objects (modules, tokenizer, app) never die: freezing them keeps every full
    # collection from walking them, and a larger first generation means fewer collections
    # under a request load that allocates many short-lived objects (the tail of its latency)
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
    logger.info("sglang-pd-router listening on http://%s:%d (%d prefill, %d decode)",
                cfg.host, cfg.port, len(cfg.prefills), len(cfg.decodes))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # not on this platform
            pass
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def run_router(cfg: RouterConfig) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    try:
        asyncio.run(serve(cfg))
    except KeyboardInterrupt:
        pass
