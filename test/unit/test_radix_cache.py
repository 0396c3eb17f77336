"""The radix prefix cache (core/radix_cache.py) on its own, over the real PageAllocator.

Property test: generated runs of requests that match a prefix, lock it, take their own pages
(through EvictingAllocator, so allocation evicts), finish (insert + unlock) or give up (unlock +
free), with explicit evictions between. After every operation: pages conserved (free + held by
requests alone + cached == usable), the tree's counters right, every locked page still cached
and not free; after an insert, matching the same tokens returns the inserted pages' prefix.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sglang_pd.core.page_allocator import OutOfPages, PageAllocator
from sglang_pd.core.radix_cache import EvictingAllocator, Node, RadixCache

settings.register_profile("radix", max_examples=60, derandomize=True, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow])


@dataclass(eq=False)
class User:
    tokens: list[int]
    node: Node
    shared: list[int]  # locked cache pages
    own: list[int] = field(default_factory=list)


def conserved(alloc: PageAllocator, cache: RadixCache, users: list[User]) -> None:
    alloc.check_integrity()
    cache.check()
    own = sum(len(u.own) for u in users)
    assert alloc.num_free + own + cache.num_pages == alloc.num_usable
    cached, free = set(cache.pages()), set(alloc._free)
    for u in users:
        assert set(u.shared) <= cached and not set(u.shared) & free, "a locked page was evicted"


def test_match_insert_lock_evict_by_hand() -> None:
    alloc = PageAllocator(9)  # 8 usable
    cache = RadixCache(2, alloc)
    pages = alloc.alloc(3)
    assert cache.insert([1, 2, 3, 4, 5, 6], pages) == 3
    assert cache.match([1, 2, 3, 4, 9, 9, 9]).pages == pages[:2]
    assert cache.match([1, 2, 3, 4, 5, 6], max_pages=1).pages == pages[:1]
    assert cache.match([7, 7]).pages == []
    m = cache.match([1, 2, 3, 4])
    cache.lock(m.node)
    assert cache.evictable == 1  # only the third page
    assert cache.evict(5) == 1 and alloc.num_free == 6
    assert cache.match([1, 2, 3, 4, 5, 6]).pages == pages[:2]
    # a second copy of a cached prefix: the duplicate pages go back to the allocator
    dup = alloc.alloc(2)
    assert cache.insert([1, 2, 3, 4], dup) == 0 and alloc.num_free == 6
    cache.unlock(m.node)
    assert cache.flush() == 2 and alloc.num_free == 8 and cache.num_pages == 0
    with pytest.raises(RuntimeError):
        cache.unlock(m.node)


def test_evicting_allocator_evicts_lru_first() -> None:
    alloc = PageAllocator(5)  # 4 usable
    cache = RadixCache(1, alloc)
    view = EvictingAllocator(alloc, cache)
    a, b = alloc.alloc(2), alloc.alloc(2)
    cache.insert([1, 2], a)
    cache.insert([3, 4], b)
    cache.lock(cache.match([1, 2]).node)  # [1, 2] used again: [3, 4] is the older leaf...
    cache.unlock(cache.match([1, 2]).node)
    assert view.num_free == 4 and view.num_used == 0
    view.alloc(1)  # ...so page of token 4 goes first (a leaf), [1, 2] stays
    assert cache.match([1, 2]).pages == a and cache.match([3, 4]).pages == b[:1]
    with pytest.raises(OutOfPages):
        view.alloc(4)


ops = st.lists(st.tuples(st.sampled_from(["start", "finish", "drop", "evict"]),
                         st.lists(st.integers(0, 2), min_size=1, max_size=12),
                         st.integers(0, 10)), min_size=1, max_size=40)


@settings(settings.get_profile("radix"))
@given(ops, st.sampled_from([1, 2, 4]), st.integers(4, 24))
def test_pages_conserved_and_locked_pages_never_evicted(script: list, page_size: int, pool: int) -> None:
    alloc = PageAllocator(pool + 1)
    cache = RadixCache(page_size, alloc)
    view = EvictingAllocator(alloc, cache)
    users: list[User] = []
    for op, tokens, k in script:
        if op == "start":  # a request: lock its hit, take pages for the rest (evicting)
            m = cache.match(tokens)
            need = -(-len(tokens) // page_size) - len(m.pages)
            if need > view.num_free - m.unlocked:
                continue  # would not fit beside what it locks
            cache.lock(m.node)
            u = User(tokens, m.node, m.pages)
            u.own = view.alloc(need)
            users.append(u)
        elif op in ("finish", "drop") and users:
            u = users.pop(k % len(users))
            if op == "finish":  # its whole pages join the tree; the rest is freed
                full = len(u.tokens) // page_size
                pages = u.shared + u.own
                cache.insert(u.tokens[: full * page_size], pages[:full])
                alloc.free(pages[full:])
                got = cache.match(u.tokens).pages
                assert got == pages[:full] or len(got) == full  # same prefix (maybe other copies)
            else:
                alloc.free(u.own)
            cache.unlock(u.node)
        elif op == "evict":
            before = cache.evictable
            assert cache.evict(k) == min(k, before)
        conserved(alloc, cache, users)
    for u in users:
        alloc.free(u.own)
        cache.unlock(u.node)
    cache.flush()
    assert alloc.num_free == alloc.num_usable and cache.num_pages == 0


def test_extend_follows_evictions_and_insertions() -> None:
    """A kept match brought up to date (what the scheduler's refresh of waiting hits uses)."""
    alloc = PageAllocator(9)
    cache = RadixCache(2, alloc)
    keys = [(1, 2), (3, 4), (5, 6)]
    cache.insert([1, 2, 3, 4], alloc.alloc(2))
    node = cache.extend(cache.root, keys)
    assert node.depth == 2
    cache.insert([1, 2, 3, 4, 5, 6], alloc.alloc(3))  # the first two are duplicates, freed
    node = cache.extend(node, keys)
    assert node.depth == 3 and alloc.num_free == 5
    cache.evict(2)  # the two deepest pages go (leaves first)
    assert cache.extend(node, keys).depth == 1
    assert cache.extend(node, keys) is cache.match([1, 2, 3, 4, 5, 6]).node


def test_simulator_prefix_cache_is_the_radix_tree() -> None:
    """sim/prefix_cache.py over hash_ids: bounded in blocks, leaves evicted first, hits capped
    at prompt - 1 tokens."""
    from sglang_pd.sim.prefix_cache import PrefixCache

    pc = PrefixCache(capacity_tokens=3 * 512)
    pc.insert([1, 2])
    assert pc.match([1, 2, 9], 3 * 512) == 1024 and pc.match([1, 2], 1024) == 1023
    pc.insert([1, 2, 3, 4])  # one block over: the prompt's own prefix stays, the tail is cut
    assert len(pc) == 3 and pc.match([1, 2, 3, 4], 4 * 512) == 3 * 512
    pc.insert([7])  # room is made by evicting the least recently used leaf (block 3), not block 1
    assert pc.match([1, 2, 3], 3 * 512) == 1024 and pc.match([7], 600) == 512
