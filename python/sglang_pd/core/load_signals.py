"""Per-class load signals for routers and the pool controller (docs/api.md, issue 17).

Torch-free bookkeeping the engine updates as it steps: which prefill class a request is in
(the dual-queue policy's threshold, or the configured one when the server runs one queue), TTFT
SLO deviation per class over recent first tokens, and the share of wall time spent stepping.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from sglang_pd_router.request_class import REQUEST_CLASSES, classify

from sglang_pd.scheduling.types import SchedReq

SLO_SAMPLES_KEPT = 64  # first tokens per class the deviation averages over
BUSY_WINDOW_S = 10.0  # the busy fraction's window


def class_of(req: SchedReq, threshold: int) -> str:
    """The request's class by its new tokens (stable across its chunks), ``request_class.classify``."""
    return classify(req.prefilled_len + req.prefill_remaining - req.cached_len, threshold)


@dataclass
class LoadTracker:
    """SLO deviation per class and the busy fraction (``EngineStats`` fields)."""

    deviation: dict[str, deque[float]] = field(
        default_factory=lambda: {c: deque(maxlen=SLO_SAMPLES_KEPT) for c in REQUEST_CLASSES})
    steps: deque[tuple[float, float]] = field(default_factory=deque)  # (end time, seconds busy)

    def first_token(self, req: SchedReq, now: float, threshold: int, request_class: str = "") -> None:
        """A request got its first token at ``now``: (TTFT - SLO) / SLO into its class: the one
        it came with (the router's, checked by the frontend), else by ``threshold``."""
        slo = req.slo_ttft_s
        if slo:
            self.deviation[request_class or class_of(req, threshold)].append((now - req.arrival - slo) / slo)

    def step(self, end: float, busy_s: float) -> None:
        self.steps.append((end, busy_s))
        while self.steps and self.steps[0][0] < end - BUSY_WINDOW_S:
            self.steps.popleft()

    def busy_fraction(self, now: float) -> float:
        busy = sum(s for t, s in self.steps if t >= now - BUSY_WINDOW_S)
        return min(1.0, busy / BUSY_WINDOW_S)

    def mean_deviation(self, cls: str) -> float:
        d = self.deviation[cls]
        return sum(d) / len(d) if d else 0.0


def class_queues(waiting: Sequence[SchedReq], threshold: int) -> dict[str, int]:
    """Queued requests and prefill tokens per class (the ``_short`` / ``_long`` gauges)."""
    out = {"num_queue_reqs_short": 0, "num_queue_reqs_long": 0,
           "num_queue_prefill_tokens_short": 0, "num_queue_prefill_tokens_long": 0}
    for r in waiting:
        cls = class_of(r, threshold)
        out[f"num_queue_reqs_{cls}"] += 1
        out[f"num_queue_prefill_tokens_{cls}"] += r.prefill_remaining
    return out
