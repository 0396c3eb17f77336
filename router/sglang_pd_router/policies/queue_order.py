"""The order in which the router's pending queue is served (``--queue-order``).

Pure: a key per request from its arrival time and TTFT SLO (seconds, the router's clock passed
in); the smallest key is admitted first when a slot frees up.

- ``fifo``: arrival order (what a plain bounded queue does).
- ``edf``: earliest TTFT deadline first (arrival + TTFT SLO), a baseline imitating Dynamo's
  router queue (1.6+), which holds requests while the workers are busy and releases them by
  deadline. Deviation, named: Dynamo gates on its workers' busy thresholds; ours gates on the
  router's own concurrency limit (``--max-concurrent-requests``), so the queue only forms, and
  the order only matters, when that limit is set below the load.

A request without a TTFT SLO ranks by ``no_slo_s`` after its arrival (default 30 s, the servers'
``--prefill-no-slo-ttft-ms``): behind SLO'd work, yet it ages like any other request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class QueueOrder:
    name: str = "fifo"
    no_slo_s: float = 30.0

    def key(self, arrival_s: float, slo_ttft_s: float | None, seq: int) -> tuple[float, int]:
        """Smaller is served first; ``seq`` (arrival count) breaks ties in arrival order."""
        if self.name == "fifo":
            return (arrival_s, seq)
        slo = slo_ttft_s if slo_ttft_s is not None and math.isfinite(slo_ttft_s) and slo_ttft_s > 0 \
            else self.no_slo_s
        return (arrival_s + slo, seq)


QUEUE_ORDERS = ("fifo", "edf")


def create_queue_order(name: str, no_slo_s: float = 30.0) -> QueueOrder:
    if name not in QUEUE_ORDERS:
        raise ValueError(f"unknown queue order {name!r}; choose one of {list(QUEUE_ORDERS)}")
    if not no_slo_s > 0:
        raise ValueError(f"no_slo_s must be > 0, got {no_slo_s}")
    return QueueOrder(name, no_slo_s)
