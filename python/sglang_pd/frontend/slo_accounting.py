"""A request's class as the server counts it, and per-class SLO attainment (the frontend's
``sglang:slo_*`` counters). The class rule itself is ``sglang_pd_router/request_class.py``."""

from __future__ import annotations

import logging

from sglang_pd.frontend.metrics import FrontendMetrics
from sglang_pd.frontend.request_state import ReqState
from sglang_pd.protocol import EngineStats
from sglang_pd_router.request_class import SentClass, classify, resolve_class

logger = logging.getLogger(__name__)


class SloAccounting:
    def __init__(self, metrics: FrontendMetrics, default_threshold: int) -> None:
        self.metrics = metrics
        # the SLO counters' short/long boundary until the engine reports its own (auto)
        self._short_threshold = default_threshold

    def class_threshold(self, stats: EngineStats | None) -> int:
        """The short/long boundary the engine classifies by (its report: fitted under auto)."""
        threshold = stats.short_prefill_threshold if stats is not None else 0
        return threshold if threshold > 0 else self._short_threshold

    def request_class(self, tokens: int, sent: SentClass | None, stats: EngineStats | None) -> str:
        """The class of a prompt of ``tokens`` tokens: the router's (``sent``, from its headers)
        when its count matches ours, else ours; a differing count is logged and counted."""
        cls, mismatch = resolve_class(sent, tokens, self.class_threshold(stats))
        if mismatch and sent is not None:
            self.metrics.class_mismatch.inc()
            logger.debug("router classified %d tokens as %s; ours: %d tokens, %s",
                         sent.tokens, sent.request_class, tokens, cls)
        return cls

    def observe(self, state: ReqState, stats: EngineStats | None) -> None:
        """Per-class SLO attainment counters (client aborts never get here: not the server's
        miss). Class: new prompt tokens against the server's short/long threshold."""
        slo = state.req.slo  # resolved at parse time (server defaults included)
        if slo is None:
            return
        cls = state.req.request_class
        if not cls or state.cached_tokens:  # a prefix hit: the class of the new tokens
            cls = classify(state.prompt_tokens - state.cached_tokens, self.class_threshold(stats))
        ttft = state.first_token_time - state.created if state.first_token_time is not None else None
        if slo.ttft_s:
            self.metrics.observe_slo(cls, "ttft", ttft, slo.ttft_s)
        if slo.tpot_s and state.completion_tokens > 1:
            tpot = None
            if state.first_token_time is not None and state.finished_time is not None:
                tpot = (state.finished_time - state.first_token_time) / (state.completion_tokens - 1)
            self.metrics.observe_slo(cls, "tpot", tpot, slo.tpot_s)
