"""Least remaining slack first: Medha §4.1's other comparison policy.

Slack s_i = a_i + d_i - t - w_i(t) (Medha §4.1: arrival, relative deadline, now, remaining work
in seconds from the cost model, ``common.py``); smallest first, ties in arrival order. Since t
is common to all requests the order is that of deadline - remaining work. Waiting is bounded as
in EDF (a waiting request's slack falls with time; a new arrival starts at SLO - work), but
like EDF it favours long requests once they are late, and Medha §4.1 groups it with EDF for
starving long requests before that (slack ignores how much work is at risk).
"""

from __future__ import annotations

from collections.abc import Sequence

from sglang_pd.scheduling.prefill.common import DeadlinePolicy, Queue, stable_order
from sglang_pd.scheduling.types import PrefillBudget, R


class LrsPrefillPolicy(DeadlinePolicy):
    name = "lrs"

    def slack(self, req: R, now: float) -> float:
        return self.deadline(req) - now - self.work_s(req)

    def schedule(self, waiting: Sequence[R], now: float, budget: PrefillBudget) -> list[tuple[R, int]]:
        q = Queue(waiting)
        key = self.deadlines_minus(q, self.works(q))  # slack + now
        return self.walk(q, stable_order(key), budget, now=now)
