"""Medha's adaptive chunking (Medha §3.2, App. A.1-A.2): chunk sizes from a step-time budget.

``--prefill-time-budget-ms`` = t_target. A step is packed in the policy's order (``common.walk``)
and each request gets the largest chunk whose predicted time fits what is left:
    t_budget = t_target (1 - rho) - t_current,   rho clamped to [0, rho_max = 0.4]
found by binary search over the fitted ``PrefillCostModel`` (App. A.2 GetChunkSize). So a
long prefill's chunks shrink as its context grows (attention cost rises) instead of making
steps ever longer, and a prefill with slack yields part of the step to others.
As the paper has it: the yield applies to long prefills only (applied to every request the
rule defeats itself: all yield, nothing fills the space); at most one long prefill per batch;
a request that cannot fit is skipped for this step and never re-queued in a loop (Alg. 1's
Requeue would spin on a request that can never fit the remaining budget).
Colocated servers: Medha packs all decodes first; here they are the mixed step's riders
(``--enable-mixed-chunk``): their predicted time starts t_current. On prefill servers there are
no decodes and the budget is a preemption quantum: a long prefill gives the queue a chance
to reorder at least every t_target.

Ours (named): t_current starts at the model's per-step launch time; the first request of a
step always gets at least ``MIN_CHUNK`` tokens (else a budget smaller than one launch would
stall prefill for good); "long" = more new tokens than the server's one short/long boundary
(``threshold.py``: under ``--short-prefill-threshold auto`` the fitted one, as dual queues).
Per-mode default when the flag is unset: colocated with mixed steps and a ``--slo-tpot-ms``
uses that SLO as t_target (Medha derives t_target from the TPOT SLO); otherwise off (fixed
``--chunked-prefill-size`` chunks).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sglang_pd.scheduling.config import DEFAULT_SHORT_PREFILL_THRESHOLD, PolicyConfig
from sglang_pd.scheduling.cost_model import PrefillCostModel
from sglang_pd.scheduling.types import SchedReq

RHO_MAX = 0.4  # Medha App. A.2's example cap on the yielded fraction
MIN_CHUNK = 32  # tokens the first request of a step always gets (ours: progress)


def time_budget_s(cfg: PolicyConfig) -> float | None:
    """t_target in seconds under the per-mode default (module docstring); None = off."""
    if cfg.prefill_time_budget_ms:
        return cfg.prefill_time_budget_ms / 1e3
    if cfg.role == "colocated" and cfg.enable_mixed_chunk and cfg.slo_tpot_ms:
        return cfg.slo_tpot_ms / 1e3
    return None


def largest_chunk(model: PrefillCostModel, seconds: float, context: int, cap: int) -> int:
    """The most new tokens (<= cap) over ``context`` that add at most ``seconds`` to a step
    (``marginal_s``; 0 if not even one token fits). Binary search: time grows with tokens."""
    if cap <= 0 or model.marginal_s(1, context) > seconds:
        return 0
    lo, hi = 1, cap
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if model.marginal_s(mid, context) <= seconds:
            lo = mid
        else:
            hi = mid - 1
    return lo


class TimeBudgetChunker:
    """One step's chunk sizing. ``rho(req)`` is the policy's relative slack (Medha §4.1)."""

    def __init__(self, model: PrefillCostModel, target_s: float, long_threshold: Callable[[int], int],
                 rho: Callable[[SchedReq], float], rider_contexts: Sequence[int] = ()) -> None:
        self.model = model
        self.target = target_s
        self.long_threshold = long_threshold
        self.rho = rho
        self.t_current = model.step_s((1, h) for h in rider_contexts) if rider_contexts else model.coeffs.launch_s
        self.has_long = False
        self.empty = True

    @classmethod
    def for_config(cls, cfg: PolicyConfig, model: PrefillCostModel, rho: Callable[[SchedReq], float],
                   rider_contexts: Sequence[int] = (),
                   threshold: Callable[[int], int] | None = None) -> TimeBudgetChunker | None:
        """``threshold``: the server's one short/long boundary (``threshold.ShortThreshold``:
        cached tokens -> new tokens); None = ``--short-prefill-threshold`` or its default."""
        target = time_budget_s(cfg)
        if target is None:
            return None
        if threshold is None:
            fixed = cfg.short_prefill_threshold or DEFAULT_SHORT_PREFILL_THRESHOLD
            threshold = lambda cached_len: fixed  # noqa: E731
        return cls(model, target, threshold, rho, rider_contexts)

    def is_long(self, req: SchedReq) -> bool:
        new = req.prefilled_len + req.prefill_remaining - req.cached_len
        return new > self.long_threshold(req.cached_len)

    def size(self, req: SchedReq, want: int) -> int:
        """Largest chunk (<= want) fitting the budget left; 0 = skip this request this step."""
        long = self.is_long(req)
        if long and self.has_long:
            return 0  # at most one long prefill per batch
        rho = min(RHO_MAX, max(0.0, self.rho(req))) if long else 0.0
        t_budget = self.target * (1.0 - rho) - self.t_current
        ctx = req.prefilled_len
        n = largest_chunk(self.model, t_budget, ctx, want)
        if n == 0 and self.empty:
            n = min(want, MIN_CHUNK)
        return n

    def add(self, req: SchedReq, n: int) -> None:
        self.t_current += self.model.marginal_s(n, req.prefilled_len)
        self.has_long = self.has_long or self.is_long(req)
        self.empty = False
