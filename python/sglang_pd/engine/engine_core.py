"""EngineCore: the serving loop behind three calls, ``add_request`` / ``abort`` / ``step``.

The engine process (ZMQ) and the offline ``Engine`` API both drive this one object, so there is
exactly one serving code path. What it runs lives beside it: construction in build.py, the
forward and sampling in executor.py, admission checks in admission.py, answers in outputs.py,
counters and load signals in stats.py, and PD in pd.py (its sides return events, applied here).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import cast

from sglang_pd.core.scheduled_step import ScheduledStep
from sglang_pd.core.step import ReqState, StepProfile
from sglang_pd.engine import pd_events as ev
from sglang_pd.engine.admission import request_error
from sglang_pd.engine.build import build_engine
from sglang_pd.engine.decode_log import DecodeLog
from sglang_pd.engine.executor import StepExecutor
from sglang_pd.engine.outputs import error_output, req_output
from sglang_pd.engine.pd import PDHooks
from sglang_pd.engine.request import Req
from sglang_pd.engine.request_log import RequestLog
from sglang_pd.engine.stats import EngineCounters
from sglang_pd.protocol import EngineReady, EngineStats, GenerateReq, ReqOutput
from sglang_pd.models.parallel import TPGroup
from sglang_pd.server_args import ServerArgs

logger = logging.getLogger(__name__)

PENDING_POLL_S = 0.001  # how often to poll KV transfers when nothing can compute meanwhile


class EngineCore:
    def __init__(self, args: ServerArgs, clock: Callable[[], float] = time.monotonic,
                 tp: TPGroup | None = None) -> None:
        self.args, self.clock = args, clock
        self.parts = p = build_engine(args, tp)  # engine/build.py (tp: this rank's group, engine/tp/)
        self.model, self.config, self.runner, self.kv_pool = p.model, p.config, p.runner, p.kv_pool
        self.allocator, self.scheduler, self.stop_checker = p.allocator, p.scheduler, p.stop_checker
        self.pd: PDHooks = p.pd  # engine/pd.py: its calls return events that _apply carries out
        self.policy_config, self.page_size = p.policy_config, args.page_size
        self.context_length, self.vocab_size = p.context_length, p.config.vocab_size
        self.max_total_num_tokens, self.limits = p.max_total_num_tokens, p.limits
        self.eos_ids = list(p.config.eos_token_ids)
        self.outbox: list[ReqOutput] = []
        self.counters = EngineCounters()  # throughput, step profiles, watchdog inputs (stats.py)
        self.step_profiles = self.counters.step_profiles  # the newest steps' (benchmarks, tests)
        self.executor = StepExecutor(p.runner, p.scheduler, self.eos_ids, args.device)
        # first tokens went out early last step (PD decode); the last step ran nothing though
        # work was queued (the loop polls instead of spinning)
        self._flushed_early, self._idle_step = False, False
        self.decode_log = DecodeLog()  # one debug line per decode decision (engine/decode_log.py)
        # one line per finished request: where its time went here (engine/request_log.py)
        self.request_log = RequestLog(args.disaggregation_mode, args.log_requests)
        # PD prefill: how long the loop may poll a just-finished prompt's KV hand-off before the
        # next forward. Its HTTP answer waits for the hand-off's end, and a router that awaits that
        # answer before the client's first token (SGLang's; vLLM's proxy sends to decode only
        # after it) would otherwise wait for the whole next forward: seconds on a CPU
        # (docs/bench_cluster.md, session 12). A short prompt's hand-off takes ~4-12 ms over
        # loopback UCX here, far less over RDMA.
        self.handoff_wait_s = args.disaggregation_prefill_handoff_wait_ms / 1e3

    def add_request(self, msg: GenerateReq) -> None:
        error = request_error(msg, self.limits, self._find(msg.rid) is not None)  # admission.py
        if error:
            self.outbox.append(error_output(msg.rid, len(msg.input_ids), error, 400))
            return
        req = Req.from_msg(msg, self.clock(), time.time())  # SLO resolved at entry
        if req.params.max_new_tokens == 0:
            # nothing to compute, in every mode: PD decode and prefill both see the same body
            # and answer at once, so neither bootstraps a transfer the other will not join
            req.finish_reason = {"type": "length", "length": 0}
            self.outbox.append(req_output(req))
            return
        admitted = self.pd.admit(req, msg, self.clock())  # queued, or parked (PD), or an error
        if isinstance(admitted, str):
            self.outbox.append(error_output(msg.rid, len(msg.input_ids), admitted, 400))
        else:
            self._apply([admitted], self.clock())

    def fail_request(self, rid: str, prompt_tokens: int) -> None:
        """Admission raised: drop whatever of the request got in and answer it with a 500."""
        req = self._find(rid)
        if req is not None:
            self._end(req, "internal error in the engine", 500, self.clock())
        else:
            self.outbox.append(error_output(rid, prompt_tokens, "internal error in the engine", 500))

    def _find(self, rid: str) -> Req | None:
        return self.scheduler.find(rid)  # type: ignore[return-value]

    def abort(self, rid: str, message: str = "aborted by the client") -> None:
        targets = cast("list[Req]", self.scheduler.all_reqs()) if rid == "" else [r for r in [self._find(rid)] if r is not None]
        now = self.clock()
        for req in targets:
            self._end(req, message, 0, now)

    @property
    def has_work(self) -> bool:
        """Compute to do: the loop should step without waiting."""
        return self.scheduler.has_work

    @property
    def has_pending(self) -> bool:
        """Waiting on KV transfers: the loop should poll often but may sleep briefly."""
        return self.pd.has_pending

    def wait_s(self) -> float | None:
        """How long the process loop may wait for messages before the next step: 0 = step now,
        None = idle (nothing to do until a message arrives). A holding policy sleeps until its
        deadline; a step blocked on pages that transfers will free polls them every 1 ms."""
        if self.outbox:
            return 0.0
        if self.scheduler.has_work:
            now = self.clock()
            if self._idle_step and self.scheduler.holding(now):
                return max(self.scheduler.hold_deadline - now, 0.0)  # type: ignore[operator]
            return PENDING_POLL_S if self._idle_step else 0.0
        return PENDING_POLL_S if self.pd.has_pending else None

    def check_integrity(self) -> None:
        self.scheduler.check_integrity()

    def step(self) -> list[ReqOutput]:
        t0 = time.perf_counter()
        now = self.clock()
        try:
            self._apply(self.pd.poll(now), now)
            if self.pd.handing_off and self.handoff_wait_s > 0:
                self._await_handoffs()
        except Exception:  # a transfer-layer bug must not take the engine down with every request
            logger.exception("PD poll failed; continuing")
        if self.pd.flush_early and self.outbox and not self._flushed_early:
            # answers the poll found go out now, not after the next forward: first tokens that
            # just arrived with their KV (decode: that would double their TTFT), ended
            # hand-offs (prefill), transfer errors. Never twice in a row, so steady arrivals
            # cannot starve the running batch.
            self._flushed_early = True
            outputs, self.outbox = self.outbox, []
            return outputs
        self._flushed_early = False
        step = self.scheduler.schedule(now)
        profile: StepProfile | None = None
        if step is None:
            self._unblock(now)
        else:
            profile = step.profile()
            for req in cast("list[Req]", step.reqs):
                if req.first_run_time is None:
                    req.first_run_time = now
            if self.decode_log.enabled():
                self.decode_log.decided(self.scheduler.decode_policy, self.scheduler.running, step, now)
            try:
                self._run(step)
            except Exception:  # a failed forward must not leak pages or hang clients
                logger.exception("forward failed; aborting the %d requests in the batch", len(step.plan))
                for req in cast("list[Req]", step.reqs):
                    self._end(req, "internal error in the engine", 500, now)
        self._idle_step = step is None and self.scheduler.has_work
        self.counters.track_progress(now, self.scheduler, made_progress=step is not None or bool(self.outbox))
        outputs, self.outbox = self.outbox, []
        if profile is not None:
            self.counters.record_step(profile, time.perf_counter() - t0, self.executor.forward_s(),
                                      self.clock())
            self.decode_log.done(profile)
            self.scheduler.observe(profile, profile.total_s, self.clock())
        return outputs

    def _await_handoffs(self) -> None:
        """PD prefill: poll the KV hand-offs the last step started until they end, at most
        ``handoff_wait_s``, so their answers do not wait for the next forward; once only."""
        deadline = time.perf_counter() + self.handoff_wait_s
        while self.pd.handing_off and time.perf_counter() < deadline:
            time.sleep(PENDING_POLL_S)
            now = self.clock()
            self._apply(self.pd.poll(now), now)
        self.pd.handoffs_waited()

    def _run(self, step: ScheduledStep) -> None:
        """The forward and sampling (engine/executor.py), then what they mean for each request."""
        result = self.executor.run(step)
        for r in result.chunked:
            now = self.clock()
            self._apply(self.pd.on_chunk(r, now), now)
        if not result.sampled:
            return
        now = self.clock()
        self.counters.sampled(now, len(result.sampled))
        for s in result.sampled:
            if s.token_id is None:
                self._end(s.req, "sampling failed for this request", 500, now)
            else:
                self.accept_token(s.req, s.token_id, s.logprob, s.top, now, s.first)

    def accept_token(self, req: Req, tok: int, logprob: float | None, top: list | None, now: float,
                     first: bool) -> None:
        """Append a sampled token (here, or on prefill for a PD request) and finish or stream."""
        req.output_ids.append(tok)
        if first:
            req.first_token_time = now
            self.counters.first_token(req, now, self.scheduler)
        if req.return_logprob and logprob is not None:
            req.pending_logprobs.append((logprob, tok))
            if top is not None:
                req.pending_top_logprobs.append(list(top))
        if first:
            events = self.pd.on_first_token(req, logprob, top, now)
            if events:  # PD prefill: parked while its KV goes to decode, which continues it
                self._apply(events, now)
                return
        reason = self.stop_checker.check(req)
        if reason is not None:
            self.finish(req, reason)
        elif req.stream:
            self.outbox.append(req_output(req))

    def _unblock(self, now: float) -> None:
        """Nothing was scheduled although work is queued: the scheduler frees what blocks progress
        and names the requests that can never run (never while it holds or transfers free pages)."""
        for req, message in self.scheduler.unblock(now):
            self._end(cast(Req, req), message, 503, now)

    def _apply(self, events: list[ev.PDEvent], now: float) -> None:
        """Carry out what a PD side decided (engine/pd_events.py), in order."""
        sched = self.scheduler
        for event in events:
            match event:
                case ev.Queued(req):
                    sched.add(req)
                case ev.Parked(req):
                    sched.park(req)
                case ev.Unparked(req, None):
                    sched.unpark(req)
                case ev.Unparked(req, ev.FirstTokenAux() as f):  # decode: KV came with the first token
                    sched.start_running(req, kv_len=req.prompt_len)
                    self.accept_token(req, f.token_id, f.logprob, f.top_logprobs, now, first=True)
                case ev.Finished(req, reason):
                    self.finish(req, reason)
                case ev.Failed(req, message, status):
                    self.finish(req, {"type": "abort", "message": message}, status)

    def _end(self, req: Req, message: str, status: int, now: float) -> None:
        """End a request the engine gives up on (aborted, failed): its transfer first."""
        self.pd.abort(req, now)
        self.finish(req, {"type": "abort", "message": message}, status)

    def finish(self, req: Req, reason: dict, status: int = 0) -> None:
        """Finish a request wherever it is, free the pages it still holds, answer its client."""
        if req.finish_reason is not None:
            return  # answered already; a late transfer update must not answer twice
        req.finish_reason = reason
        req.state = ReqState.FINISHED
        self.counters.num_completed += 1
        self.scheduler.remove(req)
        self.pd.forget(req)
        self.outbox.append(req_output(req, status))
        self.request_log.finished(req, self.clock(), status)

    def stats(self, step_samples: bool = False) -> EngineStats:
        """Load signals (engine/stats.py); ``step_samples``: also the steps since the last such call."""
        return self.counters.snapshot(self.clock(), self.scheduler, self.max_total_num_tokens, self.pd,
                                      step_samples)

    def set_prefill_role(self, role: str) -> str:
        """Switch this prefill instance's class at runtime (the router's pool controller)."""
        self.scheduler.set_prefill_role(role)
        return self.scheduler.prefill_role

    def close(self) -> None:
        self.pd.close()

    def ready_info(self) -> EngineReady:
        return self.parts.ready_info(self.args)
