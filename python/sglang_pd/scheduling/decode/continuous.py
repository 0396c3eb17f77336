"""Plain continuous batching: every running request decodes every step (Orca-style
iteration-level scheduling, the baseline of the continuous-batching survey)."""

from __future__ import annotations

from collections.abc import Sequence

from sglang_pd.scheduling.types import DecodePolicy, R


class ContinuousDecodePolicy(DecodePolicy):
    name = "continuous"

    def schedule(self, running: Sequence[R], now: float) -> list[R]:
        return list(running)
