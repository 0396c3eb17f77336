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
from dataclasses import dataclass
from typing import Protocol

from sglang_pd.core.page_admission import PageAdmission
from sglang_pd.core.page_allocator import Allocator
from sglang_pd.core.prefix_hits import PrefixHits
from sglang_pd.core.progress import pick_victim, reserved_pages
from sglang_pd.core.radix_cache import EvictingAllocator, RadixCache
from sglang_pd.core.step import ForwardMode, ReqState, StepProfile, StepShape
from sglang_pd.scheduling.colocated import ColocatedInterleave
from sglang_pd.scheduling.config import PREFILL_ROLES, PolicyConfig
from sglang_pd.scheduling.types import DecodePolicy, PrefillBudget, PrefillPolicy, SchedReq
from sglang_pd.scheduling.waiting import WaitingQueue

MIN_HOLD_S = 1e-4  # a policy's hold that is already due still waits this long


class SchedulerReq(SchedReq, Protocol):
    """What the mechanism needs of a request beyond the policy view: its pages and KV length."""

    pages: list[int]
    kv_len: int
    state: ReqState
    num_retractions: int

    @property
    def prefill_target(self) -> int: ...  # tokens that need KV before the next decode step


@dataclass
class ScheduledStep:
    mode: ForwardMode
    plan: list[tuple[SchedulerReq, int]]  # (request, new tokens); decodes have n == 1, last
    shape: StepShape
    num_decode: int = 0  # the trailing decodes of a DECODE or MIXED step

    @property
    def reqs(self) -> list[SchedulerReq]:
        return [r for r, _ in self.plan]

    @property
    def prefill_plan(self) -> list[tuple[SchedulerReq, int]]:
        return self.plan[: len(self.plan) - self.num_decode]

    @property
    def decode_reqs(self) -> list[SchedulerReq]:
        return [r for r, _ in self.plan[len(self.plan) - self.num_decode:]]

    def profile(self, total_s: float = 0.0, forward_s: float = 0.0) -> StepProfile:
        """What the step held, KV lengths read before the step advanced them."""
        contexts = [r.kv_len for r, _ in self.plan]
        attn = sum(n * (n + 2 * h) for (_, n), h in zip(self.plan, contexts))
        return StepProfile(self.mode, len(self.plan), self.shape.num_tokens, sum(contexts),
                           max(contexts) if contexts else 0, self.shape, total_s, forward_s,
                           self.num_decode, attn)


