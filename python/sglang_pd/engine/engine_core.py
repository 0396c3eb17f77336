"""EngineCore: model, KV pool, scheduler and sampler behind three calls.

``add_request`` / ``abort`` / ``step``. The engine process (ZMQ) and the offline ``Engine`` API
both drive this one object, so there is exactly one serving code path.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Callable

import torch

from sglang_pd.core.scheduler import ScheduledStep
from sglang_pd.core.step import ForwardMode, ReqState, StepProfile
from sglang_pd.engine.build import build_engine
from sglang_pd.engine.forward_batch import ForwardBatch
from sglang_pd.engine.forward_timer import ForwardTimer
from sglang_pd.engine.outputs import error_output, req_output
from sglang_pd.engine.pd import NullPD, PDHooks, create_pd_hooks
from sglang_pd.engine.request import Req
from sglang_pd.engine.sampler import sample
from sglang_pd.engine.stats import EngineCounters
from sglang_pd.protocol import EngineReady, EngineStats, GenerateReq, ReqOutput
from sglang_pd.scheduling.prefill.dual import DualQueuePrefillPolicy
from sglang_pd.server_args import ServerArgs

logger = logging.getLogger(__name__)

PENDING_POLL_S = 0.001  # how often to poll KV transfers when nothing can compute meanwhile


class EngineCore:
    def __init__(self, args: ServerArgs, clock: Callable[[], float] = time.monotonic) -> None:
        self.args = args
        self.clock = clock
        p = build_engine(args)  # engine/build.py
        self.model, self.config, self.runner, self.kv_pool = p.model, p.config, p.runner, p.kv_pool
        self.allocator, self.scheduler, self.stop_checker = p.allocator, p.scheduler, p.stop_checker
        self.policy_config, self.page_size = p.policy_config, args.page_size
        self.context_length, self.vocab_size = p.context_length, p.config.vocab_size
        self.max_total_num_tokens = p.max_total_num_tokens
        self.eos_ids = list(p.config.eos_token_ids)
        self.outbox: list[ReqOutput] = []
        self.counters = EngineCounters()  # throughput, step profiles, watchdog inputs (stats.py)
        self._forward_timer = ForwardTimer(args.device)  # CUDA events on a GPU, host clock on CPU
        self._flushed_early = False
        self._idle_step = False  # the last step ran nothing although work was queued
        self.pd: PDHooks = create_pd_hooks(
            self, args.disaggregation_mode, self.kv_pool.kv_buffer, args.host,
            args.disaggregation_bootstrap_port, args.num_reserved_decode_tokens, args.max_running_requests)

    # ------------------------------------------------------------------ requests
    def add_request(self, msg: GenerateReq) -> None:
        error = self._validate(msg)
        if error:
            self.outbox.append(error_output(msg.rid, len(msg.input_ids), error, 400))
            return
        cfg = self.policy_config
        req = Req.from_msg(msg, self.clock(), time.time(), (cfg.slo_ttft_s, cfg.slo_tpot_s))
        if req.params.max_new_tokens == 0:
            # nothing to compute, in every mode: PD decode and prefill both see the same body
            # and answer at once, so neither bootstraps a transfer the other will not join
            req.finish_reason = {"type": "length", "length": 0}
            self.outbox.append(req_output(req))
            return
        error = self.pd.admit(req, msg)  # queues it, or parks it (PD decode pre-allocation)
        if error:
            self.outbox.append(error_output(msg.rid, len(msg.input_ids), error, 400))

    def fail_request(self, rid: str, prompt_tokens: int) -> None:
        """Admission raised: drop whatever of the request got in and answer it with a 500."""
        req = self._find(rid)
        if req is not None:
            self.pd.abort(req, self.clock())
            self.finish(req, {"type": "abort", "message": "internal error in the engine"}, 500)
        else:
            self.outbox.append(error_output(rid, prompt_tokens, "internal error in the engine", 500))

    def _validate(self, msg: GenerateReq) -> str | None:
        n = len(msg.input_ids)
        if n == 0:
            return "the prompt is empty"
        if n >= self.context_length:
            return (f"the prompt has {n} tokens; the model's context length is {self.context_length} "
                    f"tokens (the prompt must be shorter, to leave room for output)")
        if n + 1 > self.max_total_num_tokens:
            return f"the prompt has {n} tokens; the KV pool holds only {self.max_total_num_tokens}"
        if any(t < 0 or t >= self.vocab_size for t in msg.input_ids):
            return f"input_ids must lie in [0, {self.vocab_size})"
        if self._find(msg.rid) is not None:
            return f"a request with rid {msg.rid!r} is already running"
        if msg.sampling_params.stop and self.stop_checker.tokenizer is None:
            return "stop strings need a tokenizer; this server runs with --skip-tokenizer-init"
        return msg.sampling_params.validate(self.vocab_size)

    def _find(self, rid: str) -> Req | None:
        return self.scheduler.find(rid)  # type: ignore[return-value]

    def abort(self, rid: str, message: str = "aborted by the client") -> None:
        targets = self.scheduler.all_reqs() if rid == "" else [r for r in [self._find(rid)] if r is not None]
        now = self.clock()
        for req in targets:
            self.pd.abort(req, now)
            self.finish(req, {"type": "abort", "message": message})

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

    # ------------------------------------------------------------------ one step
    def step(self) -> list[ReqOutput]:
        t0 = time.perf_counter()
        now = self.clock()
        try:
            self.pd.poll(now)
        except Exception:  # a transfer-layer bug must not take the engine down with every request
            logger.exception("PD poll failed; continuing")
        if self.pd.flush_first_tokens_early and self.outbox and not self._flushed_early:
            # first tokens that just arrived with their KV (and transfer errors) go out now,
            # not after the next decode forward: that would double their TTFT. Never twice in
            # a row, so steady arrivals cannot starve the running batch.
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
            try:
                self._run(step)
            except Exception:  # a failed forward must not leak pages or hang clients
                logger.exception("forward failed; aborting the %d requests in the batch", len(step.plan))
                for req in step.reqs:
                    self.pd.abort(req, now)
                    self.finish(req, {"type": "abort", "message": "internal error in the engine"}, status=500)
        self._idle_step = step is None and self.scheduler.has_work
        self.counters.track_progress(now, self.scheduler, made_progress=step is not None or bool(self.outbox))
        outputs, self.outbox = self.outbox, []
        if profile is not None:
            profile.total_s = time.perf_counter() - t0
            profile.forward_s = self._forward_timer.seconds()
            self.counters.record_step(profile, self.clock())
            self.scheduler.observe(profile, profile.total_s, self.clock())
        return outputs

    def _forward(self, batch: ForwardBatch) -> torch.Tensor:
        self._forward_timer.start()
        logits = self.runner.forward(batch)
        self._forward_timer.stop()  # read at the step's end, after sampling copied results back
        return logits

    def _run(self, step: ScheduledStep) -> None:
        runner = self.runner
        if step.mode is ForwardMode.DECODE:
            reqs = step.reqs
            logits = self._forward(runner.build_decode(reqs))
            self.scheduler.after_decode(reqs)
            self._sample_and_accept(reqs, logits, num_first=0)
            return
        # EXTEND, or MIXED: decodes ride along as one-token extends at the end of the plan
        logits = self._forward(runner.build_extend(step.plan))
        prefill, decodes = step.prefill_plan, step.decode_reqs
        done = self.scheduler.after_extend(prefill)
        self.scheduler.after_decode(decodes)
        done_set = set(done)
        for r, _ in prefill:
            if r not in done_set:
                self.pd.on_chunk(r, self.clock())
        rows = [i for i, (r, _) in enumerate(prefill) if r in done_set]
        rows += range(len(prefill), len(step.plan))
        if rows:
            self._sample_and_accept(done + decodes, logits[rows], num_first=len(done))

    def _sample_and_accept(self, reqs: list[Req], logits: torch.Tensor, num_first: int) -> None:
        """Sample one token per request (the first ``num_first`` get their first token). A
        request whose own sampling fails (its parameters) fails alone, never its batch."""
        now = self.clock()
        self.counters.sampled(now, len(reqs))
        try:
            out = sample(logits, reqs, self.eos_ids)
        except Exception:
            logger.exception("batched sampling failed; sampling the %d requests one by one", len(reqs))
            for i, req in enumerate(reqs):
                self._sample_one(req, logits[i:i + 1], now, i < num_first)
            return
        lps, tops = out.logprobs, out.top_logprobs
        for i, (req, tok) in enumerate(zip(reqs, out.token_ids)):
            self.accept_token(req, tok, lps[i] if lps is not None else None,
                              tops[i] if tops is not None else None, now, i < num_first)

    def _sample_one(self, req: Req, logits: torch.Tensor, now: float, first: bool) -> None:
        try:
            out = sample(logits, [req], self.eos_ids)
        except Exception:
            logger.exception("sampling failed for request %s", req.rid)
            self.pd.abort(req, now)
            self.finish(req, {"type": "abort", "message": "sampling failed for this request"}, 500)
            return
        self.accept_token(req, out.token_ids[0], out.logprobs[0] if out.logprobs is not None else None,
                          out.top_logprobs[0] if out.top_logprobs is not None else None, now, first)

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
        if first and self.pd.on_first_token(req, logprob, top, now):
            return  # PD prefill: decode finishes or continues it
        reason = self.stop_checker.check(req)
        if reason is not None:
            self.finish(req, reason)
        elif req.stream:
            self.outbox.append(req_output(req))

    def _unblock(self, now: float) -> None:
        """Nothing was scheduled although work is queued: the scheduler frees what blocks
        progress and names the requests that can never run (never while a policy holds or
        while pages held by transfers will come back)."""
        for req, message in self.scheduler.unblock(now):
            self.pd.abort(req, now)
            self.finish(req, {"type": "abort", "message": message}, 503)

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

    # ------------------------------------------------------------------ introspection
    @property
    def step_profiles(self) -> deque[StepProfile]:
        """The newest steps' profiles (benchmarks and tests read them)."""
        return self.counters.step_profiles

    def stats(self, step_samples: bool = False) -> EngineStats:
        """Load signals (engine/stats.py); ``step_samples``: also the steps since the last such call."""
        return self.counters.snapshot(self.clock(), self.scheduler, self.max_total_num_tokens, self.pd,
                                      step_samples)

    def set_prefill_role(self, role: str) -> str:
        """Switch this prefill instance's class at runtime (the router's pool controller)."""
        policy = self.scheduler.prefill_policy
        if not isinstance(policy, DualQueuePrefillPolicy):
            raise ValueError("the prefill role can only change on a server started with "
                             "--prefill-queues dual (or a --prefill-role)")
        policy.set_role(role)
        return policy.role

    def close(self) -> None:
        self.pd.close()
        self.pd = NullPD(self.scheduler)  # PD sides point back at us: break the cycle

    def ready_info(self) -> EngineReady:
        return EngineReady(
            ok=True, model_path=self.args.model_path, served_model_name=self.args.model_name,
            architecture=self.config.architecture, context_length=self.context_length,
            vocab_size=self.vocab_size, eos_token_ids=self.eos_ids,
            max_total_num_tokens=self.max_total_num_tokens,
            max_running_requests=self.args.max_running_requests, page_size=self.args.page_size,
            num_pages=self.kv_pool.num_pages, disaggregation_mode=self.args.disaggregation_mode,
        )

