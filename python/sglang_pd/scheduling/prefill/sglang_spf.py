"""``sglang-spf``: SGLang's shortest-prefill-first with budget reserved for shorter requests
(sgl-project/sglang PR #40024, merged 2026-09), a baseline (issue 34).

What it does, as the PR describes it: requests ordered by the prefill tokens they still need
(uncached remainder), shortest first; a request already part-way through its prefill (SGLang's
one "chunked request") no longer goes first by right: its continuation only gets the step budget
that shorter waiting requests leave; and there is never a second unfinished chunk.

Here: sort every waiting request (fresh or partly prefilled) by ``prefill_remaining``, ties in
arrival order, and walk that order through the budget. Shorter requests than the continuation
come before it, which is the reserved budget; the continuation then takes what is left (up to a
chunk). A fresh request that would not finish in this step starts only while no other request
is unfinished. Partly prefilled requests left by a previous policy (a runtime switch) all keep
their place in the order.

From the Scheduler's queue the same walk runs on its columns (``baselines.py``): the shared
planner with a partial bound of 1 is exactly the rule above (a fresh request a chunk or the
budget would cut is skipped while one is unfinished; one with nothing left ends the step).

Known behaviour, kept as the PR has it: waiting is unbounded for a long prompt under a steady
stream of shorter ones (shortest-first's starvation), and no deadlines are read.
"""

from __future__ import annotations

from collections.abc import Sequence

from sglang_pd.scheduling.prefill.baselines import (columns_of, count_unfinished, grant_or_stop,
                                                     grant_planned, started)
from sglang_pd.scheduling.prefill.order import stable_order
from sglang_pd.scheduling.types import PrefillBudget, PrefillPolicy, R


class SglangSpfPrefillPolicy(PrefillPolicy):
    name = "sglang-spf"

    def schedule(self, waiting: Sequence[R], now: float, budget: PrefillBudget) -> list[tuple[R, int]]:
        q = columns_of(waiting, budget)
        if q is not None:  # never a second unfinished chunk: the shared walk's bound at 1
            return grant_planned(q, stable_order(q.rem), budget, max_partial=1)
        reqs = list(waiting)
        order = sorted(range(len(reqs)), key=lambda i: (reqs[i].prefill_remaining, i))
        unfinished = count_unfinished(reqs)
        plan: list[tuple[R, int]] = []
        for i in order:
            req = reqs[i]
            fresh = not started(req)
            room = min(budget.token_budget, budget.chunk_size)
            if fresh and unfinished and req.prefill_remaining > room:
                continue  # it would be a second unfinished chunk
            n = grant_or_stop(req, budget)
            if n is None:
                break
            if n == 0:
                continue
            plan.append((req, n))
            if fresh and n < req.prefill_remaining:
                unfinished += 1
        return plan
