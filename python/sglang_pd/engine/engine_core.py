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

from sglang_pd.engine.attention import create_attention_backend
from sglang_pd.engine.forward_batch import ForwardMode
from sglang_pd.engine.kv_pool import KVPool
from sglang_pd.engine.memory import pool_pages
from sglang_pd.engine.model_runner import ModelRunner
from sglang_pd.engine.page_allocator import PageAllocator
from sglang_pd.engine.request import Req, ReqState
from sglang_pd.engine.sampler import SampleOutput, sample
from sglang_pd.engine.scheduler import Scheduler, ScheduledStep
from sglang_pd.engine.stop import StopChecker
from sglang_pd.models.loader import load_model
from sglang_pd.protocol import (
    ControlReq, ControlResp, EngineReady, EngineStats, GenerateReq, ReqOutput, TokenLogprob,
)
from sglang_pd.scheduling.registry import create_decode_policy, create_prefill_policy
from sglang_pd.server_args import ServerArgs

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
THROUGHPUT_WINDOW_S = 5.0


def resolve_dtype(name: str, device: str) -> torch.dtype:
    if name == "auto":
        # CPU matmuls in half precision are slow and lossy here; GPUs take bf16
        return torch.float32 if device == "cpu" else torch.bfloat16
    return _DTYPES[name]


