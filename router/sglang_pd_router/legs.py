"""One try's two legs and their liveness (docs/router.md, "Liveness of the legs"): the prefill
leg, decode's answer up to its first byte, the deadlines and probes while waiting for it, and
which worker a failed try is charged to. proxy.py decides the pairs and the retries."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from .answer import DecodeHead, LegResult
from .leg_client import LegClient, LegStart
from .workers import Worker

RETRY_STATUSES = frozenset({500, 502, 503, 504})


class RouteError(Exception):
    """An answer the router gives itself (no worker's response to pass on)."""

    def __init__(self, status: int, message: str, retriable: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retriable = retriable


class AttemptError(RouteError):
    """A failed try: which worker it is charged to (avoided on the retry), and what to answer
    if it is the last."""

    def __init__(self, status: int, message: str, *, retriable: bool = True,
                 failed_prefill: bool = False, failed_decode: bool = False,
                 response: web.Response | None = None) -> None:
        super().__init__(status, message, retriable)
        self.failed_prefill = failed_prefill
        self.failed_decode = failed_decode
        self.response = response


@dataclass
class Legs:
    session: aiohttp.ClientSession  # the probes
    client: LegClient  # the generation legs themselves (the hot path)
    worker_headers: dict[str, str]
    kv_deadline_s: float
    first_byte_timeout_s: float
    probe_timeout_s: float

    def start(self, worker: Worker, path: str, data: bytes, headers: bytes,
              loop: asyncio.AbstractEventLoop) -> LegStart:
        """The leg's request, written now when a connection to ``worker`` is idle (see
        ``LegClient.start``); ``prefill`` or ``decode_head`` takes it over in the leg's task."""
        return self.client.start(worker.url, path, data, headers, loop)

    async def prefill(self, worker: Worker, started: LegStart, tokens: int) -> LegResult:
        worker.in_flight += 1
        worker.outstanding_prefill_tokens += tokens
        try:
            resp = await self.client.finish(started)
            try:
                result = LegResult(resp.status, await resp.read())
            except BaseException:
                resp.close()
                raise
            resp.release()
            return result
        finally:
            worker.in_flight -= 1
            worker.outstanding_prefill_tokens -= tokens

    async def decode_head(self, started: LegStart, stream: bool) -> DecodeHead:
        resp = await self.client.finish(started)
        try:
            if stream and resp.status == 200:
                first = await resp.content.readany()
                return DecodeHead(resp, first, done=not first)
            return DecodeHead(resp, await resp.read(), done=True)
        except BaseException:
            resp.close()
            raise

    async def await_decode_head(self, p_task: asyncio.Future, d_task: asyncio.Future,
                                down: asyncio.Future, prefill: Worker | None, decode: Worker,
                                stream: bool) -> AttemptError | None:
        """Wait for decode's first byte with the legs' liveness checks: the prefill's answer
        (its KV sent) by ``kv_deadline_s``, then a streamed decode's first byte by
        ``first_byte_timeout_s``. At a deadline the workers are probed: a silent one fails
        the try; if both answer, the request is slow, not stuck, and waits on. A worker turning
        unhealthy fails the try at once. Failures are charged to the worker that caused them:
        a prefill error while decode is silent is decode's (it never fetched its KV)."""
        loop = asyncio.get_running_loop()
        pending = {p_task, d_task, down}
        prefill_done = False
        wake_at = loop.time() + self.kv_deadline_s
        while d_task in pending:
            done, pending = await first_done(pending, max(wake_at - loop.time(), 0))
            if down in done:
                sick: Worker = down.result()
                return AttemptError(503, f"{sick.kind} {sick.url} turned unhealthy",
                                    failed_prefill=sick is prefill,
                                    failed_decode=sick is decode)
            if p_task in done and prefill is None:  # prefilled on decode: its first byte comes
                prefill_done = True  # after its own prefill, which gets the prefill's deadline
                wake_at = loop.time() + self.kv_deadline_s
            elif p_task in done and prefill is not None:
                err = self.prefill_failure(p_task, prefill)
                if err is not None:
                    if err.failed_prefill and d_task not in done \
                            and not await self.alive(decode):
                        return self.decode_silent(decode, "the prefill's KV transfer failed")
                    if err.failed_prefill:
                        prefill.breaker.on_failure(time.monotonic())
                    return err
                prefill.breaker.on_success()
                prefill_done = True
                wake_at = loop.time() + self.first_byte_timeout_s
            if done or d_task not in pending:
                continue
            # a deadline passed with nothing new
            if not await self.alive(decode):
                return self.decode_silent(decode, "no first byte")
            if prefill is not None and not prefill_done and not await self.alive(prefill):
                prefill.breaker.on_failure(time.monotonic())
                return AttemptError(504, f"prefill {prefill.url} did not answer within "
                                    f"{self.kv_deadline_s:g}s nor its health probe",
                                    failed_prefill=True)
            if prefill_done and stream:
                decode.breaker.on_failure(time.monotonic())
                return AttemptError(504, f"decode {decode.url} sent no first byte within "
                                    f"{self.first_byte_timeout_s:g}s of the prefill's answer",
                                    failed_decode=True)
            wake_at = loop.time() + (self.first_byte_timeout_s if prefill_done
                                     else self.kv_deadline_s)
        return None

    async def charge_decode_failure(self, err: AttemptError, p_task: asyncio.Future,
                                    prefill: Worker | None, decode: Worker) -> None:
        """Charge decode's 5xx to the worker that caused it. Before its KV arrives a PD decode
        does nothing but wait for it, so a failure while the prefill has not answered is most
        often the transfer's (decode's waiting timeout while the prefill is dead, or busy with
        a queue longer than that timeout): a decode that still answers its probe keeps its
        circuit closed, and the retry prefers another pair (a decode refusing for its own
        reason, e.g. full, is then not picked again while another is routable); a prefill
        that failed or fails its probe is charged. After the prefill answered (its KV sent),
        the failure is decode's, as it is when decode prefilled the request itself."""
        err.failed_decode = True  # avoided on the retry while another decode is routable
        if prefill is None or delivered(p_task) or not await self.alive(decode):
            decode.breaker.on_failure(time.monotonic())
            return
        err.failed_prefill = True
        if p_task.done() or not await self.alive(prefill):
            prefill.breaker.on_failure(time.monotonic())

    def decode_silent(self, decode: Worker, what: str) -> AttemptError:
        decode.breaker.on_failure(time.monotonic())
        return AttemptError(504, f"decode {decode.url} is not answering ({what}; its health "
                            f"probe failed)", failed_decode=True)

    async def alive(self, worker: Worker) -> bool:
        """One quick /health probe (an attribution, not the monitor's verdict)."""
        try:
            async with self.session.get(worker.url + "/health", headers=self.worker_headers,
                                        timeout=aiohttp.ClientTimeout(
                                            total=self.probe_timeout_s)) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
            return False

    @staticmethod
    def prefill_failure(p_task: asyncio.Future, prefill: Worker) -> AttemptError | None:
        try:
            result: LegResult = p_task.result()
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            return AttemptError(502, f"prefill {prefill.url} failed: {e!r}", failed_prefill=True)
        if result.status in RETRY_STATUSES:  # the caller charges the right worker
            return AttemptError(result.status, f"prefill {prefill.url} answered "
                                f"{result.status}: {result.body[:500].decode(errors='replace')}",
                                failed_prefill=True)
        if result.status >= 400:  # the request itself is bad: decode can never get its KV
            prefill.breaker.on_success()
            resp = web.Response(body=result.body, status=result.status,
                                content_type="application/json")
            return AttemptError(result.status, "prefill refused the request",
                                retriable=False, response=resp)
        return None


async def first_done(futures: set[asyncio.Future], timeout: float
                     ) -> tuple[set[asyncio.Future], set[asyncio.Future]]:
    """``asyncio.wait(futures, timeout=timeout, return_when=FIRST_COMPLETED)`` without its
    argument checks and per-call set copies: it runs once or twice per request."""
    done = {f for f in futures if f.done()}
    if not done:
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()

        def wake(_: object = None) -> None:
            if not waiter.done():
                waiter.set_result(None)

        timer = loop.call_later(timeout, wake)
        for f in futures:
            f.add_done_callback(wake)
        try:
            await waiter
        finally:
            timer.cancel()
            for f in futures:
                f.remove_done_callback(wake)
        done = {f for f in futures if f.done()}
    return done, futures - done


def delivered(p_task: asyncio.Future) -> bool:
    """The prefill leg answered below 500 (its KV went out)."""
    return (p_task.done() and not p_task.cancelled() and p_task.exception() is None
            and p_task.result().status < 500)


def swallow(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: no "exception never retrieved" noise
