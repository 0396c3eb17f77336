"""The router's HTTP service (aiohttp): ``RouterService`` owns the state (workers, policies,
admission, the client session) and answers the generation routes (bound, classify, admit,
dual dispatch); admin.py answers the others, and server.py serves it until stopped."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from . import aio
from .admission import Admission, QueueFull
from .classify import BatchNotSupported, InvalidPrompt, LengthEstimator, prompt_parts
from .config import RouterConfig
from .idle_gc import IdleCollector
from .guard import HOP_HEADER, THREAD_PARSE_BYTES, ClientError, Guard
from .limits import INLINE_TOKENIZE_CHARS, MAX_BODY_BYTES, MAX_CHARS_PER_TOKEN
from .metrics import RouterMetrics
from .monitor import WorkerMonitor
from .policies import RouteRequest, RoutingConfig, create_routing_policy
from .policies.queue_order import create_queue_order
from .policies.cache_aware import request_prefix_blocks
from .admin import AdminRoutes
from .answer import STREAM_KEY, error_body, error_response
from .proxy import Dispatcher
from .request_class import SHORT_PREFILL_THRESHOLD, classify
from .slo_units import slo_ms_to_s
from .workers import WorkerRegistry

logger = logging.getLogger(__name__)

GENERATION_ROUTES = ("/generate", "/v1/completions", "/v1/chat/completions")
_BOOTSTRAP_FIELDS = ("bootstrap_host", "bootstrap_port", "bootstrap_room")  # the router's own


class RouterService:
    def __init__(self, cfg: RouterConfig) -> None:
        self.cfg = cfg
        self.metrics = RouterMetrics()
        self.estimator = LengthEstimator(cfg.tokenizer_path)
        self.registry = WorkerRegistry(cfg.cb_failure_threshold, cfg.cb_timeout_s)
        for spec in cfg.prefills:
            self.registry.add(spec.url, "prefill", spec.bootstrap_port)
        for url in cfg.decodes:
            self.registry.add(url, "decode")
        threshold = cfg.short_prefill_threshold or SHORT_PREFILL_THRESHOLD
        self.prefill_policy = create_routing_policy(
            cfg.prefill_policy, RoutingConfig(short_prefill_threshold=threshold), cfg.seed)
        self.decode_policy = create_routing_policy(
            cfg.decode_policy, RoutingConfig(short_prefill_threshold=threshold,
                                             decode_reuse_slack=cfg.decode_reuse_slack), cfg.seed)
        self.guard = Guard(cfg.api_key, cfg.admin_api_key, cfg.metrics_api_key,
                           cfg.body_timeout_s)
        key = cfg.key_for_workers
        self.worker_headers = {HOP_HEADER: self.guard.router_id}
        if key:
            self.worker_headers["Authorization"] = f"Bearer {key}"
        self.admission = Admission(cfg.max_concurrent_requests, cfg.queue_size,
                                   cfg.queue_timeout_s, self.metrics.queued.set)
        self.queue_order = create_queue_order(cfg.queue_order)  # fifo | edf (Dynamo's)
        self._arrivals = itertools.count()
        # young-generation collections in idle moments, off the requests' path (idle_gc.py)
        self.idle_gc = IdleCollector(lambda: self.admission.active > 0
                                     or self.admission.waiting > 0)
        self.session: aiohttp.ClientSession | None = None
        self.dispatcher: Dispatcher | None = None
        self.monitor: WorkerMonitor | None = None

    @property
    def threshold(self) -> int:
        return self.prefill_policy.cfg.short_prefill_threshold

    def set_threshold(self, value: int) -> None:
        if value != self.threshold:
            logger.info("short-prefill threshold now %d tokens (the workers')", value)
        self.prefill_policy.cfg.short_prefill_threshold = value
        self.decode_policy.cfg.short_prefill_threshold = value

    # ------------------------------------------------------------------ life cycle
    async def start(self, _app: web.Application | None = None) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.cfg.connect_timeout_s)
        self.session = aiohttp.ClientSession(connector=connector, timeout=timeout,
                                             cookie_jar=aiohttp.DummyCookieJar(),
                                             json_serialize=lambda o: orjson.dumps(o).decode())
        self.dispatcher = Dispatcher(
            self.registry, self.prefill_policy, self.decode_policy, self.session,
            worker_headers=self.worker_headers, max_retries=self.cfg.max_retries,
            backoff_initial_s=self.cfg.retry_initial_backoff_ms / 1000,
            backoff_max_s=self.cfg.retry_max_backoff_ms / 1000,
            request_timeout_s=self.cfg.request_timeout_s,
            kv_deadline_s=self.cfg.kv_deadline_s,
            first_byte_timeout_s=self.cfg.first_byte_timeout_s,
            probe_timeout_s=min(self.cfg.health_check_timeout_s, 2.0),
            max_migrations=self.cfg.max_migrations,
            on_routed=lambda cls, p, d: self.metrics.child(
                self.metrics.routed, cls, p.url if p else "local", d.url).inc(),
            on_retry=lambda cls: self.metrics.child(self.metrics.retries, cls).inc(),
            conditional=self.cfg.conditional, connect_timeout_s=self.cfg.connect_timeout_s)
        self.monitor = WorkerMonitor(self.cfg, self.registry, self.session, self.metrics,
                                     self.worker_headers, self.set_threshold)
        workers = self.registry.all()
        await asyncio.gather(*(self.monitor.discover(w) for w in workers))
        await asyncio.gather(self.monitor.check_health(), self.monitor.poll_loads())
        self.monitor.start()

    async def stop(self, _app: web.Application | None = None) -> None:
        self.idle_gc.close()
        if self.monitor is not None:
            await self.monitor.stop()
        if self.dispatcher is not None:
            await self.dispatcher.close()
        if self.session is not None:
            await self.session.close()

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES,
                              middlewares=[self.guard.middleware])
        app.on_startup.append(self.start)
        app.on_cleanup.append(self.stop)
        for path in GENERATION_ROUTES:
            app.router.add_post(path, self._generation_handler(path))
        AdminRoutes(self).add_to(app)
        return app

    # ------------------------------------------------------------------ generation
    def _generation_handler(self, path: str):
        async def handler(request: web.Request) -> web.StreamResponse:
            return await self.generate(request, path)
        return handler

    def _apply_slo_defaults(self, body: dict[str, Any], request: web.Request, cls: str) -> None:
        """The class's SLO defaults as the body's ``slo`` when the client sent none (neither in
        the body nor as x-slo-* headers); servers parse it (``frontend/inputs.py``)."""
        if "slo" in body or "x-slo-ttft-ms" in request.headers \
                or "x-slo-tpot-ms" in request.headers:
            return
        slo = {}
        if cls in self.cfg.slo_ttft_ms:
            slo["ttft_ms"] = self.cfg.slo_ttft_ms[cls]
        if cls in self.cfg.slo_tpot_ms:
            slo["tpot_ms"] = self.cfg.slo_tpot_ms[cls]
        if slo:
            body["slo"] = slo

    async def _prompt_len(self, path: str, body: dict[str, Any]) -> int:
        """Tokens in the prompt; texts over the servers' bound are refused uncounted, and long
        ones are tokenized in a worker thread (the event loop serves everyone else)."""
        try:
            n_ids, texts = prompt_parts(path, body)
        except BatchNotSupported as e:
            raise ClientError(400, f"batches are not routed in PD mode ({e}); send one "
                                   f"request per prompt") from None
        except InvalidPrompt as e:
            raise ClientError(400, str(e)) from None
        chars = sum(map(len, texts))
        context = self.registry.context_length()
        if context and chars > context * MAX_CHARS_PER_TOKEN:
            raise ClientError(400, f"the prompt has {chars} characters; no prompt over "
                                   f"{context * MAX_CHARS_PER_TOKEN} characters fits the "
                                   f"model's context of {context} tokens")
        if chars <= INLINE_TOKENIZE_CHARS or not self.estimator.exact:
            return n_ids + self.estimator.count_texts(texts)
        loop = asyncio.get_running_loop()
        return n_ids + await loop.run_in_executor(None, self.estimator.count_texts, texts)

    @staticmethod
    async def _serialise(body: dict[str, Any], big: bool) -> bytes:
        """The body as sent to both legs (once per request; each try appends its room)."""
        for name in _BOOTSTRAP_FIELDS:
            body.pop(name, None)
        try:
            if big:
                return await asyncio.get_running_loop().run_in_executor(None, orjson.dumps, body)
            return orjson.dumps(body)
        except orjson.JSONEncodeError as e:
            raise ClientError(400, f"the body cannot be forwarded: {e}") from None

    async def generate(self, request: web.Request, path: str) -> web.StreamResponse:
        t_arrival = time.monotonic()
        try:
            body = await self.guard.read_json(request)
            prompt_len = await self._prompt_len(path, body)
        except ClientError as e:
            return self._answer(path, "", e.response())
        cls = classify(prompt_len, self.threshold)
        self._apply_slo_defaults(body, request, cls)
        slo_ = body.get("slo")
        slo: dict[str, Any] = slo_ if isinstance(slo_, dict) else {}
        route_req = RouteRequest(prompt_len, 0, slo_ms_to_s(slo.get("ttft_ms")), cls)
        if self.prefill_policy.reads_prefix_blocks or self.decode_policy.reads_prefix_blocks:
            # cache_aware's prefix index (prefill or decode) needs the prompt
            route_req.prefix_blocks = request_prefix_blocks(body)
        stream = body.get("stream") is True
        try:
            data = await self._serialise(body, (request.content_length or 0) > THREAD_PARSE_BYTES)
        except ClientError as e:
            return self._answer(path, cls, e.response())
        try:
            await self.admission.acquire(self.queue_order.key(
                t_arrival, route_req.slo_ttft_s, next(self._arrivals)))
        except QueueFull as e:
            self.metrics.rejected.labels("queue").inc()
            return self._answer(path, cls, error_response(503, f"router overloaded: {e}",
                                                          headers={"Retry-After": "1"}))
        self.metrics.in_flight.inc()
        assert self.dispatcher is not None
        try:
            # a cancel scope, not wait_for: no extra task per request on the hot path
            async with aio.timeout(self.cfg.request_timeout_s):
                resp = await self.dispatcher.serve(
                    request, path, data, body, route_req, stream, t_arrival,
                    self.metrics.child(self.metrics.added_latency, cls).observe)
        except TimeoutError:
            resp = await self._timed_out(request)
        finally:
            self.metrics.in_flight.dec()
            self.admission.release()
            self.idle_gc.request_ended()
        return self._answer(path, cls, resp)

    async def _timed_out(self, request: web.Request) -> web.StreamResponse:
        message = f"request timed out after {self.cfg.request_timeout_s:g}s in the router"
        out = request.get(STREAM_KEY)
        if out is None:
            return error_response(504, message)
        try:  # bytes were sent already: end the stream with an error event
            await out.write(b"data: " + error_body(504, message) + b"\n\n")
            await out.write_eof()
        except (ConnectionError, RuntimeError):
            pass
        return out

    def _answer(self, path: str, cls: str, resp: web.StreamResponse) -> web.StreamResponse:
        m = self.metrics
        m.child(m.requests, path, cls or "none", resp.status).inc()
        if resp.status >= 400:
            m.child(m.failures, cls or "none", resp.status).inc()
        return resp
