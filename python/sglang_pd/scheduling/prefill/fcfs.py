"""First-come-first-served prefill with chunking (SGLang's and vLLM's default).

Requests are taken in arrival order; the first one that does not fit stops the step (strict
FCFS: no overtaking), and a prompt longer than the chunk size is split across steps.
"""

from __future__ import annotations

from collections.abc import Sequence

from sglang_pd.scheduling.types import PrefillBudget, PrefillPolicy, R


class FcfsPrefillPolicy(PrefillPolicy):
    name = "fcfs"

    def schedule(self, waiting: Sequence[R], now: float, budget: PrefillBudget) -> list[tuple[R, int]]:
        plan: list[tuple[R, int]] = []
        for req in waiting:
            n = budget.grant(req)
            if n == 0:
                break
            plan.append((req, n))
            if n < req.prefill_remaining:
                break  # this request continues next step; nothing may pass it
        return plan
