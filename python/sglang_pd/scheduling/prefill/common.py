"""What the deadline-aware prefill policies share: deadlines, work in seconds, the budget walk.

Definitions every policy here uses (docs/prefill_scheduling.md):
- Deadline: ``arrival + slo_ttft - deadline margin``. A request without a TTFT SLO (its own or
  the server default, both resolved at entry) follows the one no-SLO rule (``scheduling/slo.py``):
  ``cfg.prefill_no_slo_ttft_ms`` (30 s), so it ranks behind SLO'd work yet ages like any other
  request instead of waiting behind every SLO'd request forever. On prefill servers the margin
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
How the walk applies these fast (array code, no loop over requests) is ``plan.py`` (the walk
itself, and its one-by-one form, ``walk.py``); what it reads: the queue's columns
(``queue_view.py``) and the policy's order (``order.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from sglang_pd.core.step import StepProfile
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.cost_model import PrefillCostModel
from sglang_pd.scheduling.prefill.chunking import TimeBudgetChunker
from sglang_pd.scheduling.prefill.order import Order, stable_order
from sglang_pd.scheduling.prefill.plan import Cut
from sglang_pd.scheduling.prefill.queue_view import Queue
from sglang_pd.scheduling.prefill.threshold import ShortThreshold
from sglang_pd.scheduling.prefill.walk import walk
from sglang_pd.scheduling.slo import no_slo_ttft_s
from sglang_pd.scheduling.types import PrefillBudget, PrefillPolicy, R

__all__ = ["DeadlinePolicy", "Order", "Queue", "fcfs_finish", "fcfs_finish_array", "queue_deadlines",
           "stable_order", "walk"]


class DeadlinePolicy(PrefillPolicy):
    """Base of the deadline-aware prefill policies: a cost model (shared shape, own fit) and the
    definitions above. ``cost_model`` given = fixed from outside (tests, the simulator)."""

    def __init__(self, cfg: PolicyConfig | None = None, cost_model: PrefillCostModel | None = None) -> None:
        super().__init__(cfg)
        self.model = cost_model if cost_model is not None else PrefillCostModel.from_config(self.cfg)
        self.chunk = self.cfg.chunked_prefill_size
        self.no_slo_s = no_slo_ttft_s(self.cfg)  # the no-SLO rule; never the server default
        self.margin_s = self.cfg.prefill_deadline_margin_ms / 1e3
        self.max_partial = self.cfg.prefill_max_partial
        self.short_threshold = ShortThreshold(self.cfg, self.model)  # the chunker's "long"

    def observe(self, step: StepProfile, elapsed_s: float, now: float) -> None:
        self.model.observe(step, elapsed_s, now)

    def class_threshold(self) -> int:
        return self.short_threshold()  # the chunker's "long", fitted under auto

    def use_cost_model(self, model: PrefillCostModel) -> None:
        self.model = model

    def slo_s(self, req: R) -> float:
        return req.slo_ttft_s or self.no_slo_s

    def deadline(self, req: R) -> float:
        return req.arrival + (req.slo_ttft_s or self.no_slo_s) - self.margin_s

    def deadlines(self, q: Queue[R]) -> np.ndarray:
        return queue_deadlines(q, self.no_slo_s, self.margin_s)

    def deadlines_minus(self, q: Queue[R], x: np.ndarray | float) -> np.ndarray:
        """``deadlines(q) - x``, a new array: without a margin one subtraction from the queue's
        ``due`` (due - 0.0 is due exactly), not two (lrs, lars: issue 28)."""
        if not self.margin_s and q.due is not None and q.due_default == self.no_slo_s:
            out: np.ndarray = q.due - x
            return out
        d = self.deadlines(q)
        d -= x
        return d

    def work_s(self, req: R) -> float:
        """Seconds of prefill still to do (alone, chunk by chunk)."""
        return self.model.request_s(req.prefill_remaining, req.prefilled_len, self.chunk)

    def works(self, q: Queue[R]) -> np.ndarray:
        n, quad, ctx = q.work_features(self.chunk)
        return self.model.times_of(n, quad, ctx, q.remf)

    def total_work_s(self, req: R) -> float:
        """Seconds of the whole prefill from its prefix hits on (Medha's w_total)."""
        new = req.prefilled_len + req.prefill_remaining - req.cached_len
        return self.model.request_s(new, req.cached_len, self.chunk)

    def total_works(self, q: Queue[R]) -> np.ndarray:
        return self.model.request_times_array(q.pre + q.rem - q.cached, q.cached, self.chunk,
                                              empty_is_zero=True)

    def rho(self, req: R, now: float) -> float:
        """Medha §4.1's relative slack: (deadline - now - remaining work) / total work."""
        return (self.deadline(req) - now - self.work_s(req)) / max(self.total_work_s(req), 1e-9)

    def walk(self, q: Queue[R], order: Order | Sequence[int] | np.ndarray, budget: PrefillBudget,
             fits: Callable[[R, int], bool | None] | None = None, now: float = 0.0,
             cut: Cut | None = None) -> list[tuple[R, int]]:
        """``walk.walk`` with this policy's partial bound and, with a step-time budget, its
        chunker. ``cut``, the array form of ``fits`` (the same limit), replaces it where it can:
        without a chunker (which sizes chunks request by request)."""
        self.short_threshold.refresh(now)
        chunker = TimeBudgetChunker.for_config(self.cfg, self.model, lambda r: self.rho(r, now),
                                               budget.rider_contexts, self.short_threshold)
        if chunker is not None or cut is None:
            return walk(q, order, budget, self.max_partial, fits, chunker)
        return walk(q, order, budget, self.max_partial, cut=cut)


def queue_deadlines(q: Queue[R], no_slo_s: float, margin_s: float) -> np.ndarray:
    """Every request's TTFT deadline: arrival + (its SLO or ``no_slo_s``) - ``margin_s``, a new
    array (the deadline policies' ``deadlines``; dual queues' urgency reads it too)."""
    if q.due is not None and q.due_default == no_slo_s:  # kept by the waiting queue:
        due: np.ndarray = q.due - margin_s  # the same sum, per request, then this
        return due
    d = q.slos(no_slo_s)  # a new array: summed into in place (a + b == b + a)
    d += q.arrival
    d -= margin_s
    return d


def fcfs_finish_array(arrivals: np.ndarray, works: np.ndarray, now: float, distinct: bool = False,
                      scratch: bool = False) -> np.ndarray:
    """Kairos Alg. 2 for every request at once: the finish time of each under FCFS from ``now``,
    counting all requests that arrived at or before it (``<=``: equal arrivals count each
    other). Every waiting request has arrived, so max(t, arrival) = t and this is a prefix sum
    over the arrival order (``arrivals`` ascending; ``np.cumsum`` adds left to right, as a
    loop would). A run of equal arrivals all finish when its last one does. O(n).
    ``distinct``: the caller knows no two arrivals are equal (``Queue.distinct``): no runs.
    ``scratch``: ``works`` (float64) is the caller's to overwrite: summed in place, no copy."""
    n = len(works)
    # now + w0, then one sum after another, in place (a copy unless the caller's scratch)
    fin = works if scratch and works.dtype == np.float64 else works.astype(np.float64)
    if n:
        fin[0] += now
        fin = np.add.accumulate(fin)  # (a new array: faster than in place, which numpy buffers)
    if n > 1 and not distinct:
        eq = arrivals[1:] == arrivals[:-1]
        if eq.any():  # some equal neighbours
            ends = (~eq).nonzero()[0]  # last index of each run but the last
            starts = np.concatenate(([0], ends + 1))
            run_end = np.concatenate((ends, [n - 1]))
            last = np.repeat(run_end, np.diff(np.concatenate((starts, [n]))))
            fin = fin[last]
    return fin


def fcfs_finish(arrivals: Sequence[float], works: Sequence[float], now: float) -> list[float]:
    """``fcfs_finish_array`` over lists."""
    fin: list[float] = fcfs_finish_array(np.asarray(arrivals, dtype=np.float64),
                                         np.asarray(works, dtype=np.float64), now).tolist()
    return fin
