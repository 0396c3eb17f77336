"""``length_aware_spill``: length pools where no class pays for another (issue 34 item 0).

``length_aware`` keeps short and long prompts apart, so a short-role instance idles between
bursts of short prompts while the long pool queues (measured: the long class lost 11-22
attainment points against SGLang PD as run). Here a long prompt may spill onto a short-role
instance when that instance is idle (at most ``short_prefill_threshold`` tokens queued, about
one short prompt) and its predicted queue time for this prompt beats the long pool's best.

Why shorts keep their protection: a short-role instance with dual queues serves its short
queue first at every step and a long prompt there only advances one chunk per step while no
short waits, so a short arriving behind a spilled long waits at most one chunk
(``--chunked-prefill-size``), not the long prompt's whole prefill. And only an idle instance
takes one: at most one spilled prompt per short instance at a time (its queued tokens then
exceed the bound). Shorts are routed exactly as ``length_aware`` routes them.
"""

from __future__ import annotations

from collections.abc import Sequence

from .base import RouteRequest, WorkerView, predicted_queue_s, request_class_of
from .length_aware import LengthAwarePolicy


class LengthAwareSpillPolicy(LengthAwarePolicy):
    name = "length_aware_spill"

    def select(self, req: RouteRequest, workers: Sequence[WorkerView], now: float) -> int | None:
        i = super().select(req, workers, now)
        if i is None or workers[i].kind != "prefill" or request_class_of(req, self.cfg) != "long":
            return i
        new_tokens = max(req.prompt_len - req.cached_len, 0)
        idle = [j for j, w in enumerate(workers)
                if w.healthy and w.kind == "prefill" and w.prefill_role == "short"
                and w.queued_prefill_tokens <= self.cfg.short_prefill_threshold]
        if not idle:
            return i
        j = min(idle, key=lambda k: (predicted_queue_s(workers[k], self.cfg, new_tokens), k))
        if predicted_queue_s(workers[j], self.cfg, new_tokens) < predicted_queue_s(workers[i], self.cfg, new_tokens):
            return j
        return i
