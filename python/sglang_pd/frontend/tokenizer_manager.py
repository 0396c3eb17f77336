"""The frontend side of the engine channel: submit requests, dispatch outputs, control calls.

One receive-loop task owns the PULL socket (``frontend/engine_channel.py``) and routes every
ReqOutput to its ReqState; HTTP handlers only wait on the state's event, so nothing else touches
ZMQ on the way in. Per-class SLO counters: ``frontend/slo_accounting.py``; the watchdog's
verdict: ``frontend/engine_health.py``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Any
from collections.abc import Callable

import msgspec

from sglang_pd.frontend import engine_health
from sglang_pd.frontend.detokenizer import IncrementalDetokenizer, OutputText
from sglang_pd.frontend.engine_channel import EngineChannel
from sglang_pd.frontend.errors import ApiError
from sglang_pd.frontend.limits import RETRY_AFTER_S
from sglang_pd.frontend.metrics import FrontendMetrics
from sglang_pd.frontend.request_state import ReqState
from sglang_pd.frontend.slo_accounting import SloAccounting
from sglang_pd.frontend.token_pacing import Pacers
from sglang_pd.frontend.tokenizer import TokenizerBundle
from sglang_pd.protocol import (AbortReq, BatchOut, ControlReq, ControlResp, EngineReady,
                                EngineStats, GenerateReq, ReqOutput, Shutdown, decode_from_engine)
from sglang_pd.server_args import ServerArgs
from sglang_pd_router.request_class import SHORT_PREFILL_THRESHOLD, SentClass

logger = logging.getLogger(__name__)

ENGINE_DIED = "the engine process died"


class TokenizerManager:
    def __init__(self, server_args: ServerArgs, engine_info: EngineReady,
                 tokenizer: TokenizerBundle | None, metrics: FrontendMetrics,
                 engine_alive: Callable[[], bool] = lambda: True) -> None:
        self.server_args = server_args
        self.engine_info = engine_info
        self.tokenizer = tokenizer
        self.metrics = metrics
        self.engine_alive = engine_alive
        self.states: dict[str, ReqState] = {}
        self.pacers = Pacers(server_args.token_pacing, self._apply_output)  # --token-pacing
        self.pending_calls: dict[int, asyncio.Future[ControlResp]] = {}
        self.last_stats: EngineStats | None = None
        self.slo = SloAccounting(metrics, server_args.policy_config().short_prefill_threshold
                                 or SHORT_PREFILL_THRESHOLD)
        self.last_engine_msg = time.monotonic()  # the watchdog's heartbeat: any engine message
        self.engine_dead = False
        self.stopping = False  # set once we asked the engine to exit: its death is expected
        self.refusing: tuple[int, str] | None = None  # (status, message) once fail_all ran
        self.on_engine_death: Callable[[], None] | None = None  # set by launch_server
        self._call_ids = itertools.count(1)
        self._tasks: list[asyncio.Task[None]] = []
        self._req_log_level = logging.INFO if server_args.log_requests else logging.DEBUG
        self.channel = EngineChannel(server_args)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self.channel.open()
        self._tasks = [asyncio.create_task(self._recv_loop(), name="engine-recv"),
                       asyncio.create_task(self._watch_engine(), name="engine-watch")]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        self.channel.close()

    # ------------------------------------------------------------------ requests
    def check_room(self, n: int = 1) -> None:
        """503 (with Retry-After when full) unless ``n`` more requests may be held. Handlers
        call it before tokenizing too, so a full server does no work for refused requests."""
        if self.engine_dead:
            raise ApiError(503, f"{ENGINE_DIED}; the server is shutting down")
        if self.refusing is not None:  # fail_all ran: nothing new may start
            raise ApiError(*self.refusing)
        limit = self.server_args.max_queued_requests
        if len(self.states) + n > limit:
            raise ApiError(503, f"the server holds {len(self.states)} requests, its limit "
                                f"(--max-queued-requests) is {limit}; retry shortly",
                           headers={"Retry-After": str(RETRY_AFTER_S)})

    def submit(self, reqs: list[GenerateReq], return_text_in_logprobs: bool = False
               ) -> list[ReqState]:
        """Register and send requests; their states share one notify event."""
        self.check_room(len(reqs))
        duplicate = [r.rid for r in reqs if r.rid in self.states]
        if duplicate or len({r.rid for r in reqs}) != len(reqs):
            raise ApiError(400, f"duplicate request id(s): {', '.join(duplicate) or 'in batch'}")
        notify = asyncio.Event()
        states = []
        for req in reqs:
            text = None
            if self.tokenizer is not None:
                sp = req.sampling_params
                detok = IncrementalDetokenizer(self.tokenizer, sp.skip_special_tokens)
                text = OutputText(detok, stops=list(sp.stop), no_stop_trim=sp.no_stop_trim)
            state = ReqState(req=req, notify=notify, text=text,
                             return_text_in_logprobs=return_text_in_logprobs,
                             prompt_tokens=len(req.input_ids))
            self.states[req.rid] = state
            states.append(state)
            self.channel.send(req)
        return states

    def abort(self, state: ReqState) -> None:
        """Client went away: forget the request now and tell the engine to free its pages."""
        if state.finished:
            return
        state.finished = True
        state.finished_time = time.perf_counter()
        state.finish_reason = {"type": "abort", "message": "client disconnected"}
        self.pacers.drop(state.rid)
        if self.states.pop(state.rid, None) is not None:
            self.metrics.observe_finished(state.prompt_tokens, state.completion_tokens,
                                          state.cached_tokens, state.e2e_latency, aborted=True)
            logger.log(self._req_log_level, "Abort request rid=%s (client disconnected)",
                       state.rid)
        if not self.engine_dead:
            self.channel.send(AbortReq(rid=state.rid))

    def abort_rid(self, rid: str) -> None:
        """/abort_request: the engine answers with finish_reason abort ("" aborts all)."""
        if not self.engine_dead:
            self.channel.send(AbortReq(rid=rid))

    # ------------------------------------------------------------------ control calls
    async def control(self, call: ControlReq, timeout: float = 10.0) -> ControlResp:
        """Send one typed control call (GetLoad(), SetPrefillRole(role=...), ...) and wait for
        its answer; the call id is assigned here."""
        if self.engine_dead:
            raise ApiError(503, ENGINE_DIED)
        call_id = next(self._call_ids)
        future: asyncio.Future[ControlResp] = asyncio.get_running_loop().create_future()
        self.pending_calls[call_id] = future
        try:
            self.channel.send(msgspec.structs.replace(call, call_id=call_id))
            return await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            raise ApiError(504, f"the engine did not answer {call.method!r} within {timeout:g}s") from None
        finally:
            self.pending_calls.pop(call_id, None)

    def stall_reason(self) -> str | None:
        """Why /health should fail (--watchdog-timeout), or None (frontend/engine_health.py)."""
        return engine_health.stall_reason(len(self.states), time.monotonic() - self.last_engine_msg,
                                          self.last_stats, self.server_args.watchdog_timeout)

    # ------------------------------------------------------------------ receive side
    async def _recv_loop(self) -> None:
        while True:
            data = await self.channel.recv()
            self.last_engine_msg = time.monotonic()
            try:
                msg = decode_from_engine(data)
            except msgspec.DecodeError:
                logger.exception("undecodable message from the engine (%d bytes)", len(data))
                continue
            try:
                if isinstance(msg, BatchOut):
                    for out in msg.outputs:
                        self._handle_output(out)
                    if msg.stats is not None:
                        self.last_stats = msg.stats
                        self.metrics.update_engine_stats(msg.stats)
                else:
                    future = self.pending_calls.pop(msg.call_id, None)
                    if future is not None and not future.done():
                        future.set_result(msg)
            except Exception:  # one bad output must not stop every other request
                logger.exception("failed to handle an engine message")

    def _handle_output(self, out: ReqOutput) -> None:
        state = self.states.get(out.rid)
        if state is None:
            return  # aborted on our side already
        pacer = self.pacers.get(state)
        if pacer is not None:
            pacer.push(out)  # released later by a loop timer, never by waiting here
        else:
            self._apply_output(state, out)

    def _apply_output(self, state: ReqState, out: ReqOutput) -> None:
        now = time.perf_counter()
        new = out.new_token_ids
        if new:
            if state.first_token_time is None:
                state.first_token_time = now
                self.metrics.ttft.observe(now - state.created)
            elif state.last_token_time is not None:
                gap = (now - state.last_token_time) / len(new)
                for _ in new:
                    self.metrics.itl.observe(gap)
            state.last_token_time = now
            state.output_ids.extend(new)
        state.prompt_tokens = out.prompt_tokens or state.prompt_tokens
        state.completion_tokens = out.completion_tokens
        state.cached_tokens = out.cached_tokens
        if out.output_token_logprobs:
            state.output_token_logprobs.extend(out.output_token_logprobs)
        if out.output_top_logprobs:
            state.output_top_logprobs.extend(out.output_top_logprobs)
        if out.finish_reason is not None:
            state.error_status = out.error_status
            self._finish(state, out.finish_reason, new)
        elif not new:
            return  # nothing a client could see changed
        elif state.text is not None:
            state.text.add(new)
        state.updated = True
        state.notify.set()

    def _finish(self, state: ReqState, reason: dict[str, Any], last_ids: list[int]) -> None:
        self.pacers.drop(state.rid)
        state.finish_reason = reason
        state.finished = True
        state.finished_time = time.perf_counter()
        if state.text is not None:
            state.text.finish(last_ids, reason.get("matched"))
        self.states.pop(state.rid, None)
        aborted = reason.get("type") == "abort"
        self.metrics.observe_finished(state.prompt_tokens, state.completion_tokens,
                                      state.cached_tokens, state.e2e_latency, aborted)
        self.slo.observe(state, self.last_stats)
        logger.log(self._req_log_level,
                   "Finish request rid=%s prompt_tokens=%d completion_tokens=%d "
                   "cached_tokens=%d e2e_latency=%.3fs finish_reason=%s",
                   state.rid, state.prompt_tokens, state.completion_tokens,
                   state.cached_tokens, state.e2e_latency, reason)

    def class_threshold(self) -> int:
        return self.slo.class_threshold(self.last_stats)

    def request_class(self, tokens: int, sent: SentClass | None) -> str:
        """The class of a prompt of ``tokens`` tokens (slo_accounting.py: ``request_class``)."""
        return self.slo.request_class(tokens, sent, self.last_stats)

    async def _watch_engine(self) -> None:
        while not self.stopping:
            if not self.engine_alive():
                self.mark_engine_dead()
                return
            await asyncio.sleep(0.5)

    def fail_all(self, status: int, message: str) -> None:
        """Finish every request in flight with an error its handler answers in the JSON (or
        final SSE event) shape, and tell the engine to drop them. Requests still being parsed
        (the drain's end, engine death) are refused the same way when they submit."""
        self.refusing = (status, message)
        if self.states:
            logger.warning("%s; failing %d in-flight requests", message, len(self.states))
        for state in list(self.states.values()):
            state.error_status = status
            self._finish(state, {"type": "abort", "message": message}, [])
            state.updated = True
            state.notify.set()
            if not self.engine_dead and self.channel.connected:
                self.channel.send(AbortReq(rid=state.rid))

    def mark_engine_dead(self) -> None:
        """Fail everything in flight with 503 and tell the server to go down."""
        if self.engine_dead:
            return
        self.engine_dead = True
        self.fail_all(503, ENGINE_DIED)
        for future in self.pending_calls.values():
            if not future.done():
                future.set_exception(ApiError(503, ENGINE_DIED))
        if self.on_engine_death is not None:
            self.on_engine_death()

    async def shutdown_engine(self, timeout: float = 5.0) -> None:
        """Ask the engine to exit; the caller joins (and if need be kills) the process."""
        self.stopping = True
        if self.engine_dead or not self.channel.connected or not self.engine_alive():
            return
        call = asyncio.ensure_future(self.control(Shutdown(), timeout=timeout))
        # The engine may exit on its own meanwhile (a process-group SIGTERM reaches it too):
        # stop waiting for an answer that will never come.
        while not call.done() and self.engine_alive():
            await asyncio.wait({call}, timeout=0.1)
        if not call.done():
            call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        if not call.cancelled() and isinstance(call.exception(), ApiError):
            logger.warning("engine shutdown call: %s", call.exception())
