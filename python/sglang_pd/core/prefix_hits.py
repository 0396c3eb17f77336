"""The scheduler's use of the radix prefix cache (``core/radix_cache.py``). Torch-free.

One story, in the order a request meets it:
- Waiting, holding no pages: its hit is looked up, not locked: ``kv_len = cached_len = hit``
  (whole pages, never the token whose logits sample the first output), so the policies see
  ``prefill_remaining`` net of the hit and ``prefilled_len <= cached_len`` (fresh, not started).
  When the tree changes (``RadixCache.version``) every such request is looked up again before
  the next decision and its queue columns refreshed.
- Admission (``PageAdmission``, core/scheduler.py): the hit is matched again; if an earlier
  grant of the same step evicted part of it the grant is refused (the next step sees the new
  hit). Otherwise the path is locked first, its pages become the request's first pages, and
  only the rest is allocated (evicting LRU leaves when the free list is short: ``alloc`` of
  ``EvictingAllocator``).
- Giving pages up (finish, abort, retraction, a thrown-away partial prefill): the whole pages of
  its computed KV join the tree (duplicates of what the tree holds are freed), the rest is
  freed, the lock is dropped. Quarantined pages (a peer may still write them) are never cached.
Conservation: base allocator in use == pages requests hold alone + quarantine + tree pages.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from sglang_pd.core.radix_cache import Match, Node, RadixCache

if TYPE_CHECKING:
    from sglang_pd.core.page_allocator import Allocator


# Requests here are the engine's (``engine/request.py: Req``): ``pages``, ``kv_len``, a settable
# ``cached_len``, ``prefill_target`` and ``token_ids(start, end)``; the scheduler's protocol has
# no ``token_ids`` (the simulator's length-only requests run without a cache), hence ``Any``.
R = TypeVar("R")


class PrefixHits:
    def __init__(self, cache: RadixCache, allocator: Allocator) -> None:
        self.cache = cache
        self.allocator = allocator  # the base allocator (pages freed here, not evicted)
        self.page_size = cache.page_size
        self.locks: dict[object, Node] = {}  # request -> the deepest node of its locked hit
        self.seen_version = -1
        # per waiting request: its page keys and its last matched node (rematch)
        self._memo: weakref.WeakKeyDictionary[Any, tuple[list[tuple[int, ...]], Node]] = \
            weakref.WeakKeyDictionary()
        self.prompt_tokens = 0  # prefill tokens of admitted requests (the hit rate's base)
        self.cached_tokens = 0  # of them, served from the cache

    # ------------------------------------------------------------------ looking up
    def _match(self, req: Any, max_tokens: int) -> Match:
        n = max_tokens // self.page_size
        return self.cache.match(req.token_ids(0, n * self.page_size), n)

    def rematch(self, req: Any) -> bool:
        """Set a page-less request's hit (``kv_len = cached_len``); True if it changed. The
        page keys and the last match are kept per request (``RadixCache.extend``): a refresh
        after a change of the tree costs what changed, not the prompt."""
        n = max(req.prefill_target - 1, 0) // self.page_size
        memo = self._memo.get(req)
        if memo is None or len(memo[0]) != n:  # new, or its tokens grew (retracted with output)
            ps = self.page_size
            tokens = req.token_ids(0, n * ps)
            memo = ([tuple(tokens[i * ps: (i + 1) * ps]) for i in range(n)], self.cache.root)
        node = self.cache.extend(memo[1], memo[0])
        self._memo[req] = (memo[0], node)
        hit = node.depth * self.page_size
        if hit == req.kv_len and hit == req.cached_len:
            return False
        req.kv_len = req.cached_len = hit
        return True

    def stale(self) -> bool:
        return self.seen_version != self.cache.version

    def refresh(self, waiting: Iterable[R]) -> list[R]:
        """After the tree changed: look every page-less waiting request up again; returns those
        whose hit changed (their queue columns need refreshing)."""
        self.seen_version = self.cache.version
        return [r for r in waiting if not r.pages and self.rematch(r)]  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ admission
    def claim(self, req: Any) -> Match | None:
        """The hit a fresh request is about to lock, matched now; None when it no longer covers
        ``kv_len`` (evicted since the lookup): the grant must be refused."""
        m = self._match(req, req.kv_len)
        return m if len(m.pages) * self.page_size == req.kv_len else None

    def start(self, req: Any, m: Match | None) -> None:
        """A fresh request is admitted: lock its hit (before any allocation of the same grant,
        so that its eviction cannot take these pages) and count it for the hit rate."""
        if m is not None and m.pages:
            self.cache.lock(m.node)
            self.locks[req] = m.node
            req.pages.extend(m.pages)
        self.prompt_tokens += req.prefill_target
        self.cached_tokens += req.kv_len

    def shared(self, req: object) -> int:
        """Leading pages of ``req`` owned by the tree (locked, not its own)."""
        node = self.locks.get(req)
        return node.depth if node is not None else 0

    # ------------------------------------------------------------------ giving pages up
    def release(self, req: Any, cache_kv: bool = True) -> None:
        """``req`` gives up its pages: with ``cache_kv`` the whole pages of its computed KV join
        the tree, the rest go back to the allocator; the lock is dropped."""
        pages, node = req.pages, self.locks.pop(req, None)
        full = min(req.kv_len // self.page_size, len(pages)) if cache_kv else 0
        if full:
            self.cache.insert(req.token_ids(0, full * self.page_size), pages[:full])
        own = pages[max(full, node.depth if node is not None else 0):]
        if own:
            self.allocator.free(own)
        if node is not None:
            self.cache.unlock(node)
        req.pages = []

    def own_pages(self, req: Any) -> list[int]:
        """Take ``req``'s pages from it for quarantine: its own pages are returned, its locked
        hit is given back to the tree (a peer never writes into shared pages)."""
        node = self.locks.pop(req, None)
        own: list[int] = req.pages[node.depth:] if node is not None else req.pages
        if node is not None:
            self.cache.unlock(node)
        req.pages = []
        return own

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
