"""The one short/long prefill boundary (new tokens): what dual queues classify by and what
Medha's chunker calls "long". One object per server, shared by the policies that need it.

``--short-prefill-threshold N``: N for every request. ``auto``: PLA-Serve §2.1's fitted
compute/memory boundary L_m = (g_w - b) / a of the cost model, refreshed every ``REFRESH_S``
(a stable class while the fit moves), the default (256) while the model cannot place it.
A re-prefill over H cached tokens is short below max(L_m, L_m(H)): PLA-Serve's L_m(H) saturates
at g_r / 2a, a handful of tokens on a CPU fit, which alone sent every re-prefill to the long
queue, the opposite of the paper's point that re-prefills are the short, memory-bound regime.
"""

from __future__ import annotations

from sglang_pd.scheduling.config import DEFAULT_SHORT_PREFILL_THRESHOLD, PolicyConfig
from sglang_pd.scheduling.cost_model import PrefillCostModel

REFRESH_S = 5.0


class ShortThreshold:
    def __init__(self, cfg: PolicyConfig, model: PrefillCostModel) -> None:
        self.fixed = cfg.short_prefill_threshold
        self.model = model
        self.value = self.fixed or DEFAULT_SHORT_PREFILL_THRESHOLD
        self._at = float("-inf")

    def refresh(self, now: float) -> None:
        if self.fixed is None and now - self._at >= REFRESH_S:
            self._at = now
            lm = self.model.boundary_tokens(0)
            self.value = max(1, int(lm)) if lm else DEFAULT_SHORT_PREFILL_THRESHOLD

    def __call__(self, cached_len: int = 0) -> int:
        """New tokens at or below which a prompt over ``cached_len`` cached tokens is short."""
        if self.fixed is not None or cached_len <= 0:
            return self.value
        lm = self.model.boundary_tokens(cached_len)
        return max(self.value, int(lm)) if lm else self.value
