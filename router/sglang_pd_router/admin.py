"""The router's routes other than generation: model info forwarded to a worker, health,
metrics, and worker admin (``/workers``: list, add after a probe, remove). The guard
(guard.py) decides who may call each; these handlers only answer."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import aiohttp
import orjson
from aiohttp import web

from .answer import error_response
from .metrics import CONTENT_TYPE
from .workers import Worker, validate_url

if TYPE_CHECKING:
    from .app import RouterService


class AdminRoutes:
    def __init__(self, service: RouterService) -> None:
        self.service = service

    def add_to(self, app: web.Application) -> None:
        for path in ("/v1/models", "/get_model_info", "/model_info"):
            app.router.add_get(path, self._forward_get(path))
        app.router.add_get("/health", self.health)
        app.router.add_get("/readiness", self.health)
        app.router.add_get("/metrics", self.render_metrics)
        app.router.add_get("/workers", self.list_workers)
        app.router.add_post("/workers", self.add_worker)
        app.router.add_delete("/workers", self.remove_worker)

    def _forward_get(self, path: str):
        async def handler(request: web.Request) -> web.Response:
            assert self.service.session is not None
            now = time.monotonic()
            candidates = sorted(self.service.registry.by_kind["decode"] + self.service.registry.by_kind["prefill"],
                                key=lambda w: not w.routable(now))
            for worker in candidates:
                try:
                    async with self.service.session.get(worker.url + path, headers=self.service.worker_headers,
                                                timeout=aiohttp.ClientTimeout(total=10)) as r:
                        return web.Response(body=await r.read(), status=r.status,
                                            content_type=r.content_type or "application/json")
                except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
                    continue
            return error_response(503, "no worker answered")
        return handler

    async def health(self, request: web.Request) -> web.Response:
        now = time.monotonic()
        healthy = {kind: sum(w.routable(now) for w in workers)
                   for kind, workers in self.service.registry.by_kind.items()}
        ok = healthy["prefill"] > 0 and healthy["decode"] > 0
        body = {"status": "ok" if ok else "unavailable", "healthy_workers": sum(healthy.values()),
                "healthy_prefill": healthy["prefill"], "healthy_decode": healthy["decode"]}
        return web.Response(body=orjson.dumps(body), status=200 if ok else 503,
                            content_type="application/json")

    async def render_metrics(self, request: web.Request) -> web.Response:
        resp = web.Response(body=self.service.metrics.render())
        resp.headers["Content-Type"] = CONTENT_TYPE
        return resp

    async def list_workers(self, request: web.Request) -> web.Response:
        now = time.monotonic()
        body = {"workers": [w.describe(now) for w in self.service.registry.all()],
                "short_prefill_threshold": self.service.threshold,
                "pools": self.service.registry.pool_sizes(),
                "pool_pressures": (self.service.monitor.controller.last_pressures
                                   if self.service.monitor and self.service.monitor.controller else None)}
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def add_worker(self, request: web.Request) -> web.Response:
        """``{"url": ..., "kind": "prefill"|"decode", "bootstrap_port": N}``: validated, then
        probed (it must answer /health, must not be this router, and the role and bootstrap
        port it reports must agree); only then does it get traffic."""
        body = await self.service.guard.read_json(request)
        url, kind = body.get("url"), body.get("kind")
        port = body.get("bootstrap_port")
        try:
            url = validate_url(url)
        except ValueError as e:
            return error_response(400, str(e))
        if kind not in ("prefill", "decode"):
            return error_response(400, "'kind' must be 'prefill' or 'decode'")
        if port is not None and (isinstance(port, bool) or not isinstance(port, int)
                                 or not 0 < port < 65536):
            return error_response(400, "'bootstrap_port' must be a port number or null")
        if kind == "prefill" and "bootstrap_port" not in body:
            return error_response(400, "a prefill worker needs 'bootstrap_port' (null for none)")
        if self.service.registry.find(url) is not None:
            return error_response(409, f"worker {url} is already registered")
        assert self.service.monitor is not None
        problem = await self.service.monitor.probe_new(url, kind, port, self.service.guard.router_id)
        if problem is not None:
            return error_response(problem[0], problem[1])
        try:
            worker = self.service.registry.add(url, kind, port)
        except ValueError as e:  # registered meanwhile
            return error_response(409, str(e))
        await self.service.monitor.discover(worker)
        return web.Response(body=orjson.dumps(worker.describe(time.monotonic())),
                            content_type="application/json")

    async def remove_worker(self, request: web.Request) -> web.Response:
        """``?url=...`` or ``{"url": ...}``; in-flight requests there finish."""
        url = request.query.get("url") or (await self.service.guard.read_json(request)).get("url")
        if not isinstance(url, str):
            return error_response(400, "give the worker's 'url'")
        try:
            worker: Worker = self.service.registry.remove(url)
        except KeyError:
            return error_response(404, f"no worker {url}")
        return web.Response(body=orjson.dumps({"removed": worker.url}),
                            content_type="application/json")
