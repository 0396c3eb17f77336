"""Dual short/long prefill queues on one instance (PLA-Serve §3.2), short batches by AWD.

``--prefill-queues dual`` (or a ``--prefill-role`` other than both) wraps the ``--prefill-policy``
in this: the scheduler's one arrival-ordered ``waiting`` list is partitioned by a stable key,
the request's new tokens ``prefilled_len + prefill_remaining - cached_len`` (unchanged by its
chunks): key <= threshold is short. The threshold is ``--short-prefill-threshold`` or, with
``auto``, PLA-Serve §2.1's fitted compute/memory boundary L_m, the H-dependent one for
re-prefills (H = ``cached_len``), refreshed every ``THRESHOLD_REFRESH_S`` and falling back to the
default (256) while the cost model cannot place it.
A step is all-short or all-long (mutual exclusion): short steps are AWD batches
(``awd.py``), long steps come from the wrapped policy (fcfs: PLA's one request by fixed
chunks; any registry policy works).

How one instance alternates (PLA-Serve runs each instance in one mode and leaves this open;
ours): SLA-first across the two heads with a bound on the long queue's wait.
- AWD wants to dispatch: the short batch runs, unless the long head is overdue (waited more
  than ``prefill_long_max_wait_ms`` since it arrived or since the last long step ended): then
  one long step runs first. So a long prompt advances at least one chunk per bound, whatever the
  short traffic.
- AWD holds (filling a batch): a long chunk runs meanwhile, sized by the cost model to end by
  the moment AWD wants to dispatch (at least ``min_long_chunk`` tokens, so it always advances).
- Nothing short: the long policy alone; nothing long while AWD holds: the engine sleeps until
  AWD's moment (``budget.hold_until``; a hold never aborts anything).
Roles (``--prefill-role``, switchable at runtime with ``set_role``): ``short`` serves long
requests only when no short one waits, or when the long head is overdue; ``long`` serves short
requests only when no long one waits (as one batch, no AWD wait: a long instance has nothing to
gain from waiting), or when the short head is overdue. No request is ever stranded.
"""

from __future__ import annotations

from typing import Sequence

from sglang_pd.scheduling.config import DEFAULT_SHORT_PREFILL_THRESHOLD, PREFILL_ROLES, PolicyConfig
from sglang_pd.scheduling.cost_model import PrefillCostModel
from sglang_pd.scheduling.prefill.awd import AwdBatcher, AwdDecision
from sglang_pd.scheduling.prefill.chunking import largest_chunk
from sglang_pd.scheduling.step import StepProfile
from sglang_pd.scheduling.types import PrefillBudget, PrefillPolicy, R, SchedReq

THRESHOLD_REFRESH_S = 5.0


class DualQueuePrefillPolicy(PrefillPolicy):
    def __init__(self, cfg: PolicyConfig, long_policy: PrefillPolicy,
                 cost_model: PrefillCostModel | None = None) -> None:
        super().__init__(cfg)
        self.long_policy = long_policy
        shared = getattr(long_policy, "model", None)
        self._own_model = cost_model is None and not isinstance(shared, PrefillCostModel)
        self.model = cost_model or (shared if isinstance(shared, PrefillCostModel)
                                    else PrefillCostModel.from_config(cfg))
        self.awd = AwdBatcher(cfg, self.model)
        self.role = cfg.prefill_role
        self.long_max_wait = cfg.prefill_long_max_wait_ms / 1e3
        self.min_long_chunk = cfg.buckets.max_tokens
        self._fixed_threshold = cfg.short_prefill_threshold
        self._threshold = self._fixed_threshold or DEFAULT_SHORT_PREFILL_THRESHOLD
        self._threshold_at = float("-inf")
        self.last_long_step = float("-inf")
        self.last_short_step = float("-inf")
        self.last_class = ""  # class of the last step this policy planned

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"dual({self.long_policy.name})"

    def set_role(self, role: str) -> None:
        if role not in PREFILL_ROLES:
            raise ValueError(f"prefill role must be one of {PREFILL_ROLES}, got {role!r}")
        self.role = role

    # ------------------------------------------------------------------ classes
    def threshold(self, cached_len: int = 0) -> int:
        """Short/long boundary in new tokens (the auto one for a prompt over ``cached_len``)."""
        if self._fixed_threshold is not None:
            return self._fixed_threshold
        if cached_len > 0:
            lm = self.model.boundary_tokens(cached_len)
            return int(lm) if lm else self._threshold
        return self._threshold

    def refresh_threshold(self, now: float) -> None:
        if self._fixed_threshold is None and now - self._threshold_at >= THRESHOLD_REFRESH_S:
            self._threshold_at = now
            lm = self.model.boundary_tokens(0)
            self._threshold = max(1, int(lm)) if lm else DEFAULT_SHORT_PREFILL_THRESHOLD

    def is_short(self, req: SchedReq) -> bool:
        new = req.prefilled_len + req.prefill_remaining - req.cached_len
        return new <= (self._threshold if req.cached_len <= 0 or self._fixed_threshold is not None
                       else self.threshold(req.cached_len))

    def partition(self, waiting: Sequence[R]) -> tuple[list[R], list[R]]:
        short: list[R] = []
        long: list[R] = []
        for r in waiting:
            (short if self.is_short(r) else long).append(r)
        return short, long

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
        short, long = self.partition(waiting)
        long_overdue = bool(long) and now - max(long[0].arrival, self.last_long_step) > self.long_max_wait
        if self.role == "long":
            short_overdue = bool(short) and now - max(short[0].arrival, self.last_short_step) > self.long_max_wait
            if long and not short_overdue:
                return self._long(long, now, budget)
            return self._short_now(short, now, budget)
        decision = self.awd.decide(short, now, budget.token_budget, self._slots(budget, short))
        if decision.batch and not long_overdue:
            return self._short(decision, now, budget)
        if long and (long_overdue or not short or self.role == "both"):
            if short and not long_overdue and decision.hold_until is not None:
                # fill AWD's wait with a long chunk that ends by its dispatch moment
                fit = largest_chunk(self.model, decision.hold_until - now - self.model.coeffs.launch_s,
                                    long[0].prefilled_len, budget.chunk_size)
                budget.chunk_size = max(min(fit, budget.chunk_size), min(self.min_long_chunk, budget.chunk_size))
            return self._long(long, now, budget)
        if decision.batch:
            return self._short(decision, now, budget)
        if decision.hold_until is not None:
            budget.hold_until(decision.hold_until)
        return []

    @staticmethod
    def _slots(budget: PrefillBudget, short: Sequence[R]) -> int:
        started = sum(1 for r in short if r.prefilled_len > r.cached_len)
        return budget.new_req_slots + started

    def _grant_all(self, reqs: Sequence[R], budget: PrefillBudget) -> list[tuple[R, int]]:
        plan: list[tuple[R, int]] = []
        for r in reqs:
            n = budget.grant(r)
            if n == 0:
                if r.prefilled_len <= r.cached_len and budget.new_req_slots <= 0:
                    continue  # no slot for a new one; started ones may still go
                break  # KV refusal: no backfilling past it
            plan.append((r, n))
        return plan

    def _short(self, decision: AwdDecision, now: float, budget: PrefillBudget) -> list[tuple[R, int]]:
        plan = self._grant_all(decision.batch, budget)
        if plan:
            self.awd.dispatched(len(plan), now, decision.round_start)
            self.last_short_step = now
            self.last_class = "short"
        return plan

    def _short_now(self, short: Sequence[R], now: float, budget: PrefillBudget) -> list[tuple[R, int]]:
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
