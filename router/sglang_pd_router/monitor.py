"""Background work of the router: health checks, ``/get_load`` polls, and the pool controller
with its drain-then-switch role moves (DESIGN.md §5; PLA-Serve Alg. 2 via ``controller.py``)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter as Tally
from typing import Any
from collections.abc import Callable

import aiohttp
import orjson

from .config import RouterConfig
from .controller import InstanceSignals, PoolController, RoleMove
from .guard import ID_HEADER
from .metrics import RouterMetrics
from .workers import Worker, WorkerRegistry

logger = logging.getLogger(__name__)


class WorkerMonitor:
    def __init__(self, cfg: RouterConfig, registry: WorkerRegistry,
                 session: aiohttp.ClientSession, metrics: RouterMetrics,
                 worker_headers: dict[str, str],
                 on_threshold: Callable[[int], None]) -> None:
        self.cfg = cfg
        self.registry = registry
        self.session = session
        self.metrics = metrics
        self.headers = worker_headers
        self.on_threshold = on_threshold  # the routers' threshold follows the workers'
        self.controller = PoolController(cfg.controller) if cfg.pool_controller else None
        self.role_pinned: set[str] = set()  # moved by the router alone (no server route)
        self.moves: list[RoleMove] = []  # the history, for /workers and tests
        self._tasks: list[asyncio.Task] = []

    # ------------------------------------------------------------------ life cycle
    def start(self) -> None:
        # an unhealthy worker is probed more often: the first good probe clears its mark
        recheck_s = min(1.0, self.cfg.health_check_interval_s)
        loops = [self._every(self.cfg.health_check_interval_s, self.check_health),
                 self._every(recheck_s, self.recheck_unhealthy),
                 self._every(self.cfg.load_poll_interval_s, self.poll_loads)]
        if self.controller is not None:
            loops.append(self._every(self.cfg.controller.period_s, self.control_step))
        self._tasks = [asyncio.ensure_future(loop) for loop in loops]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _every(self, period_s: float, fn: Callable[[], Any]) -> None:
        while True:
            await asyncio.sleep(period_s)
            try:
                await fn()
            except asyncio.CancelledError:
                raise
            except Exception:  # a monitor bug must not stop monitoring
                logger.exception("router background task %s failed", fn.__name__)

    # ------------------------------------------------------------------ worker info
    async def _get_json(self, worker: Worker, path: str) -> dict[str, Any] | None:
        timeout = aiohttp.ClientTimeout(total=self.cfg.health_check_timeout_s)
        try:
            async with self.session.get(worker.url + path, headers=self.headers,
                                        timeout=timeout) as resp:
                if resp.status != 200:
                    return None
                body = orjson.loads(await resp.read())
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError):
            return None
        if isinstance(body, list) and body:  # SGLang's DP servers answer a list
            body = body[0]
        return body if isinstance(body, dict) else None

    async def discover(self, worker: Worker) -> None:
        """Role and threshold from the worker's own settings (``/get_server_info`` lists every
        ServerArgs field), so router and servers classify alike; a worker whose settings
        contradict its registration is never routed to."""
        info = await self._get_json(worker, "/get_server_info")
        if info is None:
            return
        worker.misconfigured = mismatch(info, worker.kind, worker.bootstrap_port)
        if worker.misconfigured:
            logger.error("worker %s is not routed to: %s", worker.url, worker.misconfigured)
        engine = info.get("engine_info")
        context = info.get("context_length") or (
            engine.get("context_length") if isinstance(engine, dict) else None)
        if isinstance(context, int) and not isinstance(context, bool) and context > 0:
            worker.context_length = context
        self._adopt(worker, info)

    async def probe_new(self, url: str, kind: str, bootstrap_port: int | None,
                        router_id: str) -> tuple[int, str] | None:
        """Why a worker about to be registered must not be (status, message), or None."""
        timeout = aiohttp.ClientTimeout(total=self.cfg.health_check_timeout_s)
        try:
            async with self.session.get(url + "/health", headers=self.headers,
                                        timeout=timeout) as resp:
                if resp.headers.get(ID_HEADER) == router_id or resp.status == 508:
                    return 400, f"{url} is this router itself: refusing a routing loop"
                if resp.status != 200:
                    return 502, f"{url} answered /health with {resp.status}; not registered"
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            return 502, f"{url} did not answer /health ({type(e).__name__}); not registered"
        info = await self._get_json(Worker(url, kind), "/get_server_info")
        problem = mismatch(info, kind, bootstrap_port) if info is not None else None
        return (400, problem) if problem else None

    def _adopt(self, worker: Worker, info: dict[str, Any]) -> None:
        if worker.kind != "prefill":
            return
        role = info.get("prefill_role")
        if role in ("short", "long", "both") and not worker.draining \
                and worker.url not in self.role_pinned:
            worker.prefill_role = role
        threshold = info.get("short_prefill_threshold")
        if isinstance(threshold, str) and threshold.isdigit():  # ServerArgs keeps N|auto text
            threshold = int(threshold)
        if isinstance(threshold, int) and not isinstance(threshold, bool) and threshold > 0 \
                and threshold != worker.threshold:
            worker.threshold = threshold
            self._update_threshold()

    def _update_threshold(self) -> None:
        reported = [w.threshold for w in self.registry.by_kind["prefill"] if w.threshold]
        if not reported or self.cfg.short_prefill_threshold is not None:
            return
        value, _ = Tally(reported).most_common(1)[0]
        if len(set(reported)) > 1:
            logger.warning("prefill workers report different short-prefill thresholds %s; "
                           "routing with %d", sorted(set(reported)), value)
        self.on_threshold(value)

    async def check_health(self) -> None:
        await asyncio.gather(*(self._check_one(w) for w in self.registry.all()))
        now = time.monotonic()
        for kind, workers in self.registry.by_kind.items():
            self.metrics.workers_healthy.labels(kind).set(sum(w.routable(now) for w in workers))

    async def _check_one(self, worker: Worker) -> None:
        timeout = aiohttp.ClientTimeout(total=self.cfg.health_check_timeout_s)
        try:
            async with self.session.get(worker.url + "/health", headers=self.headers,
                                        timeout=timeout) as resp:
                ok = resp.status == 200
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
            ok = False
        if ok:
            worker.health_fails, worker.health_passes = 0, worker.health_passes + 1
            if not worker.health_ok and worker.health_passes >= self.cfg.health_success_threshold:
                logger.info("worker %s is healthy again", worker.url)
                worker.health_ok = True
                worker.breaker.on_success()
        else:
            worker.health_passes, worker.health_fails = 0, worker.health_fails + 1
            if worker.health_ok and worker.health_fails >= self.cfg.health_failure_threshold:
                logger.warning("worker %s failed %d health checks: not routed to", worker.url,
                               worker.health_fails)
                worker.mark_unhealthy(time.monotonic())

    async def recheck_unhealthy(self) -> None:
        await asyncio.gather(*(self._check_one(w) for w in self.registry.all()
                               if not w.health_ok))

    async def poll_loads(self) -> None:
        async def one(worker: Worker) -> None:
            load = await self._get_json(worker, "/get_load")
            if load is not None:
                worker.polled = load
                self._adopt(worker, load)

        await asyncio.gather(*(one(w) for w in self.registry.all()))
        for role, size in self.registry.pool_sizes().items():
            self.metrics.pool_size.labels(role).set(size)

    # ------------------------------------------------------------------ pool controller
    def signals(self) -> list[InstanceSignals]:
        now = time.monotonic()
        out = []
        for w in self.registry.by_kind["prefill"]:
            if w.prefill_role not in ("short", "long"):
                continue
            load = w.polled
            deviation = load.get(f"slo_ttft_deviation_{w.prefill_role}",
                                 load.get("slo_ttft_deviation", 0.0))
            out.append(InstanceSignals(
                url=w.url, role=w.prefill_role, queued_prefill_tokens=w.queued_prefill_tokens(),
                slo_ttft_deviation=float(deviation or 0.0),
                busy_fraction=float(load.get("busy_fraction", 0.0) or 0.0),
                healthy=w.health_ok and w.breaker.state(now) == "closed", draining=w.draining))
        return out

    async def control_step(self) -> RoleMove | None:
        assert self.controller is not None
        move = self.controller.step(time.monotonic(), self.signals())
        for role, pressure in self.controller.last_pressures.items():
            self.metrics.pool_pressure.labels(role).set(pressure)
        if move is not None:
            worker = self.registry.find(move.url)
            if worker is not None:
                logger.info("pool controller: moving %s %s -> %s (P_short %.3f, P_long %.3f)",
                            move.url, move.from_role, move.to_role, move.short_pressure,
                            move.long_pressure)
                worker.draining = True
                task = asyncio.ensure_future(self.move(worker, move))
                self._tasks.append(task)
        return move

    async def move(self, worker: Worker, move: RoleMove) -> str:
        """Drain (no new requests; wait for this router's and the server's work to finish, at
        most ``drain_timeout_s``), then switch the server's role; answers the outcome."""
        worker.draining = True
        deadline = time.monotonic() + self.cfg.drain_timeout_s
        try:
            while time.monotonic() < deadline:
                load = await self._get_json(worker, "/get_load")
                busy = int(load.get("num_reqs", 0) or 0) if load else 0
                if worker.in_flight == 0 and busy == 0:
                    break
                await asyncio.sleep(0.05)
            outcome = await self._set_role(worker, move.to_role)
        finally:
            worker.draining = False
        if outcome != "failed":
            worker.prefill_role = move.to_role
            self.moves.append(move)
        self.metrics.moves.labels(move.from_role, move.to_role, outcome).inc()
        return outcome

    async def _set_role(self, worker: Worker, role: str) -> str:
        timeout = aiohttp.ClientTimeout(total=self.cfg.health_check_timeout_s)
        try:
            async with self.session.post(worker.url + "/set_prefill_role", headers=self.headers,
                                         data=orjson.dumps({"role": role}),
                                         timeout=timeout) as resp:
                text = (await resp.read()).decode(errors="replace")
                status = resp.status
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            logger.warning("set_prefill_role on %s failed: %r", worker.url, e)
            return "failed"
        if status == 200:
            self.role_pinned.discard(worker.url)
            return "switched"
        if status in (404, 405):
            # a worker without the route (e.g. SGLang's): the pools are the router's anyway
            logger.warning("%s has no /set_prefill_role; moved in the router only", worker.url)
            self.role_pinned.add(worker.url)
            return "router_only"
        logger.warning("set_prefill_role on %s answered %d: %s", worker.url, status, text[:300])
        return "failed"


def mismatch(info: dict[str, Any], kind: str, bootstrap_port: int | None) -> str | None:
    """What in a worker's ``/get_server_info`` contradicts registering it as ``kind`` with
    ``bootstrap_port`` (fields SGLang's servers and ours share), or None."""
    mode = info.get("disaggregation_mode")
    if isinstance(mode, str) and mode in ("prefill", "decode") and mode != kind:
        return f"it runs as a {mode} server, registered as {kind}"
    if isinstance(mode, str) and mode not in ("prefill", "decode", ""):
        return f"it is not a PD server (disaggregation_mode {mode!r}), registered as {kind}"
    port = info.get("disaggregation_bootstrap_port")
    if kind == "prefill" and bootstrap_port is not None and isinstance(port, int) \
            and port != bootstrap_port:
        return f"its bootstrap port is {port}, registered with {bootstrap_port}"
    return None
