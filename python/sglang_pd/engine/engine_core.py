"""EngineCore: model, KV pool, scheduler and sampler behind three calls.

``add_request`` / ``abort`` / ``step``. The engine process (ZMQ) and the offline ``Engine`` API
both drive this one object, so there is exactly one serving code path.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from dataclasses import replace
from typing import Callable

import torch

from sglang_pd.core.load_signals import LoadTracker, class_queues, short_threshold
from sglang_pd.core.page_allocator import PageAllocator
from sglang_pd.core.pd_rules import whole_prompt_pages
from sglang_pd.core.scheduler import Scheduler, ScheduledStep
from sglang_pd.core.step import ForwardMode, ReqState, StepProfile
from sglang_pd.core.watchdog import LivelockDetector
from sglang_pd.engine.attention import create_attention_backend
from sglang_pd.engine.cpu_tuning import tune_allocator
from sglang_pd.engine.cuda_graph import graph_max_bs, graph_reserve_bytes
from sglang_pd.engine.forward_batch import ForwardBatch
from sglang_pd.engine.forward_timer import ForwardTimer
from sglang_pd.engine.kv_pool import KVPool
from sglang_pd.engine.memory import pool_pages
from sglang_pd.engine.model_runner import ModelRunner
from sglang_pd.engine.pd import NullPD, PDHooks, create_pd_hooks
from sglang_pd.engine.prefill_graph import prefill_graph_reserve_bytes, short_prefill_graph_grid
from sglang_pd.engine.request import Req
from sglang_pd.engine.sampler import sample
from sglang_pd.engine.stop import StopChecker
from sglang_pd.engine.warmup import warm_up
from sglang_pd.models.loader import load_model
from sglang_pd.models.parallel import TPGroup, local_kv_heads
from sglang_pd.protocol import (
    EngineReady, EngineStats, GenerateReq, ReqOutput, StepSamples, TokenLogprob,
)
from sglang_pd.scheduling.prefill.dual import DualQueuePrefillPolicy
from sglang_pd.scheduling.registry import create_decode_policy, create_prefill_policy
from sglang_pd.server_args import ServerArgs

logger = logging.getLogger(__name__)

THROUGHPUT_WINDOW_S = 5.0
PROFILE_STEPS_KEPT = 4096
PENDING_POLL_S = 0.001  # how often to poll KV transfers when nothing can compute meanwhile


def cpu_aware_dtype(name: str, device: str) -> str:
    """"auto" means float32 on CPU (half-precision matmuls are slow and lossy there); elsewhere
    the loader resolves "auto" to the checkpoint's dtype, as SGLang does."""
    return "float32" if name == "auto" and device == "cpu" else name


