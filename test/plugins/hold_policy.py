"""A test-only prefill policy plugin (SGLANG_PD_POLICY_PLUGINS=hold_policy): every request waits
HOLD_S after its arrival before it may prefill, like a batching window that never fills."""

from __future__ import annotations

from collections.abc import Sequence

from sglang_pd.scheduling.prefill.fcfs import FcfsPrefillPolicy
from sglang_pd.scheduling.registry import register_prefill_policy
from sglang_pd.scheduling.types import PrefillBudget, R

HOLD_S = 0.05


class HoldPrefillPolicy(FcfsPrefillPolicy):
    name = "test-hold"

    def schedule(self, waiting: Sequence[R], now: float, budget: PrefillBudget) -> list[tuple[R, int]]:
        ready = [r for r in waiting if now >= r.arrival + HOLD_S]
        if len(ready) < len(waiting):
            budget.hold_until(min(r.arrival + HOLD_S for r in waiting if r not in ready))
        return super().schedule(ready, now, budget)


register_prefill_policy(HoldPrefillPolicy.name, HoldPrefillPolicy)
