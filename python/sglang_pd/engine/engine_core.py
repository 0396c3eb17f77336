"""EngineCore: model, KV pool, scheduler and sampler behind three calls.

``add_request`` / ``abort`` / ``step``. The engine process (ZMQ) and the offline ``Engine`` API
both drive this one object, so there is exactly one serving code path.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

import torch

from sglang_pd.engine.attention import create_attention_backend
from sglang_pd.engine.cpu_tuning import tune_allocator
from sglang_pd.engine.forward_batch import ForwardBatch, ForwardMode
from sglang_pd.engine.kv_pool import KVPool
from sglang_pd.engine.memory import pool_pages
from sglang_pd.engine.model_runner import ModelRunner
from sglang_pd.engine.page_allocator import PageAllocator
from sglang_pd.engine.pd import DecodeSide, PrefillSide
from sglang_pd.engine.request import Req, ReqState
from sglang_pd.engine.sampler import SampleOutput, sample
from sglang_pd.engine.scheduler import Scheduler, ScheduledStep
from sglang_pd.engine.stop import StopChecker
from sglang_pd.models.loader import load_model
from sglang_pd.protocol import (
    EngineReady, EngineStats, GenerateReq, ReqOutput, TokenLogprob,
)
from sglang_pd.scheduling.registry import create_decode_policy, create_prefill_policy
from sglang_pd.server_args import ServerArgs

logger = logging.getLogger(__name__)

THROUGHPUT_WINDOW_S = 5.0
PROFILE_STEPS_KEPT = 4096


@dataclass
class StepProfile:
    """Wall times of one engine step, for the step-overhead benchmark (seconds)."""

    mode: ForwardMode
    batch_size: int
    total_s: float  # schedule + batch building + forward + sampling + output hand-off
    forward_s: float  # the model forward alone

    @property
    def overhead_s(self) -> float:
        return self.total_s - self.forward_s


def cpu_aware_dtype(name: str, device: str) -> str:
    """"auto" means float32 on CPU (half-precision matmuls are slow and lossy there); elsewhere
    the loader resolves "auto" to the checkpoint's dtype, as SGLang does."""
    return "float32" if name == "auto" and device == "cpu" else name


