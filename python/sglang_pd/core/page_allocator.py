"""Page allocator: which KV pages are free. Pure Python (the simulator can use it too).

Invariant (checked by ``check_integrity``): free + in use == usable pages, no page twice.
Page 0 is the dummy page and is never handed out.
"""

from __future__ import annotations

from typing import Protocol


class Allocator(Protocol):
    """What the scheduler needs of a page allocator (the engine's, or the simulator's counter)."""

    @property
    def num_usable(self) -> int: ...
    @property
    def num_free(self) -> int: ...
    @property
    def num_used(self) -> int: ...
    def alloc(self, n: int) -> list[int]: ...
    def free(self, pages: list[int]) -> None: ...
    def check_integrity(self) -> None: ...


class OutOfPages(RuntimeError):
    pass


class PageAllocator:
    def __init__(self, num_pages: int) -> None:
        self.num_pages = num_pages
        # A stack whose top is the lowest page of the most recently freed run: recently freed
        # pages are reused first (warm in cache), and a request gets ascending, mostly
        # contiguous pages, which NIXL merges into few descriptors (5x faster transfers
        # than scattered pages, docs/disaggregation.md).
        self._free: list[int] = list(range(num_pages - 1, 0, -1))
        self._used: set[int] = set()

    @property
    def num_usable(self) -> int:
        return self.num_pages - 1

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._used)

    def alloc(self, n: int) -> list[int]:
        if n > len(self._free):
            raise OutOfPages(f"asked for {n} KV pages, {len(self._free)} free")
        if n <= 0:
            return []
        pages = self._free[-n:]
        pages.reverse()
        del self._free[-n:]
        self._used.update(pages)
        return pages

    def free(self, pages: list[int]) -> None:
        for p in pages:
            if p not in self._used:
                raise RuntimeError(f"double free or foreign page {p}")
            self._used.remove(p)
        self._free.extend(reversed(pages))

    def check_integrity(self) -> None:
        free = set(self._free)
        if len(free) != len(self._free):
            raise RuntimeError("a KV page is on the free list twice")
        if free & self._used:
            raise RuntimeError(f"KV pages both free and in use: {sorted(free & self._used)[:8]}")
        if len(free) + len(self._used) != self.num_usable:
            raise RuntimeError(
                f"KV page leak: free {len(free)} + used {len(self._used)} != usable {self.num_usable}"
            )


class CountingAllocator:
    """Counts pages without naming them (every page id is -1): a length-only simulator needs
    how many pages are free, not which. Same interface and conservation check."""

    def __init__(self, num_pages: int) -> None:
        self.num_pages = num_pages
        self._used = 0

    @property
    def num_usable(self) -> int:
        return self.num_pages - 1

    @property
    def num_free(self) -> int:
        return self.num_usable - self._used

    @property
    def num_used(self) -> int:
        return self._used

    def alloc(self, n: int) -> list[int]:
        if n > self.num_free:
            raise OutOfPages(f"asked for {n} KV pages, {self.num_free} free")
        n = max(n, 0)
        self._used += n
        return [-1] * n

    def free(self, pages: list[int]) -> None:
        if len(pages) > self._used:
            raise RuntimeError(f"freeing {len(pages)} pages with only {self._used} in use")
        self._used -= len(pages)

    def check_integrity(self) -> None:
        if not 0 <= self._used <= self.num_usable:
            raise RuntimeError(f"KV page count out of range: {self._used} used of {self.num_usable}")
