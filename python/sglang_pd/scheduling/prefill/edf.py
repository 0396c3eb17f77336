"""Earliest deadline first: Medha §4.1's comparison policy ("always schedule the request whose
deadline is soonest").

Deadline = arrival + TTFT SLO (``common.py``: no-SLO default, PD margin), smallest first, ties
in arrival order; the walk and the partial-prefill bound are ``common.walk``'s. Preemptive at
step boundaries: a new request with an earlier deadline takes the next step from a partly
prefilled one. Waiting is bounded: deadlines only grow with arrival time, so a request is
passed only by requests arriving less than the SLO difference after it (at most the no-SLO
deadline, 30 s by default). Its failure mode, which Medha §4.1 names: once a long request is
past its deadline it is earlier than every later arrival's, and EDF runs it to completion while
the short requests behind it miss theirs (convoy).
"""

from __future__ import annotations

from collections.abc import Sequence

from sglang_pd.scheduling.prefill.common import DeadlinePolicy, Queue, stable_order
from sglang_pd.scheduling.types import PrefillBudget, R


class EdfPrefillPolicy(DeadlinePolicy):
    name = "edf"

    def schedule(self, waiting: Sequence[R], now: float, budget: PrefillBudget) -> list[tuple[R, int]]:
        q = Queue(waiting)
        return self.walk(q, stable_order(self.deadlines(q)), budget, now=now)
