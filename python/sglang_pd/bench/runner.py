"""Drives a run: sends each session at its planned time, caps concurrency and duration.

Bounds, so the client always stops by itself:
- the dispatch loop walks a finite, time-sorted list once and stops at ``--duration``;
- every request has a total timeout (``--request-timeout``);
- after the duration cap, in-flight requests get ``--drain-timeout`` seconds, then are cancelled
  and recorded with error kind ``cancelled``;
- later turns of a session are not sent after the cap, nor after a failed turn.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from dataclasses import dataclass, field, replace

import aiohttp
from tqdm import tqdm

from sglang_pd.bench.backends import BackendConfig, RequestResult, RequestSpec, send_request
from sglang_pd.bench.prompts import PromptFactory
from sglang_pd.bench.workload import History, Session, extend_history, make_spec


class BenchError(RuntimeError):
    """A run cannot go on (e.g. the warmup request failed); the message says why."""


@dataclass
class RunOptions:
    backend: BackendConfig
    max_concurrency: int | None = None
    duration_s: float | None = None  # stop dispatching after this many seconds
    drain_timeout_s: float = 60.0  # grace for in-flight requests after the cap
    warmup_requests: int = 0
    show_progress: bool = True
    factory: PromptFactory | None = None  # for token counts of multi-turn text histories


@dataclass
class RunOutput:
    results: list[RequestResult]
    duration_s: float  # first send to last reply (or to the cancellation of the stragglers)
    not_sent: int = 0  # requests skipped by the duration cap or a failed earlier turn
    warmup: list[RequestResult] = field(default_factory=list)


class _Run:
    def __init__(self, opts: RunOptions, http: aiohttp.ClientSession, total: int) -> None:
        self.opts = opts
        self.http = http
        self.sem = asyncio.Semaphore(opts.max_concurrency) if opts.max_concurrency else None
        self.results: list[RequestResult] = []
        self.not_sent = 0
        self.t0 = 0.0
        # In a log file (not a terminal) every refresh is a new line: refresh rarely there.
        interactive = sys.stderr.isatty()
        self.bar = tqdm(
            total=total,
            unit="req",
            disable=not opts.show_progress,
            file=sys.stderr,
            desc="requests",
            dynamic_ncols=True,
            mininterval=0.1 if interactive else 10.0,
        )

    def past_cap(self) -> bool:
        cap = self.opts.duration_s
        return cap is not None and time.perf_counter() - self.t0 >= cap

    async def _send(self, spec: RequestSpec) -> RequestResult:
        if self.sem is None:
            return await send_request(self.http, self.opts.backend, spec, self.t0)
        async with self.sem:
            return await send_request(self.http, self.opts.backend, spec, self.t0)

    async def session(self, s: Session) -> None:
        backend = self.opts.backend.backend
        hist = History()
        for k, turn in enumerate(s.turns):
            if k > 0 and self.past_cap():
                self.not_sent += len(s.turns) - k
                return
            spec = make_spec(backend, s, k, hist, self.opts.factory)
            sent = time.perf_counter() - self.t0
            try:
                res = await self._send(spec)
            except asyncio.CancelledError:
                now = time.perf_counter() - self.t0
                self.results.append(
                    RequestResult(
                        spec.index,
                        spec.prompt_len,
                        spec.output_len,
                        error_kind="cancelled",
                        error="still running when the drain timeout ended",
                        e2e_s=now - sent,
                        start_s=sent,
                        end_s=now,
                        scheduled_s=s.arrival_s if k == 0 else None,
                        session=s.session_id,
                        turn=k,
                    )
                )
                raise
            res.scheduled_s = s.arrival_s if k == 0 else None
            self.results.append(res)
            self.bar.update(1)
            if not res.success:
                self.not_sent += len(s.turns) - k - 1
                return
            if k + 1 < len(s.turns):
                hist = extend_history(backend, hist, spec, turn, res)


async def _warmup(opts: RunOptions, http: aiohttp.ClientSession, s: Session) -> list[RequestResult]:
    # Same shape as the first request but at most 16 output tokens: enough to touch every code
    # path (prefill, decode, streaming) without delaying the run.
    out: list[RequestResult] = []
    for _ in range(opts.warmup_requests):
        spec = make_spec(opts.backend.backend, s, 0, History(), opts.factory)
        spec = replace(spec, output_len=min(spec.output_len, 16), index=-1)
        res = await send_request(http, opts.backend, spec, time.perf_counter())
        out.append(res)
        if not res.success:
            raise BenchError(
                f"warmup request to {opts.backend.url} failed ({res.error_kind}): {res.error}"
            )
    return out


async def run_sessions(sessions: list[Session], opts: RunOptions) -> RunOutput:
    """Replay ``sessions`` at their arrival times and collect every request's result."""
    order = sorted(sessions, key=lambda s: s.arrival_s)
    total = sum(len(s.turns) for s in order)
    timeout = aiohttp.ClientTimeout(total=opts.backend.request_timeout_s)
    # limit=0: no connection cap inside aiohttp, so a request is never queued on the client
    # after its send time was taken (that would inflate its TTFT); --max-concurrency caps instead.
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        warm = await _warmup(opts, http, order[0]) if order and opts.warmup_requests else []
        run = _Run(opts, http, total)
        tasks: list[asyncio.Task[None]] = []
        # A collection pause in the dispatch loop would show up as arrival error; the objects
        # built so far are long-lived, so take them out of the collector's way.
        gc.collect()
        gc.freeze()
        run.t0 = time.perf_counter()
        try:
            for i, s in enumerate(order):
                if opts.duration_s is not None and s.arrival_s >= opts.duration_s:
                    run.not_sent += sum(len(x.turns) for x in order[i:])
                    break
                await sleep_until(run.t0 + s.arrival_s)
                tasks.append(asyncio.create_task(run.session(s)))
            await _drain(run, tasks, opts)
        finally:
            gc.unfreeze()
            run.bar.close()
        duration = time.perf_counter() - run.t0
    run.results.sort(key=lambda r: r.index)
    return RunOutput(run.results, duration, run.not_sent, warm)


async def sleep_until(target: float) -> None:
    """Wake at ``target`` (perf_counter seconds) to well under a millisecond.

    The event loop's timers round up to whole milliseconds, so sleep to 2 ms short of the
    target and then yield with ``sleep(0)`` until it: other requests keep being served, and the
    spin costs at most 2 ms of CPU per dispatch.
    """
    coarse = target - time.perf_counter() - 0.002
    if coarse > 0:
        await asyncio.sleep(coarse)
    while time.perf_counter() < target:
        await asyncio.sleep(0)


async def _drain(run: _Run, tasks: list[asyncio.Task[None]], opts: RunOptions) -> None:
    if not tasks:
        return
    wait_s: float | None = None
    if opts.duration_s is not None:
        wait_s = max(run.t0 + opts.duration_s + opts.drain_timeout_s - time.perf_counter(), 0.0)
    _, pending = await asyncio.wait(tasks, timeout=wait_s)
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)
    for t in tasks:
        exc = None if t.cancelled() else t.exception()
        if exc is not None:
            raise exc  # a bug in our code, not a request error: surface it