class Scheduler:
    def __init__(self, allocator: Allocator, cfg: PolicyConfig, prefill_policy: PrefillPolicy,
                 decode_policy: DecodePolicy, whole_prompt_pages: bool = False,
                 prefix_cache: bool = False) -> None:
        # with a prefix cache (core/prefix_hits.py) the scheduler sees evictable cached pages as
        # free (EvictingAllocator); ``base_allocator`` is the allocator itself
        self.base_allocator = allocator
        self.hits: PrefixHits | None = None
        if prefix_cache:
            cache = RadixCache(cfg.page_size, allocator)
            self.hits = PrefixHits(cache, allocator)
            allocator = EvictingAllocator(allocator, cache)
        self.allocator = allocator
        self.cfg = cfg
        self.page_size = cfg.page_size
        self.prefill_policy = prefill_policy
        self.decode_policy = decode_policy
        # which class this prefill instance serves first (request_class.PREFILL_ROLES): our state,
        # handed to the policy in every budget; only a policy that serves roles lets it change
        self.prefill_role = cfg.prefill_role
        self.whole_prompt_pages = whole_prompt_pages
        self.max_running = cfg.max_running_requests
        self.chunk_size = cfg.chunked_prefill_size
        self.max_prefill_tokens = max(cfg.max_prefill_tokens, cfg.chunked_prefill_size)
        # arrival order, with the columns the prefill policies read (scheduling/waiting.py): every
        # change to a waiting request's lengths goes through here and is written back (refresh)
        self.waiting: WaitingQueue = WaitingQueue(chunk=cfg.chunked_prefill_size)
        self.running: list[SchedulerReq] = []  # admission order
        self.parked: dict[SchedulerReq, None] = {}  # held outside the queues (PD), insertion order
        self.quarantine: dict[object, list[int]] = {}  # pages a peer may still write, by key
        self.hold_deadline: float | None = None  # the prefill policy waits until then
        self.num_retractions = 0
        self.num_preempted_prefills = 0
        # colocated: prefill interleaves with running decodes by a time budget (colocated.py)
        self.interleave = ColocatedInterleave(cfg) if cfg.role == "colocated" else None
        self._decodes_waited = False  # the last step was prefill only while decodes ran
        self.num_preempted_prefill_tokens = 0  # prefill work thrown away (tokens), for the watchdog
        # progress rule 3 (core/progress.py): times each waiting request's partial prefill was
        # thrown away, and positions in the policy's most recent non-empty plan
        self.prefill_preemptions: dict[SchedulerReq, int] = {}
        self.last_rank: dict[SchedulerReq, int] = {}

    # ------------------------------------------------------------------ queues
    def set_prefill_role(self, role: str) -> None:
        """Switch the class this prefill instance serves first (the router's pool controller)."""
        if role not in PREFILL_ROLES:
            raise ValueError(f"prefill role must be one of {PREFILL_ROLES}, got {role!r}")
        if not self.prefill_policy.serves_roles:
            raise ValueError("the prefill role can only change on a server started with "
                             "--prefill-queues dual (or a --prefill-role)")
        self.prefill_role = role

    def add(self, req: SchedulerReq) -> None:
        req.state = ReqState.WAITING
        if self.hits is not None and not req.pages:
            self.hits.rematch(req)  # its prefix hit, looked up (locked only at admission)
        # arrival order; retracted requests go back in front of later arrivals
        self.waiting.add(req)

    def all_reqs(self) -> list[SchedulerReq]:
        return self.waiting + self.running + list(self.parked)

    def find(self, rid: str) -> SchedulerReq | None:
        return next((r for r in self.all_reqs() if r.rid == rid), None)

    def remove(self, req: SchedulerReq) -> None:
        """Take a request out of wherever it is and free its pages (finish, abort, error)."""
        if req in self.parked:
            del self.parked[req]
        elif req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.release(req)
        self.prefill_preemptions.pop(req, None)
        self.last_rank.pop(req, None)

    def release(self, req: SchedulerReq) -> None:
        """``req`` gives its pages up (its computed KV joins the prefix cache, if any)."""
        if self.hits is not None:
            self.hits.release(req)
        elif req.pages:
            self.allocator.free(req.pages)
            req.pages = []
        req.kv_len = 0

    def flush_cache(self) -> int:
        """Empty the prefix cache of everything no request uses; pages freed."""
        return self.hits.cache.flush() if self.hits is not None else 0

    # ------------------------------------------------------------------ PD parking
    def park(self, req: SchedulerReq, num_pages: int = 0) -> None:
        """Hold ``req`` outside the queues with its pages (allocating ``num_pages`` more): a PD
        prefill whose KV is being sent, a PD decode whose KV is arriving."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        if num_pages:
            req.pages.extend(self.allocator.alloc(num_pages))
        req.state = ReqState.PARKED
        self.parked[req] = None

    def unpark(self, req: SchedulerReq) -> None:
        """A parked request joins the waiting queue as it is (pages and KV kept; arrival order):
        a PD prefill request once its decode has registered its destination."""
        del self.parked[req]
        self.add(req)

    def start_running(self, req: SchedulerReq, kv_len: int) -> None:
        """A parked request whose KV (``kv_len`` tokens) has arrived joins the decode batch."""
        self.parked.pop(req, None)
        req.kv_len = kv_len
        req.state = ReqState.RUNNING
        self.running.append(req)

    def quarantine_pages(self, key: object, req: SchedulerReq) -> None:
        """Take ``req``'s pages away from it but keep them allocated until ``release_quarantine``:
        a failed or aborted transfer's peer may still be writing into them."""
        pages = self.hits.own_pages(req) if self.hits is not None else req.pages
        req.pages = []
        if pages:
            self.quarantine.setdefault(key, []).extend(pages)

    def release_quarantine(self, key: object) -> None:
        pages = self.quarantine.pop(key, None)
        if pages:
            self.allocator.free(pages)

    @property
    def pending_pages(self) -> int:
        """Pages that will come back without any scheduling decision (transfers end or time out)."""
        return sum(len(r.pages) for r in self.parked) + sum(map(len, self.quarantine.values()))

    # ------------------------------------------------------------------ state
    @property
    def has_work(self) -> bool:
        """Compute to do (parked requests wait on transfers, not on compute)."""
        return bool(self.waiting or self.running)

    def holding(self, now: float) -> bool:
        return self.hold_deadline is not None and now < self.hold_deadline

    @property
    def num_used_tokens(self) -> int:
        return self.allocator.num_used * self.page_size

    def check_integrity(self) -> None:
        self.allocator.check_integrity()
        self.waiting.check()
        hits = self.hits
        held = sum(len(r.pages) - (hits.shared(r) if hits else 0) for r in self.all_reqs())
        held += sum(map(len, self.quarantine.values()))
        cached = hits.cache.num_pages if hits is not None else 0
        if held + cached != self.base_allocator.num_used:
            raise RuntimeError(f"pages held by requests and quarantine ({held}) + cached ({cached}) "
                               f"!= pages in use ({self.base_allocator.num_used})")

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
            if lace is not None:
                cap = lace.prefill_tokens(max((r.kv_len for r in started), default=0), chunk)
                tokens, chunk = min(tokens, cap), min(chunk, cap)
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
            )
            plan = list(self.prefill_policy.schedule(self.waiting, now, budget))
            if plan:
                self.last_rank = {r: i for i, (r, _) in enumerate(plan)}
            if started and (kv.refused or (not plan and budget.hold_deadline is None)):
                plan += self._continue_started(started, plan, budget)
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

    def _step(self, mode: ForwardMode, plan: list[tuple[SchedulerReq, int]], num_decode: int) -> ScheduledStep:
        if mode is ForwardMode.DECODE:
            return ScheduledStep(mode, plan, StepShape(len(plan), len(plan)), num_decode)
        tokens = sum(n for _, n in plan)
        bucket = (self.cfg.buckets.bucket(max(n for _, n in plan), len(plan))
                  if mode is ForwardMode.EXTEND else None)
        return ScheduledStep(mode, plan, StepShape(len(plan), tokens, bucket), num_decode)

    def _needs_page(self, req: SchedulerReq) -> bool:
        return req.kv_len >= len(req.pages) * self.page_size

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

    def _fit_decode(self, batch: Sequence[SchedulerReq]) -> list[SchedulerReq]:
        """Give every request in the batch a slot for its next token. While the pool is short,
        partial prefills give their pages back first (they have produced nothing yet), then
        the newest running requests are retracted."""
        batch = list(batch)
        ps = self.page_size  # _needs_page inlined: this runs for every request every decode step
        needs = [r for r in batch if r.kv_len >= len(r.pages) * ps]
        while len(needs) > self.allocator.num_free:
            partial = self._victim_partial()
            if partial is not None:
                self.preempt_prefill(partial)
                continue
            if len(self.running) <= 1:
                return []  # a lone request holding the whole pool: unblock() decides
            victim = self.running[-1]
            self.retract(victim)
            if victim in batch:
                batch.remove(victim)
            if victim in needs:
                needs.remove(victim)
        for r in needs:
            r.pages.extend(self.allocator.alloc(1))
        return batch

    def _victim_partial(self, bounded: bool = True) -> SchedulerReq | None:
        """Progress rule 3: the partial prefill the policy ranks last, within the bound."""
        partials = [r for r in self.waiting if r.pages]
        if not partials:
            return None
        return pick_victim(partials, self.last_rank, self.prefill_preemptions, self.page_size,
                           bounded)

    def preempt_prefill(self, req: SchedulerReq) -> None:
        """A waiting request gives back the pages of its partial prefill (recomputed later)."""
        self.num_preempted_prefill_tokens += req.kv_len
        self.release(req)
        if self.hits is not None:
            self.hits.rematch(req)  # what it computed may be cached now
        self.waiting.refresh(req)
        self.num_preempted_prefills += 1
        self.prefill_preemptions[req] = self.prefill_preemptions.get(req, 0) + 1

    def retract(self, req: SchedulerReq) -> None:
        self.running.remove(req)
        self.release(req)
        req.num_retractions += 1
        self.num_retractions += 1
        self.add(req)

    def unblock(self, now: float) -> list[tuple[SchedulerReq, str]]:
        """``schedule`` returned nothing although work is queued. Free what blocks progress and
        return the requests that can never run, with the reason (the caller aborts them).
        Nothing is returned while the policy holds or while parked/quarantined pages will
        come back on their own."""
        if self.holding(now):
            return []
        never = [r for r in self.waiting if self._pages_for(r.prefill_target) > self.allocator.num_usable]
        if never:  # larger than the whole pool (grown by its output): no amount of waiting helps
            return [(r, (f"the request needs {self._pages_for(r.prefill_target) * self.page_size} KV "
                         f"tokens; the pool holds only {self.allocator.num_usable * self.page_size}"))
                    for r in never]
        if self.pending_pages:
            return []
        partial = self._victim_partial()
        if partial is not None:  # pages short: the partial the policy ranks last gives way
            self.preempt_prefill(partial)
            return []
        if self.running:
            lone = self.running[0]
            if len(self.running) == 1 and self._needs_page(lone) and self.allocator.num_free == 0:
                return [(lone, "out of KV cache memory: the request's KV fills the whole pool")]
            return []  # the decode policy chose to wait, or decodes will give pages back
        partial = self._victim_partial(bounded=False)
        if partial is not None:  # unreachable while the reservation holds (core/progress.py)
            self.preempt_prefill(partial)
            return []
        if self.waiting:
            return [(self.waiting[0], (f"the prefill policy {self.prefill_policy.name!r} scheduled "
                                       f"nothing with the KV pool free (a policy bug)"))]
        return []

    def _pages_for(self, tokens: int) -> int:
        return -(-tokens // self.page_size)

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