class EngineCore:
    def __init__(self, args: ServerArgs, clock: Callable[[], float] = time.monotonic,
                 tp: TPGroup | None = None) -> None:
        self.args = args
        self.clock = clock
        if args.device == "cpu":
            tune_allocator()
        torch.manual_seed(args.random_seed)
        self.model, self.config = load_model(args.model_path, cpu_aware_dtype(args.dtype, args.device),
                                             args.device, args.load_format, tp)
        cfg = self.config
        kv_heads = local_kv_heads(cfg, tp or TPGroup.single())  # this rank's (engine/tp/)
        dtype = next(self.model.parameters()).dtype
        self.context_length = args.context_length or cfg.max_position_embeddings
        self.vocab_size = cfg.vocab_size
        # the backend first: graphs (and the memory kept for them) only with one that supports them
        attention = create_attention_backend(args.attention_backend, args.device,
                                             cuda_graph=not args.disable_cuda_graph)
        graph_bs = graph_max_bs(args.device, args.disable_cuda_graph, args.cuda_graph_max_bs,
                                attention)
        graph_reserve = graph_reserve_bytes(graph_bs, cfg, dtype) if graph_bs else 0
        # short-prefill graphs where a short queue feeds the engine (engine/prefill_graph.py)
        prefill_grid = short_prefill_graph_grid(args, graph_bs > 0 and attention.supports_prefill_graph)
        if prefill_grid is not None:
            graph_reserve += prefill_graph_reserve_bytes(prefill_grid, cfg, dtype)
        num_pages = pool_pages(
            max_total_tokens=args.max_total_tokens, mem_fraction_static=args.mem_fraction_static,
            device=args.device, page_size=args.page_size,
            bytes_per_token=KVPool.bytes_per_token(cfg.num_layers, kv_heads, cfg.head_dim, dtype),
            reserved_bytes=graph_reserve,  # graphs are captured after the pool: kept out before it
        )
        self.kv_pool = KVPool(cfg.num_layers, num_pages, args.page_size, kv_heads, cfg.head_dim,
                              dtype, args.device)
        self.allocator = PageAllocator(num_pages)
        self.max_total_num_tokens = self.allocator.num_usable * args.page_size
        self.runner = ModelRunner(self.model, self.kv_pool, attention, cuda_graph_max_bs=graph_bs,
                                  max_positions=cfg.max_position_embeddings,
                                  graph_reserved_bytes=graph_reserve, prefill_graph_grid=prefill_grid)
        # compile every kernel variant now, not in a request (not with TP: warm-up forwards
        # bypass the plan the other ranks follow)
        if args.device.startswith("cuda") and tp is None:
            warm_up(self.runner, min(self.context_length, cfg.max_position_embeddings,
                                     self.max_total_num_tokens))
        self.page_size = args.page_size
        self.policy_config = cfg_p = replace(args.policy_config(),
                                             decode_attention_padded=attention.decode_pads_to_longest)
        self.scheduler = Scheduler(
            self.allocator, cfg_p, create_prefill_policy(args.schedule_policy, cfg_p),
            create_decode_policy(args.decode_policy, cfg_p),
            whole_prompt_pages=whole_prompt_pages(args.disaggregation_mode),  # core/pd_rules.py
        )
        self.eos_ids = list(cfg.eos_token_ids)
        self.stop_checker = StopChecker(
            None if args.skip_tokenizer_init else args.tokenizer_dir, self.eos_ids, self.context_length
        )
        self.outbox: list[ReqOutput] = []
        self._generated: deque[tuple[float, int]] = deque()
        self.step_profiles: deque[StepProfile] = deque(maxlen=PROFILE_STEPS_KEPT)
        self._steps_recorded = 0  # step profiles appended, ever
        self._steps_sampled = 0  # of them, handed out as stats samples (take_step_samples)
        self.loads = LoadTracker()
        self._forward_timer = ForwardTimer(args.device)  # CUDA events on a GPU, host clock on CPU
        self._flushed_early = False
        self._idle_step = False  # the last step ran nothing although work was queued
        self.stalled_since: float | None = None  # work queued, no progress since then (watchdog)
        self.livelock = LivelockDetector()  # prefill thrown away repeatedly, nothing completes
        self.num_completed = 0  # requests finished or ended with a reason (the detector's input)
        self.pd: PDHooks = create_pd_hooks(
            self, args.disaggregation_mode, self.kv_pool.kv_buffer, args.host,
            args.disaggregation_bootstrap_port, args.num_reserved_decode_tokens, args.max_running_requests)
        logger.info("engine ready: %s, %d KV pages x %d tokens, dtype %s", cfg.architecture,
                    num_pages - 1, args.page_size, dtype)

    # ------------------------------------------------------------------ requests
    def add_request(self, msg: GenerateReq) -> None:
        error = self._validate(msg)
        if error:
            self.outbox.append(_error_output(msg.rid, len(msg.input_ids), error, 400))
            return
        cfg = self.policy_config
        req = Req.from_msg(msg, self.clock(), time.time(), (cfg.slo_ttft_s, cfg.slo_tpot_s))
        if req.params.max_new_tokens == 0:
            # nothing to compute, in every mode: PD decode and prefill both see the same body
            # and answer at once, so neither bootstraps a transfer the other will not join
            req.finish_reason = {"type": "length", "length": 0}
            self.outbox.append(self._output(req))
            return
        error = self.pd.admit(req, msg)  # queues it, or parks it (PD decode pre-allocation)
        if error:
            self.outbox.append(_error_output(msg.rid, len(msg.input_ids), error, 400))

    def fail_request(self, rid: str, prompt_tokens: int) -> None:
        """Admission raised: drop whatever of the request got in and answer it with a 500."""
        req = self._find(rid)
        if req is not None:
            self.pd.abort(req, self.clock())
            self.finish(req, {"type": "abort", "message": "internal error in the engine"}, 500)
        else:
            self.outbox.append(_error_output(rid, prompt_tokens, "internal error in the engine", 500))

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
        self._track_progress(now, made_progress=step is not None or bool(self.outbox))
        outputs, self.outbox = self.outbox, []
        if profile is not None:
            profile.total_s = time.perf_counter() - t0
            profile.forward_s = self._forward_timer.seconds()
            self.step_profiles.append(profile)
            self._steps_recorded += 1
            self.loads.step(self.clock(), profile.total_s)
            self.scheduler.observe(profile, profile.total_s, self.clock())
        return outputs

    def _track_progress(self, now: float, made_progress: bool) -> None:
        """Watchdog input: since when has queued work made no progress (a hold is not a stall),
        and whether steps only throw prefill work away (core/watchdog.py)."""
        self.livelock.update(now, self.scheduler.num_preempted_prefills, self.num_completed)
        if made_progress or not self.scheduler.has_work or self.scheduler.holding(now):
            self.stalled_since = None
        elif self.stalled_since is None:
            self.stalled_since = now

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
        self._generated.append((now, len(reqs)))
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
            self.loads.first_token(req, now, short_threshold(self.scheduler.prefill_policy, self.scheduler.cfg))
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
            self.outbox.append(self._output(req))

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
        self.num_completed += 1
        self.scheduler.remove(req)
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
    def take_step_samples(self) -> StepSamples:
        """The steps recorded since the last call (at most the ``PROFILE_STEPS_KEPT`` newest),
        for the /metrics histograms (mode, batch size, seconds)."""
        n = min(self._steps_recorded - self._steps_sampled, len(self.step_profiles))
        self._steps_sampled = self._steps_recorded
        steps = list(itertools.islice(reversed(self.step_profiles), n))[::-1]
        return StepSamples([p.mode.value for p in steps], [p.batch_size for p in steps],
                           [p.total_s for p in steps])

    def stats(self, step_samples: bool = False) -> EngineStats:
        """Load signals; ``step_samples``: also the steps since the last such call (only the
        engine loop's periodic stats message asks, so /get_load never consumes them)."""
        now = self.clock()
        while self._generated and self._generated[0][0] < now - THROUGHPUT_WINDOW_S:
            self._generated.popleft()
        span = max(now - self._generated[0][0], 1e-3) if self._generated else 1.0
        used = self.scheduler.num_used_tokens
        sched = self.scheduler
        return EngineStats(
            num_running_reqs=len(sched.running), num_queue_reqs=len(sched.waiting),
            token_usage=used / self.max_total_num_tokens,
            gen_throughput=sum(n for _, n in self._generated) / span if self._generated else 0.0,
            num_used_tokens=used, max_total_num_tokens=self.max_total_num_tokens,
            num_queue_prefill_tokens=sum(r.prefill_remaining for r in sched.waiting),
            num_running_decode_tokens=sum(r.kv_len for r in sched.running),
            num_free_pages=self.allocator.num_free, num_total_pages=self.allocator.num_usable,
            num_retractions_total=sched.num_retractions,
            num_preempted_prefills_total=sched.num_preempted_prefills,
            engine_stall_s=now - self.stalled_since if self.stalled_since is not None else 0.0,
            engine_livelock_s=self.livelock.livelock_s(now),
            num_livelock_episodes_total=self.livelock.episodes,
            num_preempted_prefill_tokens_total=sched.num_preempted_prefill_tokens,
            role=self.pd.role,
            **self.pd.stats(),
            **self._class_stats(now),
            step_samples=self.take_step_samples() if step_samples else None,
        )

    def _class_stats(self, now: float) -> dict[str, str | int | float]:
        """Per-class queues, SLO deviation, role and busy share (core/load_signals.py)."""
        sched, loads = self.scheduler, self.loads
        threshold = short_threshold(sched.prefill_policy, sched.cfg)
        return dict(prefill_role=getattr(sched.prefill_policy, "role", sched.cfg.prefill_role),
                    short_prefill_threshold=threshold, **class_queues(sched.waiting, threshold),
                    slo_ttft_deviation_short=loads.mean_deviation("short"),
                    slo_ttft_deviation_long=loads.mean_deviation("long"),
                    busy_fraction=loads.busy_fraction(now))

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


def _error_output(rid: str, prompt_tokens: int, message: str, status: int) -> ReqOutput:
    return ReqOutput(rid=rid, new_token_ids=[], prompt_tokens=prompt_tokens, completion_tokens=0,
                     finish_reason={"type": "abort", "message": message}, error_status=status)
