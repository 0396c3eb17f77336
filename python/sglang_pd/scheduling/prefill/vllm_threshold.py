"""``vllm-threshold``: vLLM's ``--long-prefill-token-threshold``, a baseline (issue 34).

What it imitates: vLLM's scheduler takes requests first come first served (those already
running, which include partly prefilled prompts, before waiting ones) and caps the tokens any one
request may prefill in a step at the threshold, so a long prompt advances a slice at a time and
the requests behind it get into the same step instead of waiting for its whole prefill.

Here: partly prefilled requests first, then fresh ones, each group in arrival order; every
grant capped at the threshold (``long_prefill_token_threshold``; 0 takes the short-prefill
threshold, the same "long" boundary the other policies use). A fresh request the budget cannot
take stops the walk (vLLM's waiting queue does not let later requests pass a blocked one).

Deviation, named: vLLM lets any number of prompts be part-way through; our engine holds a
partly prefilled prompt's pages (whole-prompt pages on a PD prefill server), so a fresh request
that would not finish in this step starts only while fewer than ``prefill_max_partial`` are
unfinished (the bound every policy here keeps).

From the Scheduler's queue the same walk runs on its columns (``baselines.py``): the shared
planner over started-then-fresh order, every grant capped at the threshold, strict (no request
passes one the rules stop at).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sglang_pd.scheduling.config import DEFAULT_SHORT_PREFILL_THRESHOLD
from sglang_pd.scheduling.prefill.baselines import (columns_of, count_unfinished, grant_or_stop,
                                                     grant_planned, started)
from sglang_pd.scheduling.prefill.order import Order
from sglang_pd.scheduling.types import PrefillBudget, PrefillPolicy, R


class VllmThresholdPrefillPolicy(PrefillPolicy):
    name = "vllm-threshold"

    @property
    def threshold(self) -> int:
        return (self.cfg.long_prefill_token_threshold or self.cfg.short_prefill_threshold
                or DEFAULT_SHORT_PREFILL_THRESHOLD)

    def schedule(self, waiting: Sequence[R], now: float, budget: PrefillBudget) -> list[tuple[R, int]]:
        cap = self.threshold
        q = columns_of(waiting, budget)
        if q is not None:
            order = np.arange(len(q)) if not q.n_started else \
                np.concatenate(((~q.fresh).nonzero()[0], q.fresh.nonzero()[0]))  # started first
            return grant_planned(q, Order.of(order), budget, self.cfg.prefill_max_partial, max_tokens=cap,
                                 passing=False)
        reqs = list(waiting)
        unfinished = count_unfinished(reqs)
        plan: list[tuple[R, int]] = []
        running = [r for r in reqs if started(r)]
        for req in running:  # vLLM schedules its running requests before waiting ones
            n = grant_or_stop(req, budget, cap)
            if n is None:
                return plan
            if n:
                plan.append((req, n))
        for req in reqs:
            if started(req):
                continue
            room = min(budget.token_budget, budget.chunk_size, cap)
            if req.prefill_remaining > room and unfinished >= self.cfg.prefill_max_partial:
                break  # FCFS: nothing passes a request that may not start now
            n = grant_or_stop(req, budget, cap)
            if not n:
                break  # budget, KV or slots: FCFS stops at the first blocked request
            plan.append((req, n))
            if n < req.prefill_remaining:
                unfinished += 1
        return plan
