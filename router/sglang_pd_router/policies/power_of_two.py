"""``power_of_two``: the less loaded of two random healthy workers (Mitzenmacher's power of two
choices, as sglang-router's ``power_of_two``). Load is ``base.load_key``: predicted queue time
for prefill workers, held requests for decode ones, from in-flight counters and polled
``/get_load``."""

from __future__ import annotations

import random
from collections.abc import Sequence

from .base import (
    RouteRequest,
    RoutingConfig,
    RoutingPolicy,
    WorkerView,
    eligible_indices,
    load_key,
)


class PowerOfTwoPolicy(RoutingPolicy):
    name = "power_of_two"

    def __init__(self, cfg: RoutingConfig | None = None, seed: int | None = None) -> None:
        super().__init__(cfg, seed)
        self._rng = random.Random(seed)

    def select(self, req: RouteRequest, workers: Sequence[WorkerView], now: float) -> int | None:
        candidates = eligible_indices(workers)
        if len(candidates) <= 1:
            return candidates[0] if candidates else None
        a, b = self._rng.sample(candidates, 2)
        # ties go to the first drawn, which is itself random
        return b if load_key(workers[b], self.cfg) < load_key(workers[a], self.cfg) else a
