"""The engine's scheduler: queues, admission, chunked prefill, decode batches, retraction.

Mechanism only; *which* requests run is decided by the pure policies in scheduling/. It imports
no torch and works on the ``SchedulerReq`` protocol, so the simulator drives this very class
with length-only requests (DESIGN.md section 3).

Memory story (one, documented): admission allocates the pages of the granted prefill chunk and
keeps one page of headroom per running request; a prefill starts only when its whole prompt fits
beside what started prefills still need (the progress rule, ``core/progress.py``); decode
allocates a page when a request crosses a page boundary; when the pool runs dry, the partial
prefill the policy ranks last gives its pages back first (a bounded number of times per
request), then the newest running request is retracted (its pages freed, its tokens kept)
and re-prefilled later (recomputation, as in vLLM/nano-vllm). PD requests whose KV is in flight
are parked here with their pages, and pages a peer may still write sit in quarantine.
With the prefix cache (``prefix_cache=True``, core/prefix_hits.py) a fresh request's cached
prefix becomes its first pages (locked, shared with the tree), pages given up join the tree, and
evictable tree pages count as free (``EvictingAllocator``: every allocation may evict).
Invariant: allocator.used == pages requests hold alone (waiting + running + parked) +
quarantined pages + pages of the prefix cache.
Colocated step composition: prefill interleaves with running decodes by one rule,
``scheduling/colocated.py`` (a time budget per decode step), called from ``schedule``.
"""

from __future__ import annotations

from collections.abc import Sequence

from sglang_pd.core.page_admission import PageAdmission
from sglang_pd.core.pool_pressure import PoolPressure
from sglang_pd.core.progress import pages_for, reserved_pages
from sglang_pd.core.scheduled_step import ScheduledStep, SchedulerReq
from sglang_pd.core.step import ForwardMode, ReqState, StepProfile, StepShape
from sglang_pd.scheduling.slo import no_slo_ttft_s
from sglang_pd.scheduling.types import PrefillBudget

MIN_HOLD_S = 1e-4  # a policy's hold that is already due still waits this long


