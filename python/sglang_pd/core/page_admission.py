"""Page admission: the Scheduler's KV allocation for the grants a prefill policy returns
(policies decide and check ``can_admit``; this allocates), with the progress rule's reserve and
the prefix cache's locked hits (core/scheduler.py drives it each step)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sglang_pd.core.page_allocator import Allocator
from sglang_pd.core.prefix_hits import PrefixHits
from sglang_pd.core.progress import remaining_pages
from sglang_pd.core.radix_cache import Match

if TYPE_CHECKING:
    from sglang_pd.core.scheduled_step import SchedulerReq


class PageAdmission:
    """KVAdmission over the page allocator: grants allocate immediately. A fresh prefill (no
    pages yet) is admitted only when its whole prompt fits beside ``reserve``, the pages the
    started prefills still need (progress rule 1, core/progress.py); ``refused`` records
    that some grant was refused this step (rule 2), ``refused_fresh`` which fresh requests were
    (rule 2b's guard). With a prefix cache (``hits``) a fresh
    request's hit (its ``kv_len``) is locked and becomes its first pages; only the rest is
    allocated, and the hit's evictable pages do not count as free for it (core/prefix_hits.py)."""

    def __init__(self, allocator: Allocator, page_size: int, headroom_pages: int,
                 whole_prompt: bool = False, reserve_pages: int = 0, hits: PrefixHits | None = None) -> None:
        self.allocator = allocator
        self.page_size = page_size
        self.headroom = headroom_pages
        # PD prefill: all of a prompt's pages at its first chunk, since the decode side
        # registers a fixed destination page list for the whole prompt
        self.whole_prompt = whole_prompt
        self.reserve = reserve_pages
        self.refused = False
        self.refused_fresh: list[SchedulerReq] = []  # fresh requests refused this step, in order
        self.hits = hits
        self._claim: tuple[object, Match | None] | None = None  # can_admit's match, for admit

    def pages_needed(self, req: SchedulerReq, new_tokens: int) -> int:
        tokens = req.prefill_target if self.whole_prompt else req.kv_len + new_tokens
        held = len(req.pages) or (req.kv_len // self.page_size if self.hits is not None else 0)
        return max(-(-tokens // self.page_size) - held, 0)

    def _check(self, req: SchedulerReq, new_tokens: int) -> tuple[int, Match | None] | None:
        """(pages to allocate, the hit to lock) if the grant fits, else None."""
        m: Match | None = None
        unlocked = 0
        if self.hits is not None and not req.pages and req.kv_len:
            m = self.hits.claim(req)
            if m is None:
                return None  # its hit was evicted this step: refused, re-read next step
            unlocked = m.unlocked
        need = self.pages_needed(req, new_tokens)
        free = self.allocator.num_free - self.headroom - unlocked
        if req.pages or self.whole_prompt:
            ok = need <= free  # a started prefill draws on its own reservation
        else:
            held = len(m.pages) if m is not None else 0
            ok = -(-req.prefill_target // self.page_size) - held + self.reserve <= free
        return (need, m) if ok else None

    def _take(self, req: SchedulerReq, need: int, m: Match | None) -> None:
        """Allocate; keep ``reserve`` right: a fresh one's remainder joins it, a started one's
        chunk comes out of it."""
        fresh = not req.pages
        if fresh and self.hits is not None:
            self.hits.start(req, m)
        req.pages.extend(self.allocator.alloc(need))
        if not self.whole_prompt:
            self.reserve += remaining_pages(req, self.page_size) if fresh else -need

    def can_admit(self, req: SchedulerReq, new_tokens: int) -> bool:
        c = self._check(req, new_tokens)
        if c is None:
            self._refuse(req)
        self._claim = (req, c[1]) if c is not None else None
        return c is not None

    def _refuse(self, req: SchedulerReq) -> None:
        self.refused = True
        if not req.pages:
            self.refused_fresh.append(req)

    def admit(self, req: SchedulerReq, new_tokens: int) -> None:
        m = self._claim[1] if self._claim is not None and self._claim[0] is req else None
        if m is None and self.hits is not None and not req.pages and req.kv_len:
            m = self.hits.claim(req)
        self._claim = None
        self._take(req, self.pages_needed(req, new_tokens), m)

    def admit_run(self, reqs: Sequence[SchedulerReq], new_tokens: Sequence[int]) -> int:
        """``can_admit`` then ``admit`` for each in order up to the first refusal (one call for
        a whole plan: the prefill walk's ``PrefillBudget.grant_run``); how many were admitted."""
        if self.hits is None:
            return self._admit_run_plain(reqs, new_tokens)
        for k, (req, n) in enumerate(zip(reqs, new_tokens)):
            c = self._check(req, n)
            if c is None:
                self._refuse(req)
                return k
            self._take(req, *c)
        return len(reqs)

    def _admit_run_plain(self, reqs: Sequence[SchedulerReq], new_tokens: Sequence[int]) -> int:
        """``admit_run`` without a prefix cache, inlined (it runs for every plan)."""
        alloc, ps, whole = self.allocator, self.page_size, self.whole_prompt
        for k, (req, n) in enumerate(zip(reqs, new_tokens)):
            tokens = req.prefill_target if whole else req.kv_len + n
            need = max(-(-tokens // ps) - len(req.pages), 0)
            free = alloc.num_free - self.headroom
            fresh = not req.pages
            if not (need <= free if not fresh or whole else -(-req.prefill_target // ps) + self.reserve <= free):
                self._refuse(req)
                return k
            req.pages.extend(alloc.alloc(need))
            if not whole:
                self.reserve += remaining_pages(req, ps) if fresh else -need
        return len(reqs)
