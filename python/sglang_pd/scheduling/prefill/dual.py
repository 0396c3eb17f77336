"""Dual short/long prefill queues on one instance (PLA-Serve §3.2), short batches by AWD.

``--prefill-queues dual`` (or a ``--prefill-role`` other than both) wraps the ``--prefill-policy``
in this: the scheduler's one arrival-ordered ``waiting`` list is partitioned by a stable key,
the request's new tokens ``prefilled_len + prefill_remaining - cached_len`` (unchanged by its
chunks): key <= threshold is short. The threshold is ``--short-prefill-threshold`` or, with
``auto``, PLA-Serve §2.1's fitted compute/memory boundary L_m (``threshold.py``: the one
boundary, also the chunker's "long").
A step is all-short or all-long (mutual exclusion): short steps are AWD batches
(``awd.py``), long steps come from the wrapped policy (fcfs: PLA's one request by fixed
chunks; any registry policy works).

How one instance alternates (PLA-Serve runs each instance in one mode and leaves this open;
ours): SLA-first across the two heads with a bound on the long queue's wait.
- AWD wants to dispatch: the short batch runs, unless the long head is overdue (waited more
  than ``prefill_long_max_wait_ms`` since it arrived or since the last long step ended) or a
  long prompt is urgent: then one long step runs first. So a long prompt advances at least one
  chunk per bound, whatever the short traffic.
- Urgent (ours, issue 34): a long prompt whose slack, its deadline - now - its remaining work
  x (1 + ``URGENT_WORK_MARGIN``), is below the short batch's predicted time (after that batch it
  could no longer end in time) while it can still end in time if it goes now (slack without the
  margin >= 0: one already past saving gains nothing from passing shorts that may still be in
  time; it moves by the wait bound). The long policy then picks among the urgent ones only, so
  the step goes to a prompt it saves. The wait bound alone is not enough once long prompts are
  chunked finely (``--prefill-time-budget-ms``): each chunk restarts the bound, so under steady
  short traffic a prompt of k chunks took k bounds and missed its SLO (bench_cluster, session
  13). Running a chunk does not shrink the slack (now and the work move together, the margin
  grows it), so an urgent prompt runs until it has slack again: just in time, shorts first
  until then.
- AWD holds (filling a batch): a long chunk runs meanwhile, sized by the cost model to end by
  the moment AWD wants to dispatch; with too little time left for ``MIN_CHUNK`` tokens none
  runs (the long queue's wait bound still moves it). Never a filler that overruns the moment.
- Nothing short: the long policy alone; nothing long while AWD holds: the engine sleeps until
  AWD's moment (``budget.hold_until``; a hold never aborts anything).
Roles (``--prefill-role``: scheduler state, ``budget.role``, switched at runtime by
``Scheduler.set_prefill_role``): ``short`` serves long
requests only when no short one waits, or when the long head is overdue; ``long`` serves short
requests only when no long one waits (as one batch, no AWD wait: a long instance has nothing to
gain from waiting), or when the short head is overdue. No request is ever stranded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np
from sglang_pd_router.request_class import classify

from sglang_pd.core.step import StepProfile
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.cost_model import PrefillCostModel
from sglang_pd.scheduling.prefill.awd import AwdBatcher, AwdDecision
from sglang_pd.scheduling.prefill.chunking import MIN_CHUNK, largest_chunk
from sglang_pd.scheduling.prefill.common import Queue, queue_deadlines
from sglang_pd.scheduling.prefill.threshold import ShortThreshold
from sglang_pd.scheduling.slo import no_slo_ttft_s
from sglang_pd.scheduling.types import PrefillBudget, PrefillPolicy, R, SchedReq
from sglang_pd.scheduling.waiting import WaitingQueue

# urgency's margin on a long prompt's predicted remaining work: the cost model is fitted online
# and a TTFT ends after the prefill (the KV hand-off, the decode's first step), so just in time
# by the model alone lands late
URGENT_WORK_MARGIN = 0.25


class DualQueuePrefillPolicy(PrefillPolicy):
    serves_roles = True  # budget.role picks which queue goes first

    def __init__(self, cfg: PolicyConfig, long_policy: PrefillPolicy,
                 cost_model: PrefillCostModel | None = None) -> None:
        super().__init__(cfg)
        self.long_policy = long_policy
        shared = getattr(long_policy, "model", None)
        self._own_model = cost_model is None and not isinstance(shared, PrefillCostModel)
        self.model = cost_model or (shared if isinstance(shared, PrefillCostModel)
                                    else PrefillCostModel.from_config(cfg))
        self.awd = AwdBatcher(cfg, self.model)
        self.long_max_wait = cfg.prefill_long_max_wait_ms / 1e3
        # the one short/long boundary, shared with the long policy's chunker when it has one
        shared_thr = getattr(long_policy, "short_threshold", None)
        self.short_threshold = shared_thr if isinstance(shared_thr, ShortThreshold) and \
            shared_thr.model is self.model else ShortThreshold(cfg, self.model)
        self._fixed_threshold = cfg.short_prefill_threshold
        self.last_long_step = float("-inf")
        self.last_short_step = float("-inf")
        self.last_class = ""  # class of the last step this policy planned
        self.no_slo_s = no_slo_ttft_s(cfg)  # deadlines as the deadline policies read them (common.py)
        self.margin_s = cfg.prefill_deadline_margin_ms / 1e3

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"dual({self.long_policy.name})"

    # ------------------------------------------------------------------ classes
    def class_threshold(self) -> int:
        return self.threshold()

    def use_cost_model(self, model: PrefillCostModel) -> None:
        self.model = self.awd.model = model
        self.long_policy.use_cost_model(model)

    def threshold(self, cached_len: int = 0) -> int:
        """Short/long boundary in new tokens (``threshold.py``) for a prompt over ``cached_len``."""
        return self.short_threshold(cached_len)

    def refresh_threshold(self, now: float) -> None:
        self.short_threshold.refresh(now)

    def is_short(self, req: SchedReq) -> bool:
        new = req.prefilled_len + req.prefill_remaining - req.cached_len
        return classify(new, self.threshold(req.cached_len)) == "short"

    def short_mask(self, q: Queue[R]) -> np.ndarray:
        """``is_short`` of every request of the queue, from its columns (``classify``'s rule,
        vectorised)."""
        new = q.pre + q.rem - q.cached
        short: np.ndarray
        if self._fixed_threshold is not None:
            short = new <= self._fixed_threshold
            return short
        thr = np.full(len(new), self.short_threshold.value, dtype=np.int64)
        hit = np.flatnonzero(q.cached > 0)
        if len(hit):  # re-prefills over a context: their own boundary (a few; one per context)
            thr[hit] = [self.threshold(h) for h in q.cached[hit].tolist()]
        short = new <= thr
        return short

    def partition(self, waiting: Sequence[R]) -> tuple[list[R], list[R]]:
        q = Queue(waiting)
        mask = self.short_mask(q)
        return q.pick(np.flatnonzero(mask)), q.pick(np.flatnonzero(~mask))

    @staticmethod
    def _part(waiting: Sequence[R], q: Queue[R], idx: np.ndarray) -> Sequence[R]:
        """The requests at ``idx``: a ``WaitingQueue`` with its columns taken when the queue has
        them (the wrapped policy then reads columns too), else a list."""
        if isinstance(waiting, WaitingQueue):
            return waiting.subset(idx)
        return q.pick(idx)

    # ------------------------------------------------------------------ learning
    def observe(self, step: StepProfile, elapsed_s: float, now: float) -> None:
        self.long_policy.observe(step, elapsed_s, now)
        if self._own_model:
            self.model.observe(step, elapsed_s, now)
        # waits are measured from the END of the last step of a class: a long step longer than
        # the wait bound would otherwise make the long queue overdue again at once, and short
        # batches would never run between its chunks
        if self.last_class == "long":
            self.last_long_step = now
        elif self.last_class == "short":
            self.last_short_step = now

    # ------------------------------------------------------------------ the step
    def schedule(self, waiting: Sequence[R], now: float, budget: PrefillBudget) -> list[tuple[R, int]]:
        self.refresh_threshold(now)
        q = Queue(waiting)
        mask = self.short_mask(q)
        short_idx, long_idx = np.flatnonzero(mask), np.flatnonzero(~mask)
        # partitions are built when used (issue 20: decision time); both keep arrival order
        long_head = float(q.arrival[long_idx[0]]) if len(long_idx) else 0.0
        long_overdue = len(long_idx) > 0 and now - max(long_head, self.last_long_step) > self.long_max_wait
        if budget.role == "long":
            short_overdue = len(short_idx) > 0 and \
                now - max(float(q.arrival[short_idx[0]]), self.last_short_step) > self.long_max_wait
            if len(long_idx) and not short_overdue:
                return self._long(self._part(waiting, q, long_idx), now, budget)
            return self._short_now(q.sub(short_idx), now, budget)
        short = q.sub(short_idx)
        decision = self.awd.decide(short, now, budget.token_budget, budget.new_req_slots + short.n_started)
        if decision.batch and len(long_idx) and not long_overdue:  # an urgent one goes first, alone
            urgent = self.long_urgent(q, long_idx, self._batch_s(decision, budget.chunk_size),
                                      now, budget.chunk_size)
            if urgent.any():
                return self._long(self._part(waiting, q, long_idx[urgent]), now, budget)
        if decision.batch and not long_overdue:
            return self._short(decision, now, budget)
        if len(long_idx) and (long_overdue or not len(short_idx) or budget.role == "both"):
            if len(short_idx) and not long_overdue and decision.hold_until is not None:
                # fill AWD's wait with a long step that ends by its dispatch moment: sized by
                # the cost model at the longest long context (the long policy picks which);
                # too little time left for MIN_CHUNK tokens: no filler, hold
                fit = largest_chunk(self.model, decision.hold_until - now - self.model.coeffs.launch_s,
                                    int(q.pre[long_idx].max()), min(budget.chunk_size, budget.token_budget))
                if fit < MIN_CHUNK:
                    budget.hold_until(decision.hold_until)
                    return []
                budget.chunk_size = budget.token_budget = fit
            return self._long(self._part(waiting, q, long_idx), now, budget)
        if decision.batch:
            return self._short(decision, now, budget)
        if decision.hold_until is not None:
            budget.hold_until(decision.hold_until)
        return []

    def long_urgent(self, q: Queue[R], idx: np.ndarray, short_s: float, now: float, chunk: int) -> np.ndarray:
        """Which of the long prompts at ``idx`` would miss their deadline if a short step of
        ``short_s`` ran first but not if they went now (module docstring: "Urgent"); the long
        policy then picks among those only, so the step serves the one it is for. Deadlines as
        the deadline policies read them (``queue_deadlines``: the waiting queue's kept column)."""
        work = self.model.request_times_array(q.rem[idx], q.pre[idx], chunk, empty_is_zero=True)
        slack = queue_deadlines(q, self.no_slo_s, self.margin_s)[idx] - now - work
        # saved only by going now: late with the short step first (margin on), in time without it
        # (a prompt already past saving gains nothing from going first, and the shorts it would
        # pass may still be in time: it moves by the wait bound, as before)
        urgent: np.ndarray = (slack - URGENT_WORK_MARGIN * work < short_s) & (slack >= 0.0)
        return urgent

    def _batch_s(self, decision: AwdDecision, chunk: int) -> float:
        """The short batch's predicted time: its new tokens as one step (shorts fit a chunk)."""
        if decision.queue is not None and decision.positions is not None:
            tokens = int(decision.queue.rem[decision.positions].sum())
        else:
            tokens = sum(r.prefill_remaining for r in decision.batch)
        return self.model.request_s(tokens, 0, chunk)

    def _grant_all(self, reqs: Sequence[R] | Queue[R], budget: PrefillBudget) -> list[tuple[R, int]]:
        """``budget.grant`` to each in order: a request that needs a new slot when none is left
        is skipped (started ones may still go), any other refusal ends it (no backfilling
        past a KV refusal). Worked out on the numbers, KV asked once (``grant_run``)."""
        q = reqs if isinstance(reqs, Queue) else Queue(reqs)
        tokens, slots, chunk = budget.token_budget, budget.new_req_slots, budget.chunk_size
        rem = q.rem
        if len(rem) and rem.min() > 0 and rem.max() <= chunk and int(rem.sum()) <= tokens and \
                len(rem) - q.n_started <= slots:  # the usual batch: each takes all it has left
            start = len(budget.granted)
            budget.grant_run(q.every(), rem.tolist(), q.fresh.tolist())
            return cast("list[tuple[R, int]]", budget.granted[start:])  # the grants it recorded
        idx: list[int] = []
        ns = []
        starts: list[bool] = []
        for k, (rem, fresh) in enumerate(zip(q.rem.tolist(), q.fresh.tolist())):
            n = min(rem, tokens, chunk)
            if fresh and slots <= 0:
                continue  # no slot for a new one; started ones may still go
            if n <= 0:
                break
            idx.append(k)
            ns.append(n)
            starts.append(fresh)
            tokens -= n
            slots -= fresh
        if not idx:
            return []
        start = len(budget.granted)
        budget.grant_run(q.take(idx), ns, starts)  # KV refusal: no backfilling past it
        return cast("list[tuple[R, int]]", budget.granted[start:])

    def _short(self, decision: AwdDecision, now: float, budget: PrefillBudget) -> list[tuple[R, int]]:
        src = decision.queue.sub(decision.positions) \
            if decision.queue is not None and decision.positions is not None else decision.batch
        plan = self._grant_all(src, budget)
        if plan:
            capped = decision.capped or len(plan) < len(decision.batch)  # slots, tokens or KV
            self.awd.dispatched(len(plan), now, decision.round_start, capped)
            self.last_short_step = now
            self.last_class = "short"
        return plan

    def _short_now(self, short: Sequence[R] | Queue[R], now: float, budget: PrefillBudget) -> list[tuple[R, int]]:
        plan = self._grant_all(short, budget)
        if plan:
            self.last_short_step = now
            self.last_class = "short"
        return plan

    def _long(self, long: Sequence[R], now: float, budget: PrefillBudget) -> list[tuple[R, int]]:
        plan = self.long_policy.schedule(long, now, budget)
        if plan:
            self.last_long_step = now
            self.last_class = "long"
        return plan
