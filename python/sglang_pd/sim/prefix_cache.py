"""A prefill instance's prefix cache over Mooncake's ``hash_ids`` (one id per 512-token block;
a block id is a hash of the block and everything before it, so equal ids mean equal prefixes).

The engine's radix tree (``core/radix_cache.py``) with one node per block (its "tokens" are the
block ids, one per page) and a pool of ``capacity_tokens / block_tokens`` block pages: the same
structure and eviction (least recently used leaves first) as the engine, bounded in tokens. A
request hits its longest run of leading blocks held here; the hit sets ``cached_len`` (at most
prompt - 1 tokens: the last token is always computed, as in radix caches). Blocks are inserted
when the request's prefill has finished. The cache is the simulator's own capacity, beside
the instance's KV pool (no request locks its blocks), as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sglang_pd.core.page_allocator import PageAllocator
from sglang_pd.core.radix_cache import RadixCache

BLOCK_TOKENS = 512  # Mooncake's block size


class PrefixCache:
    def __init__(self, capacity_tokens: int, block_tokens: int = BLOCK_TOKENS) -> None:
        if capacity_tokens < 0 or block_tokens < 1:
            raise ValueError(f"prefix cache capacity must be >= 0 and blocks >= 1 token, got "
                             f"{capacity_tokens}, {block_tokens}")
        self.block_tokens = block_tokens
        self.capacity_blocks = capacity_tokens // block_tokens
        self._pages = PageAllocator(self.capacity_blocks + 1)  # one named page per block
        self._tree = RadixCache(1, self._pages)
        self.hit_tokens = 0
        self.lookup_tokens = 0

    def __len__(self) -> int:
        return self._tree.num_pages

    def match(self, hash_ids: Sequence[int], prompt_len: int) -> int:
        """Cached tokens of this prompt (leading blocks held), touching them as recently used."""
        m = self._tree.match(hash_ids)
        if m.pages:  # a use: lock and unlock marks the path recently used
            self._tree.lock(m.node)
            self._tree.unlock(m.node)
        hit = min(len(m.pages) * self.block_tokens, max(prompt_len - 1, 0))
        self.hit_tokens += hit
        self.lookup_tokens += prompt_len
        return hit

    def insert(self, hash_ids: Sequence[int]) -> None:
        """Hold the prompt's blocks, evicting least recently used leaves (never the prompt's own
        cached prefix) for the new ones; as many leading blocks as fit."""
        if not self.capacity_blocks or not hash_ids:
            return
        tree, pages = self._tree, self._pages
        m = tree.match(hash_ids)
        tree.lock(m.node)  # the prefix it extends stays while room is made
        new = len(hash_ids) - len(m.pages)
        if new > pages.num_free:
            tree.evict(new - pages.num_free)
        new = min(new, pages.num_free)
        tree.insert(hash_ids[: len(m.pages) + new], m.pages + pages.alloc(new))
        tree.unlock(m.node)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.lookup_tokens if self.lookup_tokens else 0.0


def replay_hit_rate(warm: Iterable[Sequence[int]], window: Iterable[tuple[Sequence[int], int]],
                    capacity_tokens: int | None = None) -> float:
    """Hit rate of ``window`` ((hash_ids, prompt_len) per request, in arrival order) on a cache
    first filled with the ``warm`` prompts' blocks, each request's blocks inserted before the
    next lookup (an engine admitting in order, its earlier prefills done). ``capacity_tokens``
    None: unbounded, the window's ceiling (its share of tokens in leading blocks some earlier
    prompt sent); else the bounded cache's prediction. Only the window's lookups count."""
    if capacity_tokens is None:
        warm, window = list(warm), list(window)
        blocks = sum(len(h) for h in warm) + sum(len(h) for h, _ in window)
        capacity_tokens = (blocks + 1) * BLOCK_TOKENS
    cache = PrefixCache(capacity_tokens)
    for ids in warm:
        cache.insert(ids)
    for ids, prompt_len in window:
        cache.match(ids, prompt_len)
        cache.insert(ids)
    return cache.hit_rate


def shared_prefixes(warm: Sequence[Sequence[int]], window: Iterable[Sequence[int]],
                    capacity_tokens: int | None = None) -> list[tuple[int, int]]:
    """What of the warm-up a window can hit: ``(warm index, leading blocks)`` per prefix that
    some window request shares with a warm prompt (its longest such run of leading blocks),
    none a prefix of another, in warm-up order. Prefilling only these leaves an unbounded
    cache holding, for the window, what the whole warm-up would: the window's ceiling is the
    same, at a fraction of the warm-up's work (a window deep in the trace needs thousands of
    earlier prompts, most of which it never touches). With ``capacity_tokens``, only what a
    cache of that size still holds after the whole warm-up (least recently used evicted): the
    window then sees the bounded cache's state, not the unbounded one."""
    # a prompt that goes on past block k sent block k whole (a prompt may end inside its last
    # block), so such a sender is preferred; else the first
    first_sender: dict[tuple[int, ...], int] = {}
    for i, ids in enumerate(warm):
        for k in range(1, len(ids) + 1):
            held = first_sender.setdefault(tuple(ids[:k]), i)
            if k < len(ids) and len(warm[held]) == k:
                first_sender[tuple(ids[:k])] = i
    bounded = None
    if capacity_tokens is not None:
        bounded = PrefixCache(capacity_tokens)
        for ids in warm:
            bounded.insert(ids)
    longest: dict[tuple[int, ...], int] = {}
    for ids in window:
        k = 0
        while k < len(ids) and tuple(ids[: k + 1]) in first_sender:
            k += 1
        if bounded is not None:  # the blocks the bounded cache still holds (a lookup, no insert)
            k = min(k, bounded.match(ids, (len(ids) + 1) * BLOCK_TOKENS) // BLOCK_TOKENS)
        if k:
            longest[tuple(ids[:k])] = first_sender[tuple(ids[:k])]
    # drop a prefix another kept prefix covers (longest first, so the covering one is kept)
    kept: list[tuple[int, ...]] = []
    for key in sorted(longest, key=len, reverse=True):
        if not any(other[: len(key)] == key for other in kept):
            kept.append(key)
    return sorted(((longest[key], len(key)) for key in kept), key=lambda t: t[0])