class EngineCore:
    def __init__(self, args: ServerArgs, clock: Callable[[], float] = time.monotonic) -> None:
        self.args = args
        self.clock = clock
        torch.manual_seed(args.random_seed)
        dtype = resolve_dtype(args.dtype, args.device)
        self.model, self.config = load_model(args.model_path, dtype, args.device, args.load_format)
        cfg = self.config
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
            args.max_prefill_tokens,
        )
        self.eos_ids = list(cfg.eos_token_ids)
        self.stop_checker = StopChecker(
            None if args.skip_tokenizer_init else args.tokenizer_dir, self.eos_ids, self.context_length
        )
        self.outbox: list[ReqOutput] = []
        self._generated: deque[tuple[float, int]] = deque()
        logger.info("engine ready: %s, %d KV pages x %d tokens, dtype %s", cfg.architecture,
                    num_pages - 1, args.page_size, dtype)

    # ------------------------------------------------------------------ requests
    def add_request(self, msg: GenerateReq) -> None:
        error = self._validate(msg)
        if error:
            self.outbox.append(_error_output(msg.rid, len(msg.input_ids), error, 400))
            return
        req = Req.from_msg(msg, self.clock())
        if req.params.max_new_tokens == 0:
            req.finish_reason = {"type": "length", "length": 0}
            self.outbox.append(self._output(req))
            return
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
        if self.scheduler.find(msg.rid) is not None:
            return f"a request with rid {msg.rid!r} is already running"
        return msg.sampling_params.validate(self.vocab_size)

    def abort(self, rid: str, message: str = "aborted by the client") -> None:
        targets = (self.scheduler.waiting + self.scheduler.running) if rid == "" else \
            [r for r in [self.scheduler.find(rid)] if r is not None]
        for req in targets:
            self._finish(req, {"type": "abort", "message": message})

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    # ------------------------------------------------------------------ one step
    def step(self) -> list[ReqOutput]:
        now = self.clock()
        step = self.scheduler.schedule(now)
        if step is None:
            self._unblock()
        else:
            try:
                self._run(step)
            except Exception as exc:  # a failed forward must not leak pages or hang clients
                logger.exception("forward failed; aborting the %d requests in the batch", len(step.plan))
                for req in step.reqs:
                    self._finish(req, {"type": "abort", "message": f"internal error: {exc}"}, status=500)
        outputs, self.outbox = self.outbox, []
        return outputs

    def _run(self, step: ScheduledStep) -> None:
        runner = self.runner
        if step.mode is ForwardMode.EXTEND:
            logits = runner.forward(runner.build_extend(step.plan))
            done = self.scheduler.after_extend(step.plan)
            rows = [i for i, (r, _) in enumerate(step.plan) if r in set(done)]
            if rows:
                self._append(done, logits[rows], first=True)
        else:
            reqs = step.reqs
            logits = runner.forward(runner.build_decode(reqs))
            self.scheduler.after_decode(reqs)
            self._append(reqs, logits, first=False)

    def _append(self, reqs: list[Req], logits: torch.Tensor, first: bool) -> None:
        out: SampleOutput = sample(logits, reqs, self.eos_ids)
        now = self.clock()
        self._generated.append((now, len(reqs)))
        for i, (req, tok) in enumerate(zip(reqs, out.token_ids)):
            req.output_ids.append(tok)
            if first:
                req.first_token_time = now
            if req.return_logprob and out.logprobs is not None:
                req.pending_logprobs.append((out.logprobs[i], tok))
                if out.top_logprobs is not None:
                    req.pending_top_logprobs.append(out.top_logprobs[i])
            reason = self.stop_checker.check(req)
            if reason is not None:
                self._finish(req, reason)
            elif req.stream:
                self.outbox.append(self._output(req))

    def _unblock(self) -> None:
        """Nothing could be scheduled although work exists: the head request can never fit."""
        sched = self.scheduler
        if sched.running and not sched.waiting:
            self._finish(sched.running[0], {"type": "abort", "message": "out of KV cache memory"}, 503)
        elif sched.waiting and not sched.running:
            head = sched.waiting[0]
            self._finish(head, {"type": "abort", "message":
                                f"request needs more KV memory than the pool's {self.max_total_num_tokens} tokens"}, 503)

    def _finish(self, req: Req, reason: dict, status: int = 0) -> None:
        req.finish_reason = reason
        req.state = ReqState.FINISHED
        self.scheduler.remove(req)
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
        )

    def ready_info(self) -> EngineReady:
        return EngineReady(
            ok=True, model_path=self.args.model_path, served_model_name=self.args.model_name,
            architecture=self.config.architecture, context_length=self.context_length,
            vocab_size=self.vocab_size, eos_token_ids=self.eos_ids,
            max_total_num_tokens=self.max_total_num_tokens,
            max_running_requests=self.args.max_running_requests, page_size=self.args.page_size,
            num_pages=self.kv_pool.num_pages, disaggregation_mode=self.args.disaggregation_mode,
        )

    def control(self, msg: ControlReq) -> ControlResp:
        if msg.method == "get_load":
            s = self.stats()
            return ControlResp(msg.call_id, True, {
                "num_reqs": s.num_running_reqs + s.num_queue_reqs, "num_running_reqs": s.num_running_reqs,
                "num_waiting_reqs": s.num_queue_reqs, "num_tokens": s.num_used_tokens,
                "num_free_pages": self.allocator.num_free, "num_total_pages": self.allocator.num_usable,
                "token_usage": s.token_usage})
        if msg.method == "flush_cache":
            # no prefix cache yet: flushing succeeds when idle, as in SGLang
            ok = not self.has_work
            return ControlResp(msg.call_id, ok, {}, "" if ok else "cannot flush while requests run")
        if msg.method == "check_integrity":
            try:
                self.scheduler.check_integrity()
            except RuntimeError as exc:
                return ControlResp(msg.call_id, False, {}, str(exc))
            return ControlResp(msg.call_id, True, {"num_free_pages": self.allocator.num_free})
        if msg.method == "server_info":
            s = self.stats()
            return ControlResp(msg.call_id, True, {
                "max_total_num_tokens": self.max_total_num_tokens, "num_free_pages": self.allocator.num_free,
                "num_total_pages": self.allocator.num_usable, "num_retractions": self.scheduler.num_retractions,
                "gen_throughput": s.gen_throughput})
        return ControlResp(msg.call_id, False, {}, f"unknown control method {msg.method!r}")


def _error_output(rid: str, prompt_tokens: int, message: str, status: int) -> ReqOutput:
    return ReqOutput(rid=rid, new_token_ids=[], prompt_tokens=prompt_tokens, completion_tokens=0,
                     finish_reason={"type": "abort", "message": message}, error_status=status)
