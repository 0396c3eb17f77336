"""The engine's scheduler: queues, admission, chunked prefill, decode batches, retraction.

Mechanism only; *which* requests run is decided by the pure policies in scheduling/.
Memory story (one, documented): admission allocates the pages of the granted prefill chunk and
keeps one page of headroom per running request; decode allocates a page when a request crosses
a page boundary; when the pool runs dry, the newest running request is retracted (its pages
freed, its tokens kept) and re-prefilled later (recomputation, as in vLLM/nano-vllm).
Invariant: allocator.used == sum(len(r.pages) for r in waiting + running).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Sequence

from sglang_pd.engine.forward_batch import ForwardMode
from sglang_pd.engine.page_allocator import PageAllocator
from sglang_pd.engine.request import Req, ReqState
from sglang_pd.scheduling.types import DecodePolicy, PrefillBudget, PrefillPolicy, SchedReq


@dataclass
class ScheduledStep:
    mode: ForwardMode
    plan: list[tuple[Req, int]]  # (request, new tokens); decode steps have n == 1

    @property
    def reqs(self) -> list[Req]:
        return [r for r, _ in self.plan]


class PageAdmission:
    """KVAdmission over the page allocator: grants allocate immediately."""

    def __init__(self, allocator: PageAllocator, page_size: int, headroom_pages: int,
                 whole_prompt: bool = False) -> None:
        self.allocator = allocator
        self.page_size = page_size
        self.headroom = headroom_pages
        # PD prefill: all of a prompt's pages at its first chunk, since the decode side
        # registers a fixed destination page list for the whole prompt
        self.whole_prompt = whole_prompt

    def pages_needed(self, req: Req, new_tokens: int) -> int:
        tokens = req.prefill_target if self.whole_prompt else req.kv_len + new_tokens
        total = -(-tokens // self.page_size)
        return max(total - len(req.pages), 0)

    def can_admit(self, req: SchedReq, new_tokens: int) -> bool:
        assert isinstance(req, Req)
        return self.pages_needed(req, new_tokens) + self.headroom <= self.allocator.num_free

    def admit(self, req: SchedReq, new_tokens: int) -> None:
        assert isinstance(req, Req)
        req.pages.extend(self.allocator.alloc(self.pages_needed(req, new_tokens)))


class Scheduler:
    def __init__(self, allocator: PageAllocator, page_size: int, prefill_policy: PrefillPolicy,
                 decode_policy: DecodePolicy, max_running_requests: int, chunked_prefill_size: int,
                 max_prefill_tokens: int, whole_prompt_pages: bool = False) -> None:
        self.allocator = allocator
        self.whole_prompt_pages = whole_prompt_pages
        self.page_size = page_size
        self.prefill_policy = prefill_policy
        self.decode_policy = decode_policy
        self.max_running = max_running_requests
        self.chunk_size = chunked_prefill_size
        self.max_prefill_tokens = max(max_prefill_tokens, chunked_prefill_size)
        self.waiting: list[Req] = []  # arrival order
        self.running: list[Req] = []  # admission order
        self.num_retractions = 0

    # ------------------------------------------------------------------ queues
    def add(self, req: Req) -> None:
        req.state = ReqState.WAITING
        # arrival order; retracted requests go back in front of later arrivals
        bisect.insort(self.waiting, req, key=lambda r: r.arrival)

    def find(self, rid: str) -> Req | None:
        for q in (self.waiting, self.running):
            for r in q:
                if r.rid == rid:
                    return r
        return None

    def remove(self, req: Req) -> None:
        """Take a request out of the queues and free its pages (finish, abort, error)."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.release(req)

    def release(self, req: Req) -> None:
        if req.pages:
            self.allocator.free(req.pages)
            req.pages = []
        req.kv_len = 0

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_used_tokens(self) -> int:
        return self.allocator.num_used * self.page_size

    def check_integrity(self, held_elsewhere: int = 0) -> None:
        """``held_elsewhere``: pages held outside the queues (PD transfers in flight)."""
        self.allocator.check_integrity()
        held = sum(len(r.pages) for r in self.waiting + self.running) + held_elsewhere
        if held != self.allocator.num_used:
            raise RuntimeError(f"pages held by requests ({held}) != pages in use ({self.allocator.num_used})")

    # ------------------------------------------------------------------ steps
    def schedule(self, now: float) -> ScheduledStep | None:
        if self.waiting:
            started = sum(1 for r in self.waiting if r.pages)
            budget = PrefillBudget(
                token_budget=self.max_prefill_tokens,
                chunk_size=self.chunk_size,
                new_req_slots=self.max_running - len(self.running) - started,
                kv=PageAdmission(self.allocator, self.page_size, headroom_pages=len(self.running),
                                 whole_prompt=self.whole_prompt_pages),
            )
            plan = self.prefill_policy.schedule(self.waiting, now, budget)
            if plan:
                return ScheduledStep(ForwardMode.EXTEND, list(plan))
        if self.running:
            batch = self._fit_decode(self.decode_policy.schedule(self.running, now))
            if batch:
                return ScheduledStep(ForwardMode.DECODE, [(r, 1) for r in batch])
        return None

    def _fit_decode(self, batch: Sequence[Req]) -> list[Req]:
        """Give every request in the batch a slot for its next token, retracting the newest
        running requests while the pool is short."""
        batch = list(batch)
        needs = [r for r in batch if r.kv_len >= len(r.pages) * self.page_size]
        while len(needs) > self.allocator.num_free and len(self.running) > 1:
            victim = self.running[-1]
            self.retract(victim)
            if victim in batch:
                batch.remove(victim)
            if victim in needs:
                needs.remove(victim)
        if len(needs) > self.allocator.num_free:
            return []  # a lone request larger than the pool: the engine finishes it
        for r in needs:
            r.pages.extend(self.allocator.alloc(1))
        return batch

    def retract(self, req: Req) -> None:
        self.running.remove(req)
        self.release(req)
        req.num_retractions += 1
        self.num_retractions += 1
        self.add(req)

    def after_extend(self, plan: Sequence[tuple[Req, int]]) -> list[Req]:
        """Advance KV lengths; return the requests whose prefill just completed and that need a
        first token sampled (resumed ones already have theirs)."""
        need_sample = []
        for r, n in plan:
            r.kv_len += n
            if r.prefill_remaining == 0:
                self.waiting.remove(r)
                r.state = ReqState.RUNNING
                self.running.append(r)
                if not r.output_ids:
                    need_sample.append(r)
        return need_sample

    def after_decode(self, reqs: Sequence[Req]) -> None:
        for r in reqs:
            r.kv_len += 1
