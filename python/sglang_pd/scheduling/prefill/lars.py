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

from collections.abc import Sequence

import numpy as np

from sglang_pd.scheduling.prefill.common import DeadlinePolicy, Queue, stable_order
from sglang_pd.scheduling.types import PrefillBudget, R


FEW = 16  # started requests up to which their total work is computed one by one


class LarsPrefillPolicy(DeadlinePolicy):
    name = "lars"

    def rhos(self, q: Queue[R], now: float) -> np.ndarray:
        works = self.works(q)
        rho = self.deadlines_minus(q, now)
        rho -= works
        if not q.n_started:  # all fresh: total work = remaining work (no KV in the pool yet)
            rho /= np.maximum(works, 1e-9)
            return rho
        # the started ones' total work differs: a few, worked out alone (``request_s``, the
        # same numbers as the array formula) after the fresh ones' division, which beats ~10
        # array operations on them
        st = (~q.fresh).nonzero()[0]
        if len(st) > FEW:
            total = works.copy()
            total[st] = self.model.request_times_array(q.pre[st] + q.rem[st] - q.cached[st], q.cached[st],
                                                       self.chunk, empty_is_zero=True)
            rho /= np.maximum(total, 1e-9)
            return rho
        pre, rem, cached, request_s, chunk = q.pre, q.rem, q.cached, self.model.request_s, self.chunk
        slack = [(i, rho.item(i)) for i in st.tolist()]
        rho /= np.maximum(works, 1e-9)
        for i, s in slack:
            h = cached.item(i)
            rho[i] = s / max(request_s(pre.item(i) + rem.item(i) - h, h, chunk), 1e-9)
        return rho

    def schedule(self, waiting: Sequence[R], now: float, budget: PrefillBudget) -> list[tuple[R, int]]:
        q = Queue(waiting)
        return self.walk(q, stable_order(self.rhos(q, now)), budget, now=now)
