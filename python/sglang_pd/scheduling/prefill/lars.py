"""Length-Aware Relative Slack (LARS), Medha §4.1.

rho_i = s_i / w_i_total with s_i = a_i + d_i - t - w_i(t): slack (arrival, relative deadline,
now, remaining work) over the request's whole work, lowest first, ties in arrival order. Work
is in seconds from the fitted ``PrefillCostModel`` (remaining: the tokens still to prefill over
the context already in the pool; total: the whole prompt after its prefix hits), where Medha
App. A.3 reads a precomputed cache of simulated prefill times.

Worked example (Medha §4.1): a 10 s request due in 16 s at t=0 and two 0.5 s requests due in
1 s at t=5: at t=5 rho_long = (16 - 5 - 5)/10 = 0.6 and rho_short = (6 - 5 - 0.5)/0.5 = 1.0;
the short ones wait until their rho falls below the long one's, then preempt it.

Scope: this is §4.1's ordering. Medha's batch packer (App. A.1-A.2: time-budgeted chunks,
long prefills yielding by rho, one long prefill per batch) is the adaptive-chunking part of
issue 20, not this file: here the step is filled by ``common.walk`` (token budget, chunk cap,
partial-prefill bound).

Waiting is bounded: a waiting request's rho falls by 1/w_total per second without limit, while
a new arrival's rho starts at (SLO - w)/w >= -1, so any request eventually ranks first.
"""

from __future__ import annotations

from typing import Sequence

from sglang_pd.scheduling.prefill.common import DeadlinePolicy, Queue
from sglang_pd.scheduling.types import PrefillBudget, R


class LarsPrefillPolicy(DeadlinePolicy):
    name = "lars"

    def rhos(self, q: Queue, now: float) -> list[float]:
        works = self.works(q)
        out = []
        for i, (d, w) in enumerate(zip(self.deadlines(q), works)):
            # a fresh request's total work is its remaining work (no KV in the pool yet)
            total = w if q.fresh[i] else self.total_work_s(q.reqs[i])
            out.append((d - now - w) / max(total, 1e-9))
        return out

    def schedule(self, waiting: Sequence[R], now: float, budget: PrefillBudget) -> list[tuple[R, int]]:
        q = Queue(waiting)
        return self.walk(q, sorted(range(len(q)), key=self.rhos(q, now).__getitem__), budget, now=now)
