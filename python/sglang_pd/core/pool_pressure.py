"""When the KV pool runs dry: decode slots, partial prefills giving pages back (progress
rule 3, ``core/progress.py``), retraction of the newest running request, and ``unblock`` for a
scheduler that found nothing to run. The memory story is in ``core/scheduler.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

from sglang_pd.core.progress import pick_victim
from sglang_pd.core.scheduled_step import SchedulerReq
from sglang_pd.core.scheduler_queues import SchedulerQueues


class PoolPressure(SchedulerQueues):
    """What gives way when pages run short, and what can never run."""

    def _needs_page(self, req: SchedulerReq) -> bool:
        return req.kv_len >= len(req.pages) * self.page_size

    def _fit_decode(self, batch: Sequence[SchedulerReq]) -> list[SchedulerReq]:
        """Give every request in the batch a slot for its next token. While the pool is short,
        partial prefills give their pages back first (they have produced nothing yet), then
        the newest running requests are retracted."""
        batch = list(batch)
        ps = self.page_size  # _needs_page inlined: this runs for every request every decode step
        needs = [r for r in batch if r.kv_len >= len(r.pages) * ps]
        while len(needs) > self.allocator.num_free:
            partial = self._victim_partial()
            if partial is not None:
                self.preempt_prefill(partial)
                continue
            if len(self.running) <= 1:
                return []  # a lone request holding the whole pool: unblock() decides
            victim = self.running[-1]
            self.retract(victim)
            if victim in batch:
                batch.remove(victim)
            if victim in needs:
                needs.remove(victim)
        for r in needs:
            r.pages.extend(self.allocator.alloc(1))
        return batch

    def _victim_partial(self, bounded: bool = True) -> SchedulerReq | None:
        """Progress rule 3: the partial prefill the policy ranks last, within the bound."""
        partials = [r for r in self.waiting if r.pages]
        if not partials:
            return None
        return pick_victim(partials, self.last_rank, self.prefill_preemptions, self.page_size,
                           bounded)

    def preempt_prefill(self, req: SchedulerReq) -> None:
        """A waiting request gives back the pages of its partial prefill (recomputed later)."""
        self.num_preempted_prefill_tokens += req.kv_len
        self.release(req)
        if self.hits is not None:
            self.hits.rematch(req)  # what it computed may be cached now
        self.waiting.refresh(req)
        self.num_preempted_prefills += 1
        self.prefill_preemptions[req] = self.prefill_preemptions.get(req, 0) + 1

    def retract(self, req: SchedulerReq) -> None:
        self.running.remove(req)
        self.release(req)
        req.num_retractions += 1
        self.num_retractions += 1
        self.add(req)

    def unblock(self, now: float) -> list[tuple[SchedulerReq, str]]:
        """``schedule`` returned nothing although work is queued. Free what blocks progress and
        return the requests that can never run, with the reason (the caller aborts them).
        Nothing is returned while the policy holds or while parked/quarantined pages will
        come back on their own."""
        if self.holding(now):
            return []
        never = [r for r in self.waiting if self._pages_for(r.prefill_target) > self.allocator.num_usable]
        if never:  # larger than the whole pool (grown by its output): no amount of waiting helps
            return [(r, (f"the request needs {self._pages_for(r.prefill_target) * self.page_size} KV "
                         f"tokens; the pool holds only {self.allocator.num_usable * self.page_size}"))
                    for r in never]
        if self.pending_pages:
            return []
        partial = self._victim_partial()
        if partial is not None:  # pages short: the partial the policy ranks last gives way
            self.preempt_prefill(partial)
            return []
        if self.running:
            lone = self.running[0]
            if len(self.running) == 1 and self._needs_page(lone) and self.allocator.num_free == 0:
                return [(lone, "out of KV cache memory: the request's KV fills the whole pool")]
            return []  # the decode policy chose to wait, or decodes will give pages back
        partial = self._victim_partial(bounded=False)
        if partial is not None:  # unreachable while the reservation holds (core/progress.py)
            self.preempt_prefill(partial)
            return []
        if self.waiting:
            return [(self.waiting[0], (f"the prefill policy {self.prefill_policy.name!r} scheduled "
                                       f"nothing with the KV pool free (a policy bug)"))]
        return []

    def _pages_for(self, tokens: int) -> int:
        return -(-tokens // self.page_size)