class EngineCore:
    def __init__(self, args: ServerArgs, clock: Callable[[], float] = time.monotonic) -> None:
        self.args = args
        self.clock = clock
        if args.device == "cpu":
            tune_allocator()
        torch.manual_seed(args.random_seed)
        self.model, self.config = load_model(args.model_path, cpu_aware_dtype(args.dtype, args.device),
                                             args.device, args.load_format)
        cfg = self.config
        dtype = next(self.model.parameters()).dtype
        self.context_length = args.context_length or cfg.max_position_embeddings
        self.vocab_size = cfg.vocab_size
        num_pages = pool_pages(
            max_total_tokens=args.max_total_tokens, mem_fraction_static=args.mem_fraction_static,
            device=args.device, page_size=args.page_size,
            bytes_per_token=KVPool.bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, dtype),
        )
        self.kv_pool = KVPool(cfg.num_layers, num_pages, args.page_size, cfg.num_kv_heads, cfg.head_dim,
                              dtype, args.device)
        self.allocator = PageAllocator(num_pages)
        self.max_total_num_tokens = self.allocator.num_usable * args.page_size
        self.runner = ModelRunner(self.model, self.kv_pool, create_attention_backend(args.attention_backend))
        self.scheduler = Scheduler(
            self.allocator, args.page_size, create_prefill_policy(args.schedule_policy),
            create_decode_policy("continuous"), args.max_running_requests, args.chunked_prefill_size,
            args.max_prefill_tokens, whole_prompt_pages=args.disaggregation_mode == "prefill",
        )
        self.eos_ids = list(cfg.eos_token_ids)
        self.stop_checker = StopChecker(
            None if args.skip_tokenizer_init else args.tokenizer_dir, self.eos_ids, self.context_length
        )
        self.outbox: list[ReqOutput] = []
        self._generated: deque[tuple[float, int]] = deque()
        self.step_profiles: deque[StepProfile] = deque(maxlen=PROFILE_STEPS_KEPT)
        self._forward_s = 0.0
        self.pd: PrefillSide | DecodeSide | None = None
        self._flushed_early = False
        if args.disaggregation_mode == "prefill":
            self.pd = PrefillSide(self)
        elif args.disaggregation_mode == "decode":
            self.pd = DecodeSide(self)
        logger.info("engine ready: %s, %d KV pages x %d tokens, dtype %s", cfg.architecture,
                    num_pages - 1, args.page_size, dtype)

    # ------------------------------------------------------------------ requests
    def add_request(self, msg: GenerateReq) -> None:
        error = self._validate(msg)
        if error:
            self.outbox.append(_error_output(msg.rid, len(msg.input_ids), error, 400))
            return
        req = Req.from_msg(msg, self.clock())
        if req.params.max_new_tokens == 0 and self.pd is None:
            req.finish_reason = {"type": "length", "length": 0}
            self.outbox.append(self._output(req))
            return
        if self.pd is not None:
            error = self.pd.admit(req, msg)
            if error:
                self.outbox.append(_error_output(msg.rid, len(msg.input_ids), error, 400))
                return
            if isinstance(self.pd, DecodeSide):
                return  # it waits in the pre-allocation queue for its pages and KV
        self.scheduler.add(req)

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

    def _all_reqs(self) -> list[Req]:
        """Queued, running, and held by PD outside the queues (pre-allocating, transferring)."""
        parked = self.pd.parked_reqs() if self.pd is not None else []
        return self.scheduler.waiting + self.scheduler.running + parked

    def _find(self, rid: str) -> Req | None:
        return next((r for r in self._all_reqs() if r.rid == rid), None)

    def abort(self, rid: str, message: str = "aborted by the client") -> None:
        targets = self._all_reqs() if rid == "" else [r for r in [self._find(rid)] if r is not None]
        now = self.clock()
        for req in targets:
            if self.pd is not None and req.bootstrap_room >= 0:
                self.pd.abort(req, now)
            self.finish(req, {"type": "abort", "message": message})

    @property
    def has_work(self) -> bool:
        """Compute to do: the loop should step without waiting."""
        return self.scheduler.has_work

    @property
    def has_pending(self) -> bool:
        """Waiting on KV transfers: the loop should poll often but may sleep briefly."""
        return self.pd is not None and self.pd.has_pending

    def check_integrity(self) -> None:
        self.scheduler.check_integrity(self.pd.held_pages() if self.pd is not None else 0)

    # ------------------------------------------------------------------ one step
    def step(self) -> list[ReqOutput]:
        t0 = time.perf_counter()
        now = self.clock()
        if self.pd is not None:
            self.pd.poll(now)
            if isinstance(self.pd, DecodeSide) and self.outbox and not self._flushed_early:
                # first tokens that just arrived with their KV (and transfer errors) go out
                # now, not after the next decode forward: that would double their TTFT.
                # Never twice in a row, so steady arrivals cannot starve the running batch.
                self._flushed_early = True
                outputs, self.outbox = self.outbox, []
                return outputs
            self._flushed_early = False
        step = self.scheduler.schedule(now)
        if step is None:
            self._unblock()
        else:
            try:
                self._run(step)
            except Exception as exc:  # a failed forward must not leak pages or hang clients
                logger.exception("forward failed; aborting the %d requests in the batch", len(step.plan))
                for req in step.reqs:
                    if self.pd is not None and req.bootstrap_room >= 0:
                        self.pd.abort(req, now)
                    self.finish(req, {"type": "abort", "message": f"internal error: {exc}"}, status=500)
        outputs, self.outbox = self.outbox, []
        if step is not None:
            self.step_profiles.append(StepProfile(step.mode, len(step.plan), time.perf_counter() - t0,
                                                  self._forward_s))
        return outputs

    def _forward(self, batch: ForwardBatch) -> torch.Tensor:
        t = time.perf_counter()
        logits = self.runner.forward(batch)
        self._forward_s = time.perf_counter() - t
        return logits

    def _run(self, step: ScheduledStep) -> None:
        runner = self.runner
        if step.mode is ForwardMode.EXTEND:
            logits = self._forward(runner.build_extend(step.plan))
            done = self.scheduler.after_extend(step.plan)
            done_set = set(done)
            rows = [i for i, (r, _) in enumerate(step.plan) if r in done_set]
            if isinstance(self.pd, PrefillSide):
                for r, _ in step.plan:
                    if r not in done_set:
                        self.pd.on_chunk(r, self.clock())
            if rows:
                self._append(done, logits[rows], first=True)
        else:
            reqs = step.reqs
            logits = self._forward(runner.build_decode(reqs))
            self.scheduler.after_decode(reqs)
            self._append(reqs, logits, first=False)

    def _append(self, reqs: list[Req], logits: torch.Tensor, first: bool) -> None:
        out: SampleOutput = sample(logits, reqs, self.eos_ids)
        now = self.clock()
        self._generated.append((now, len(reqs)))
        for i, (req, tok) in enumerate(zip(reqs, out.token_ids)):
            logprob = out.logprobs[i] if out.logprobs is not None else None
            top = out.top_logprobs[i] if out.top_logprobs is not None else None
            self.accept_token(req, tok, logprob, top, now, first)

    def accept_token(self, req: Req, tok: int, logprob: float | None, top: list | None, now: float,
                     first: bool) -> None:
        """Append a sampled token (here, or on prefill for a PD request) and finish or stream."""
        req.output_ids.append(tok)
        if first:
            req.first_token_time = now
        if req.return_logprob and logprob is not None:
            req.pending_logprobs.append((logprob, tok))
            if top is not None:
                req.pending_top_logprobs.append(list(top))
        if first and isinstance(self.pd, PrefillSide):
            self.pd.on_first_token(req, logprob, top, now)  # decode finishes or continues it
            return
        reason = self.stop_checker.check(req)
        if reason is not None:
            self.finish(req, reason)
        elif req.stream:
            self.outbox.append(self._output(req))

    def _unblock(self) -> None:
        """Nothing could be scheduled although work exists: the head request can never fit."""
        sched = self.scheduler
        if sched.running and not sched.waiting:
            self.finish(sched.running[0], {"type": "abort", "message": "out of KV cache memory"}, 503)
        elif sched.waiting and not sched.running:
            head = sched.waiting[0]
            self.finish(head, {"type": "abort", "message":
                                f"request needs more KV memory than the pool's {self.max_total_num_tokens} tokens"}, 503)

    def finish(self, req: Req, reason: dict, status: int = 0) -> None:
        """Finish a request wherever it is, free the pages it still holds, answer its client."""
        if req.finish_reason is not None:
            return  # answered already; a late transfer update must not answer twice
        req.finish_reason = reason
        req.state = ReqState.FINISHED
        self.scheduler.remove(req)
        if self.pd is not None:
            self.pd.forget(req)
        self.outbox.append(self._output(req, status))

    def _output(self, req: Req, status: int = 0) -> ReqOutput:
        new = req.output_ids[req.sent_len:]
        req.sent_len = len(req.output_ids)
        out = ReqOutput(rid=req.rid, new_token_ids=new, prompt_tokens=req.prompt_len,
                        completion_tokens=len(req.output_ids), finish_reason=req.finish_reason,
                        error_status=status)
        if req.return_logprob:
            out.output_token_logprobs = [TokenLogprob(lp, t) for lp, t in req.pending_logprobs]
            if req.top_logprobs_num:
                out.output_top_logprobs = [[TokenLogprob(lp, t) for lp, t in top]
                                           for top in req.pending_top_logprobs]
            req.pending_logprobs, req.pending_top_logprobs = [], []
        return out

    # ------------------------------------------------------------------ introspection
    def stats(self) -> EngineStats:
        now = self.clock()
        while self._generated and self._generated[0][0] < now - THROUGHPUT_WINDOW_S:
            self._generated.popleft()
        span = max(now - self._generated[0][0], 1e-3) if self._generated else 1.0
        used = self.scheduler.num_used_tokens
        return EngineStats(
            num_running_reqs=len(self.scheduler.running), num_queue_reqs=len(self.scheduler.waiting),
            token_usage=used / self.max_total_num_tokens,
            gen_throughput=sum(n for _, n in self._generated) / span if self._generated else 0.0,
            num_used_tokens=used, max_total_num_tokens=self.max_total_num_tokens,
            **self._pd_stats(),
        )

    def _pd_stats(self) -> dict[str, int | float]:
        pd = self.pd
        if pd is None:
            return {}
        out: dict[str, int | float] = {
            "num_bootstrap_failed_reqs_total": pd.stats.bootstrap_failed,
            "num_transfer_failed_reqs_total": pd.stats.transfer_failed,
        }
        if isinstance(pd, PrefillSide):
            out["num_prefill_inflight_queue_reqs"] = len(pd.transferring)
            out["kv_transfer_speed_gb_s"] = pd.stats.last_speed_gb_s
            out["kv_transfer_latency_ms"] = pd.stats.last_latency_ms
        else:
            out["num_decode_prealloc_queue_reqs"] = len(pd.prealloc)
            out["num_decode_transfer_queue_reqs"] = len(pd.transferring)
        return out

    def close(self) -> None:
        if self.pd is not None:
            self.pd.close()

    def ready_info(self) -> EngineReady:
        return EngineReady(
            ok=True, model_path=self.args.model_path, served_model_name=self.args.model_name,
            architecture=self.config.architecture, context_length=self.context_length,
            vocab_size=self.vocab_size, eos_token_ids=self.eos_ids,
            max_total_num_tokens=self.max_total_num_tokens,
            max_running_requests=self.args.max_running_requests, page_size=self.args.page_size,
            num_pages=self.kv_pool.num_pages, disaggregation_mode=self.args.disaggregation_mode,
        )


def _error_output(rid: str, prompt_tokens: int, message: str, status: int) -> ReqOutput:
    return ReqOutput(rid=rid, new_token_ids=[], prompt_tokens=prompt_tokens, completion_tokens=0,
                     finish_reason={"type": "abort", "message": message}, error_status=status)
