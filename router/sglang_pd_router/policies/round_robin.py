"""``round_robin``: healthy workers in turn (sglang-router's ``round_robin``).

The cursor walks the list positions, so a worker that turns unhealthy is skipped without
shifting the others' turns.
"""

from __future__ import annotations

from collections.abc import Sequence

from .base import RouteRequest, RoutingConfig, RoutingPolicy, WorkerView


class RoundRobinPolicy(RoutingPolicy):
    name = "round_robin"

    def __init__(self, cfg: RoutingConfig | None = None, seed: int | None = None) -> None:
        super().__init__(cfg, seed)
        self._cursor = 0  # the list position to try first next time

    def select(self, req: RouteRequest, workers: Sequence[WorkerView], now: float) -> int | None:
        n = len(workers)
        for step in range(n):
            i = (self._cursor + step) % n
            if workers[i].healthy:
                self._cursor = i + 1
                return i
        return None
