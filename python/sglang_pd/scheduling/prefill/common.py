"""What the deadline-aware prefill policies share: deadlines, work in seconds, the budget walk.

Definitions every policy here uses (docs/prefill_scheduling.md):
- Deadline: ``arrival + slo_ttft - deadline margin``. A request without a TTFT SLO (none in the
  request and no ``--slo-ttft-ms`` default) gets ``cfg.prefill_no_slo_ttft_ms`` (30 s): a large
  default deadline, so it ranks behind SLO'd work yet ages like any other request instead of
  waiting behind every SLO'd request forever. On prefill servers the margin
  (``cfg.prefill_deadline_margin_ms``) reserves the KV transfer and the first decode step after
  the prefill, since TTFT is measured at the first token, not at the end of prefill.
- Work: seconds from the ``PrefillCostModel`` for the tokens still to prefill
  (``prefill_remaining``, after prefix hits and done chunks) over the context already in the
  pool, alone, one chunk of ``chunked_prefill_size`` per step.
- The walk: in the policy's order, every grant through ``budget.grant`` (token budget, chunk
  cap, new-request slots and KV admission live there). Whole requests while the budget lasts;
  the first one cut by the token budget ends the step. A cut by the per-request chunk cap does
  not (the step budget is not spent: the walk goes on). A KV refusal ends the step: no
  backfilling past a request the pool cannot take now, or small prompts would keep taking the
  pages it waits for. Requests that would need a new-request slot when none is left are
  skipped (started ones may still continue).
- Chunk sizes: at most ``chunked_prefill_size`` per request; with a step-time budget
  (``--prefill-time-budget-ms``, Medha's adaptive chunking, ``chunking.py``) the largest chunk
  that fits the time left, a request that fits nothing skipped for this step.
- Bound on preempted prefills (ours): a request that starts and is not finished in this step
  becomes a partly prefilled request holding pages (whole-prompt pages on a PD prefill server).
  No new one starts while ``cfg.prefill_max_partial`` are partly prefilled; requests that
  finish within the step are still admitted.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Callable, Generic, Sequence

from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.cost_model import PrefillCostModel
from sglang_pd.scheduling.prefill.chunking import TimeBudgetChunker
from sglang_pd.scheduling.step import StepProfile
from sglang_pd.scheduling.types import PrefillBudget, PrefillPolicy, R


class Queue(Generic[R]):
    """One read of the waiting queue: the per-request numbers the policies need, each read once
    (``SchedReq`` lengths are properties: reading them is most of a decision's cost, so
    ``prefill_remaining`` of every request is read only by policies that sort on it)."""

    __slots__ = ("reqs", "pre", "fresh", "n_started", "_rem")

    def __init__(self, waiting: Sequence[R]) -> None:
        self.reqs = waiting
        self.pre = [r.prefilled_len for r in waiting]
        # not started: no KV of its own yet (prefix-cache hits count as context, not as started)
        self.fresh = [p <= r.cached_len for p, r in zip(self.pre, waiting)]
        self.n_started = len(self.fresh) - sum(self.fresh)  # partly prefilled (holding pages)
        self._rem: list[int] | None = None

    @property
    def rem(self) -> list[int]:
        if self._rem is None:
            self._rem = [r.prefill_remaining for r in self.reqs]
        return self._rem

    def __len__(self) -> int:
        return len(self.pre)


class DeadlinePolicy(PrefillPolicy):
    """Base of the deadline-aware prefill policies: a cost model (shared shape, own fit) and the
    definitions above. ``cost_model`` given = fixed from outside (tests, the simulator)."""

    def __init__(self, cfg: PolicyConfig | None = None, cost_model: PrefillCostModel | None = None) -> None:
        super().__init__(cfg)
        self.model = cost_model if cost_model is not None else PrefillCostModel.from_config(self.cfg)
        self.chunk = self.cfg.chunked_prefill_size
        self.default_slo_s = self.cfg.slo_ttft_s or self.cfg.prefill_no_slo_ttft_ms / 1e3
        self.margin_s = self.cfg.prefill_deadline_margin_ms / 1e3
        self.max_partial = self.cfg.prefill_max_partial

    def observe(self, step: StepProfile, elapsed_s: float, now: float) -> None:
        self.model.observe(step, elapsed_s, now)

    def slo_s(self, req: R) -> float:
        return req.slo_ttft_s or self.default_slo_s

    def deadline(self, req: R) -> float:
        return req.arrival + (req.slo_ttft_s or self.default_slo_s) - self.margin_s

    def deadlines(self, q: Queue) -> list[float]:
        d, m = self.default_slo_s, self.margin_s
        return [r.arrival + (r.slo_ttft_s or d) - m for r in q.reqs]

    def work_s(self, req: R) -> float:
        """Seconds of prefill still to do (alone, chunk by chunk)."""
        return self.model.request_s(req.prefill_remaining, req.prefilled_len, self.chunk)

    def works(self, q: Queue) -> list[float]:
        return self.model.request_times(q.rem, q.pre, self.chunk)

    def total_work_s(self, req: R) -> float:
        """Seconds of the whole prefill from its prefix hits on (Medha's w_total)."""
        new = req.prefilled_len + req.prefill_remaining - req.cached_len
        return self.model.request_s(new, req.cached_len, self.chunk)

    def rho(self, req: R, now: float) -> float:
        """Medha §4.1's relative slack: (deadline - now - remaining work) / total work."""
        return (self.deadline(req) - now - self.work_s(req)) / max(self.total_work_s(req), 1e-9)

    def walk(self, q: Queue, order: Sequence[int], budget: PrefillBudget,
             fits: Callable[[R, int], bool | None] | None = None, now: float = 0.0) -> list[tuple[R, int]]:
        chunker = TimeBudgetChunker.for_config(self.cfg, self.model, lambda r: self.rho(r, now),
                                               budget.rider_contexts)
        return walk(q, order, budget, self.max_partial, fits, chunker)


def walk(q: Queue, order: Sequence[int], budget: PrefillBudget, max_partial: int,
         fits: Callable[[R, int], bool | None] | None = None,
         chunker: TimeBudgetChunker | None = None) -> list[tuple[R, int]]:
    """Grant ``q.reqs[i] for i in order`` (every waiting request once, in the policy's order)
    front to back under the rules in the module docstring. ``fits(req, n)``, when given, is a
    policy's own constraint, asked right before the grant of ``n`` tokens: True grants, False
    skips the request, None ends the walk (nothing later can fit)."""
    plan: list[tuple[R, int]] = []
    reqs, rems, fresh_of = q.reqs, q._rem, q.fresh
    partial = started_left = q.n_started
    for i in order:
        rem = rems[i] if rems is not None else reqs[i].prefill_remaining
        fresh = fresh_of[i]
        n_want = min(rem, budget.token_budget, budget.chunk_size)
        if fresh:
            if budget.new_req_slots <= 0:
                if started_left <= 0:
                    break  # only fresh requests are left and none may start
                continue
            if n_want < rem and partial >= max_partial:
                continue  # would be one more partly prefilled request holding pages
        else:
            started_left -= 1
        req = reqs[i]
        cap = None
        if chunker is not None:  # Medha adaptive chunking: the chunk that fits the time left
            cap = chunker.size(req, n_want)
            if cap == 0:
                continue  # skipped this step (never re-queued in a loop)
            if fresh and cap < rem and partial >= max_partial:
                continue
            n_want = cap
        if fits is not None:
            ok = fits(req, n_want)
            if not ok:
                if ok is None:
                    break
                continue
        n = budget.grant(req, cap)
        if n == 0:
            break  # KV refusal: no backfilling past it
        if chunker is not None:
            chunker.add(req, n)
        plan.append((req, n))
        if fresh and n < rem:
            partial += 1
        if budget.token_budget <= 0:
            break
    return plan


def fcfs_finish(arrivals: Sequence[float], works: Sequence[float], now: float) -> list[float]:
    """Kairos Alg. 2 for every request at once: the finish time of each under FCFS from ``now``,
    counting all requests that arrived at or before it (``<=``: equal arrivals count each
    other). Every waiting request has arrived, so max(t, arrival) = t and this is a prefix sum
    over the arrival order (``arrivals`` ascending). O(n)."""
    fin = list(accumulate(works, initial=now))[1:]
    for i in range(len(fin) - 2, -1, -1):
        if arrivals[i] == arrivals[i + 1]:
            fin[i] = fin[i + 1]
    return fin
