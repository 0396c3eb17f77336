"""Shortest job first over the tokens still to prefill: Kairos §3.1's comparison policy.

Fewest ``prefill_remaining`` tokens first (so a partly prefilled request near its end finishes
and gives its partial-prefill pages a chance to turn into a running request), ties in arrival
order; the walk and the partial-prefill bound are ``common.walk``'s. No deadlines.

Starvation (documented, as Kairos §3.1 says of SJF): waiting is NOT bounded. Under a steady
stream of short prompts a long one waits for as long as the stream lasts.
"""

from __future__ import annotations

from collections.abc import Sequence

from sglang_pd.scheduling.prefill.common import Queue, stable_order, walk
from sglang_pd.scheduling.types import PrefillBudget, PrefillPolicy, R


class SjfPrefillPolicy(PrefillPolicy):
    name = "sjf"

    def schedule(self, waiting: Sequence[R], now: float, budget: PrefillBudget) -> list[tuple[R, int]]:
        q = Queue(waiting)
        return walk(q, stable_order(q.rem), budget, self.cfg.prefill_max_partial)
