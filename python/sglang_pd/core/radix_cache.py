"""Radix prefix cache over KV pages: finished requests leave their KV behind for the next prompt
that starts the same way (multi-turn chat, agents, shared system prompts). Pure Python (the
simulator uses it too, DESIGN.md section 3).

Page-granular: one node per page of ``page_size`` tokens, keyed by those tokens under its
parent, so a prefix hit is always whole pages and a request's own pages start at a page
boundary (no page is ever written by two requests). The tree owns the pages of its nodes:
they are allocated (the allocator counts them in use) but held by no request.

Reference counts: a request that uses a cached prefix locks the path to its deepest node
(every node on the path gets +1), so ``ref(parent) >= ref(child)`` always and a node with
ref 0 has a whole subtree with ref 0: all of it can go, leaves first. ``evictable`` counts the
pages of ref-0 nodes, kept as locks come and go. Eviction frees the least recently used ref-0
leaves back to the allocator (time is a counter ticked by each lock and insert, never a clock).
``version`` changes whenever a match could change (nodes added or evicted): whoever holds a
match it did not lock recomputes it then.

Conservation (the scheduler checks it): allocator in use == pages held by requests alone
(not shared with the tree) + quarantined pages + ``num_pages``.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sglang_pd.core.page_allocator import Allocator


class PageFreer(Protocol):
    def free(self, pages: list[int]) -> None: ...


@dataclass(eq=False)
class Node:
    key: tuple[int, ...]  # the page's tokens (empty at the root)
    page: int  # -1 at the root
    parent: Node | None
    children: dict[tuple[int, ...], Node] = field(default_factory=dict)
    ref: int = 0
    last_use: int = 0
    depth: int = 0  # pages from the root to this node, inclusive
    evicted: bool = False  # gone from the tree (a holder of a stale match sees it here)


@dataclass
class Match:
    """A prefix hit: the cached pages of the longest cached prefix (whole pages), the node to
    lock to keep them, and how many of them are evictable now (locking takes them out)."""

    pages: list[int]
    node: Node
    unlocked: int


class RadixCache:
    def __init__(self, page_size: int, allocator: PageFreer) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        self.allocator = allocator  # pages evicted or offered twice go back here
        self.root = Node((), -1, None)
        self.root.ref = 1  # never evicted
        self.num_pages = 0
        self.evictable = 0
        self.version = 0
        self.num_evicted = 0  # pages evicted, ever (flushes included)
        self._tick = 0

    # ------------------------------------------------------------------ lookups
    def _keys(self, tokens: Sequence[int]) -> list[tuple[int, ...]]:
        ps = self.page_size
        return [tuple(tokens[i: i + ps]) for i in range(0, len(tokens) - ps + 1, ps)]

    def match(self, tokens: Sequence[int], max_pages: int | None = None) -> Match:
        """The longest cached prefix of ``tokens`` in whole pages (at most ``max_pages``).
        Changes nothing (not even recency): a match is a look, a lock is a use."""
        node, pages, unlocked = self.root, [], 0
        ps, n = self.page_size, len(tokens) // self.page_size
        if max_pages is not None:
            n = min(n, max_pages)
        for i in range(n):
            child = node.children.get(tuple(tokens[i * ps: (i + 1) * ps]))
            if child is None:
                break
            node = child
            pages.append(node.page)
            unlocked += node.ref == 0
        return Match(pages, node, unlocked)

    def extend(self, node: Node, keys: Sequence[tuple[int, ...]]) -> Node:
        """A match kept from before, brought up to date: back up from ``node`` past anything
        evicted since (a parent outlives its children), then down along ``keys`` (the page
        keys of the whole lookup, from the root) as far as the tree goes now. Costs the pages
        that changed, not the prompt: the scheduler re-reads every waiting hit this way."""
        while node.evicted:
            node = node.parent  # type: ignore[assignment]
        while node.depth < len(keys):
            child = node.children.get(keys[node.depth])
            if child is None:
                break
            node = child
        return node

    # ------------------------------------------------------------------ locks
    def lock(self, node: Node) -> None:
        """A request uses the path root..node: none of it may be evicted until ``unlock``."""
        self._tick += 1
        while node is not self.root:
            if node.ref == 0:
                self.evictable -= 1
            node.ref += 1
            node.last_use = self._tick
            node = node.parent  # type: ignore[assignment]

    def unlock(self, node: Node) -> None:
        while node is not self.root:
            if node.ref <= 0:
                raise RuntimeError(f"prefix cache: unlocking page {node.page} that is not locked")
            node.ref -= 1
            if node.ref == 0:
                self.evictable += 1
            node = node.parent  # type: ignore[assignment]

    # ------------------------------------------------------------------ insert / evict
    def insert(self, tokens: Sequence[int], pages: Sequence[int]) -> int:
        """Hand the tree the KV of ``tokens`` (whole pages, ``pages[i]`` holding page i). Pages
        the tree does not have yet become its own; a page offered for a prefix it already holds
        under another page is freed (the caller gives up every page it offers). Returns how
        many pages the tree took."""
        keys = self._keys(tokens)
        if len(keys) != len(pages):
            raise ValueError(f"insert: {len(tokens)} tokens are {len(keys)} whole pages, "
                             f"offered {len(pages)}")
        self._tick += 1
        node, taken, dup = self.root, 0, []
        for key, page in zip(keys, pages):
            child = node.children.get(key)
            if child is None:
                child = Node(key, page, node, depth=node.depth + 1)
                node.children[key] = child
                self.num_pages += 1
                self.evictable += 1
                taken += 1
            elif child.page != page:
                dup.append(page)
            child.last_use = self._tick
            node = child
        if dup:
            self.allocator.free(dup)
        if taken:
            self.version += 1
        return taken

    def evict(self, n: int) -> int:
        """Free up to ``n`` pages, least recently used unreferenced leaves first (a parent whose
        last child goes becomes a leaf in its turn). Returns how many were freed."""
        if n <= 0 or self.evictable == 0:
            return 0
        heap = [(x.last_use, id(x), x) for x in self._leaves() if x.ref == 0]
        heapq.heapify(heap)
        freed: list[int] = []
        while heap and len(freed) < n:
            _, _, x = heapq.heappop(heap)
            parent = x.parent
            assert parent is not None
            del parent.children[x.key]
            x.evicted = True
            freed.append(x.page)
            if parent is not self.root and not parent.children and parent.ref == 0:
                heapq.heappush(heap, (parent.last_use, id(parent), parent))
        self.num_pages -= len(freed)
        self.evictable -= len(freed)
        self.num_evicted += len(freed)
        self.allocator.free(freed)
        if freed:
            self.version += 1
        return len(freed)

    def flush(self) -> int:
        """Evict everything not locked (``/flush_cache``); returns the pages freed."""
        return self.evict(self.evictable)

    # ------------------------------------------------------------------ walking / checks
    def _nodes(self) -> list[Node]:
        out, stack = [], list(self.root.children.values())
        while stack:
            x = stack.pop()
            out.append(x)
            stack.extend(x.children.values())
        return out

    def _leaves(self) -> list[Node]:
        return [x for x in self._nodes() if not x.children]

    def pages(self) -> list[int]:
        return [x.page for x in self._nodes()]

    def check(self) -> None:
        """Raise if the counters disagree with the tree, a page is held twice, or a child is
        locked more than its parent."""
        nodes = self._nodes()
        if len(nodes) != self.num_pages:
            raise RuntimeError(f"prefix cache counts {self.num_pages} pages, holds {len(nodes)}")
        pages = [x.page for x in nodes]
        if len(set(pages)) != len(pages):
            raise RuntimeError("prefix cache holds a page twice")
        free = sum(1 for x in nodes if x.ref == 0)
        if free != self.evictable:
            raise RuntimeError(f"prefix cache counts {self.evictable} evictable pages, has {free}")
        for x in nodes:
            if x.ref < 0 or (x.parent is not self.root and x.parent.ref < x.ref):  # type: ignore[union-attr]
                raise RuntimeError(f"prefix cache: page {x.page} locked {x.ref} times, its parent less")


class EvictingAllocator:
    """The scheduler's view of an allocator with a prefix cache beside it: evictable cache pages
    count as free, and ``alloc`` evicts (LRU) what the free list lacks, so eviction is part of
    every admission and decode-page grant without the scheduler asking for it. ``num_used`` is
    what requests hold (locked cache pages included): the load signals' used KV."""

    def __init__(self, allocator: Allocator, cache: RadixCache) -> None:
        self.base = allocator
        self.cache = cache

    @property
    def num_usable(self) -> int:
        return self.base.num_usable

    @property
    def num_free(self) -> int:
        return self.base.num_free + self.cache.evictable

    @property
    def num_used(self) -> int:
        return self.base.num_used - self.cache.evictable

    def alloc(self, n: int) -> list[int]:
        short = n - self.base.num_free
        if short > 0:
            self.cache.evict(short)
        return self.base.alloc(n)

    def free(self, pages: list[int]) -> None:
        self.base.free(pages)

    def check_integrity(self) -> None:
        self.base.check_integrity()
        self.cache.check()