class Scheduler(PoolPressure):
    """Step composition (``schedule``) and what a step's end changes; the queues are in
    ``core/scheduler_queues.py``, the pool-pressure rules in ``core/pool_pressure.py``."""

    # ------------------------------------------------------------------ steps
    def schedule(self, now: float) -> ScheduledStep | None:
        self.hold_deadline = None
        plan: list[tuple[SchedulerReq, int]] = []
        lace = self.interleave if self.running else None
        decode_first = lace is not None and lace.decode_turn(self._decodes_waited)
        self._decodes_waited = False
        if self.hits is not None and self.hits.stale():  # the tree changed: hits looked up again
            for r in self.hits.refresh(self.waiting):
                self.waiting.refresh(r)
        if decode_first:
            step = self._decode_step(now)
            if step is not None:
                return step
        if self.waiting:
            started = [r for r in self.waiting if r.pages]
            tokens, chunk = self.max_prefill_tokens, self.chunk_size
            if lace is not None:  # each request's chunk is sized at its own context (step_time)
                # no chunk takes more than fits at context 0; the step's tokens stay as set (a
                # long context's chunk takes few of them: the requests behind it use the rest)
                chunk = min(chunk, lace.prefill_tokens(0, chunk))
            kv = PageAdmission(self.allocator, self.page_size, headroom_pages=len(self.running),
                               whole_prompt=self.whole_prompt_pages,
                               reserve_pages=0 if self.whole_prompt_pages else reserved_pages(started, self.page_size),
                               hits=self.hits)
            budget = PrefillBudget(
                token_budget=tokens,
                chunk_size=chunk,
                new_req_slots=self.max_running - len(self.running) - len(self.parked) - len(started),
                kv=kv,  # type: ignore[arg-type]  # (takes SchedulerReqs: the only kind granted here)
                rider_contexts=[r.kv_len for r in self.running] if self.cfg.enable_mixed_chunk else (),
                role=self.prefill_role,
                step_time=lace.allowance() if lace is not None else None,
            )
            plan = list(self.prefill_policy.schedule(self.waiting, now, budget))
            if plan:
                self.last_rank = {r: i for i, (r, _) in enumerate(plan)}
            if started and (kv.refused or (not plan and budget.hold_deadline is None)):
                plan += self._continue_started(started, plan, budget)
            if kv.refused_fresh and budget.hold_deadline is None and self._may_backfill(kv.refused_fresh, now):
                plan += self._backfill_fresh(plan, budget, kv)
            if not plan and budget.hold_deadline is not None and budget.hold_deadline > now - MIN_HOLD_S:
                # a hold never aborts: one due now (AWD's own dispatch moment, float-equal to
                # ``now``) is a short hold, not "stuck" (found by the property tests)
                self.hold_deadline = max(budget.hold_deadline, now + MIN_HOLD_S)
        if plan:
            decodes = self._mixable_decodes(now) if self.cfg.enable_mixed_chunk and self.running else []
            plan += [(r, 1) for r in decodes]
            self._decodes_waited = lace is not None and not decodes
            return self._step(ForwardMode.MIXED if decodes else ForwardMode.EXTEND, plan, len(decodes))
        return None if decode_first else self._decode_step(now)

    def _decode_step(self, now: float) -> ScheduledStep | None:
        if self.running:
            batch = self._fit_decode(self.decode_policy.schedule(self.running, now))
            if batch:
                return self._step(ForwardMode.DECODE, [(r, 1) for r in batch], len(batch))
        return None

    @staticmethod
    def _continue_started(started: list[SchedulerReq], plan: list[tuple[SchedulerReq, int]],
                          budget: PrefillBudget) -> list[tuple[SchedulerReq, int]]:
        """Progress rule 2: started prefills the policy's plan left out after a KV refusal (or
        an empty plan without a hold) go on, oldest first, within the budget left; each one's
        own refusal skips only it."""
        planned = {r for r, _ in plan}
        more: list[tuple[SchedulerReq, int]] = []
        for r in started:
            if budget.token_budget <= 0:
                break
            if r not in planned:
                n = budget.grant(r)
                if n:
                    more.append((r, n))
        return more

    def _may_backfill(self, refused: list[SchedulerReq], now: float) -> bool:
        """Rule 2b's guard: no refused fresh request is past its TTFT target (its SLO, else the
        no-SLO far target, scheduling/slo.py), and the policy has no class filter (the dual
        queues' steps are all-short or all-long: a backfill could break that)."""
        if self.prefill_policy.serves_roles:
            return False
        far = no_slo_ttft_s(self.cfg)
        return all(now - r.arrival <= (r.slo_ttft_s or far) for r in refused)

    def _backfill_fresh(self, plan: list[tuple[SchedulerReq, int]], budget: PrefillBudget,
                        kv: PageAdmission) -> list[tuple[SchedulerReq, int]]:
        """Progress rule 2b: after a fresh request was refused for pages, fresh requests the
        plan left out go on, oldest first, within the budget and request slots left; each asks
        the pool (rule 1: its whole prompt beside the reserve) and a refusal skips only it."""
        planned = {r for r, _ in plan}
        more: list[tuple[SchedulerReq, int]] = []
        ps, plain = self.page_size, self.hits is None
        for r in self.waiting:
            # the pages rule 1 leaves a fresh request (the walk is cheap where nothing fits):
            # every fresh one needs at least one (a prefix hit never covers its last token) and,
            # without a prefix cache, all its prompt's pages
            room = kv.allocator.num_free - kv.headroom - (0 if kv.whole_prompt else kv.reserve)
            if budget.token_budget <= 0 or budget.new_req_slots <= 0 or room <= 0:
                break
            if r.pages or r in planned or (plain and pages_for(r.prefill_target, ps) > room):
                continue
            n = budget.grant(r)
            if n:
                more.append((r, n))
        return more

    def _step(self, mode: ForwardMode, plan: list[tuple[SchedulerReq, int]], num_decode: int) -> ScheduledStep:
        if mode is ForwardMode.DECODE:
            return ScheduledStep(mode, plan, StepShape(len(plan), len(plan)), num_decode)
        tokens = sum(n for _, n in plan)
        bucket = (self.cfg.buckets.bucket(max(n for _, n in plan), len(plan))
                  if mode is ForwardMode.EXTEND else None)
        return ScheduledStep(mode, plan, StepShape(len(plan), tokens, bucket), num_decode)

    def _mixable_decodes(self, now: float) -> list[SchedulerReq]:
        """Decodes that ride along a prefill step: only when they all fit without retraction
        (a mixed step must never evict the chunk it carries)."""
        batch = list(self.decode_policy.schedule(self.running, now))
        needs = [r for r in batch if self._needs_page(r)]
        if len(needs) > self.allocator.num_free:
            return []
        for r in needs:
            r.pages.extend(self.allocator.alloc(1))
        return batch

    def observe(self, profile: StepProfile, elapsed_s: float, now: float) -> None:
        self.prefill_policy.observe(profile, elapsed_s, now)
        self.decode_policy.observe(profile, elapsed_s, now)
        if self.interleave is not None:
            self.interleave.observe(profile, elapsed_s)

    def after_extend(self, plan: Sequence[tuple[SchedulerReq, int]]) -> list[SchedulerReq]:
        """Advance KV lengths; return the requests whose prefill just completed and that need a
        first token sampled (resumed ones already have theirs)."""
        need_sample = []
        for r, n in plan:
            r.kv_len += n
            if r.prefill_remaining == 0:
                self.waiting.remove(r)
                r.state = ReqState.RUNNING
                self.running.append(r)
                if r.n_generated == 0:
                    need_sample.append(r)
            else:
                self.waiting.refresh(r)
        return need_sample

    def after_decode(self, reqs: Sequence[SchedulerReq]) -> None:
        for r in reqs:
            r.kv_len += 1
