"""``random``: a uniformly random healthy worker (sglang-router's ``random``); seeded for replay."""

from __future__ import annotations

import random
from collections.abc import Sequence

from .base import RouteRequest, RoutingConfig, RoutingPolicy, WorkerView, eligible_indices


class RandomPolicy(RoutingPolicy):
    name = "random"

    def __init__(self, cfg: RoutingConfig | None = None, seed: int | None = None) -> None:
        super().__init__(cfg, seed)
        self._rng = random.Random(seed)

    def select(self, req: RouteRequest, workers: Sequence[WorkerView], now: float) -> int | None:
        candidates = eligible_indices(workers)
        if not candidates:
            return None
        return candidates[self._rng.randrange(len(candidates))]
