"""A prefill policy's order over the waiting queue (``Queue``, queue_view.py), read lazily
(``Order``). Issue 20 (decision time): a numpy array, sorted only as far as the walk reads it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


RADIX_MIN, RADIX_SPAN = 64, 1 << 16  # integer keys sorted as uint16 (radix): how many, range
MIN_PART = 64  # a group is partitioned before its sort only when this many more than needed
_NO_POS = np.empty(0, dtype=np.intp)


class Order:
    """A policy's order over a ``Queue``: positions by ``key`` ascending (by ``group``, then
    ``key``, when groups are given: small non-negative ints), ties in queue (arrival) order, as a
    stable sort gives (``sorted(range(n), key=...)``), read front to back by the walk.

    Speed (issue 20): the walk usually takes the first few dozen requests, so the order is not
    sorted whole unless needed. ``head(k)`` gives the first k: one partition finds the k-th
    key, and only the requests at or below it are sorted (all of its ties among them, so the
    tie-break is the stable one); ``after(p, mask)`` gives the requests past position p that a
    condition keeps, in order, sorting only those; ``rest(p, mask)`` gives them unsorted, for
    ``first_of`` to pick the first of. A NaN at the k-th key, or k at least n / 2, sorts the
    whole queue. ``Order.of(perm)`` wraps an order computed elsewhere."""

    __slots__ = ("key", "group", "n", "_head", "_full", "_radix", "_lo", "_refine", "_refine_from")

    def __init__(self, key: np.ndarray, group: np.ndarray | None = None,
                 refine: Callable[[], None] | None = None, refine_from: int = 0) -> None:
        self.key, self.group, self.n = key, group, len(key)
        self._head: np.ndarray | None = None
        self._full: np.ndarray | None = None
        self._radix: bool | None = None
        self._lo = 0  # what the radix sort subtracts from the keys (``_radix_sorts``)
        # groups >= refine_from are provisional: ``refine()`` rewrites their groups and keys in
        # place (still >= refine_from), called only once the order is read past the groups below
        self._refine, self._refine_from = refine, refine_from

    def _refined(self) -> None:
        if self._refine is not None:
            refine, self._refine = self._refine, None
            refine()

    @classmethod
    def of(cls, perm: Sequence[int] | np.ndarray) -> Order:
        perm = np.asarray(perm, dtype=np.intp)
        o = cls.__new__(cls)
        o.key = o.group = o._refine = None  # type: ignore[assignment]  # no keys: ``rest`` checks
        o._refine_from = 0
        o.n = len(perm)
        o._head = o._full = perm
        o._radix = False
        o._lo = 0
        return o

    def _radix_sorts(self) -> bool:
        """Integer keys of a small range (sjf's token counts) are sorted whole at once: numpy's
        radix sort (``stable_argsort``) costs about what a partial read does."""
        if self._radix is None:
            key = self.key
            self._radix = False
            if self.group is None and key.dtype.kind in "iu" and self.n > RADIX_MIN:
                lo, hi = int(key.min()), int(key.max())
                if hi - lo < RADIX_SPAN:
                    self._radix = True
                    # keys already in uint16's range are cast as they are (the same order)
                    self._lo = 0 if lo >= 0 and hi < RADIX_SPAN else lo
        return self._radix

    def _sorted(self, idx: np.ndarray) -> np.ndarray:
        """``idx`` (ascending) in the order."""
        if self.group is None:
            return idx[np.argsort(self.key[idx], kind="stable")]
        by_key = idx[np.argsort(self.key[idx], kind="stable")]  # then stably by group
        return by_key[np.argsort(self.group[by_key], kind="stable")]

    def full(self) -> np.ndarray:
        self._refined()
        if self._full is None:
            if self.group is None:
                if self._radix_sorts():  # (its min and max, read once: ``stable_argsort``'s test)
                    key, lo = self.key, self._lo
                    self._full = np.argsort((key - lo if lo else key).astype(np.uint16), kind="stable")
                else:
                    self._full = np.argsort(self.key, kind="stable")
            else:  # by key, then a stable sort by group keeps each group in key order
                by_key = stable_argsort(self.key)
                self._full = by_key[np.argsort(self.group[by_key].astype(np.int8), kind="stable")]
            self._head = self._full
        return self._full

    def head(self, k: int) -> np.ndarray:
        """The first ``k`` positions of the order."""
        h = self._head
        if h is not None and (len(h) >= k or h is self._full):
            return h[:k]
        if 2 * k >= self.n or self._radix_sorts():
            return self.full()[:k]
        key = self.key
        if self.group is None:
            v = np.partition(key, k - 1)[k - 1]
            if v != v:  # NaN: fewer than k numbers
                return self.full()[:k]
            cand = (key <= v).nonzero()[0]
        else:  # group by group, lowest first: each one's own positions, sorted by key
            parts, need = self._group_heads(k)
            if need is None:
                return self.full()[:k]
            self._head = h = parts[0] if len(parts) == 1 else np.concatenate(parts)
            return h
        h = self._head = self._sorted(cand)[:k]
        return h

    def _group_heads(self, k: int) -> tuple[list[np.ndarray], int | None]:
        """The first ``k`` of a grouped order, one sorted piece per group (a group's head alone
        is partitioned first when it is much larger than what is left to take); ``None`` for a
        NaN at the cut (sort whole instead)."""
        group, key = self.group, self.key
        assert group is not None  # (a grouped order)
        parts: list[np.ndarray] = []
        need = k
        # group by group from the lowest (a compare and a ``nonzero`` each: cheaper than counting
        # them all first, or a stable sort of the small ints, at 1,000: issue 28), refined
        # before the first provisional group is read (``refine`` rewrites only those)
        top, g = int(group.max()), -1
        while need > 0 and g < top:
            g += 1
            if g == self._refine_from and self._refine is not None:
                self._refined()
                top = int(group.max())  # (refined groups stay >= refine_from, may be higher)
            idx = (group == g).nonzero()[0]
            c = len(idx)
            if c <= 1:  # none, or one (the rare groups often hold one): nothing to sort
                if c:
                    parts.append(idx)
                    need -= 1
                continue
            kg = key[idx]
            if c > need and c >= 2 * need + MIN_PART:
                v = np.partition(kg, need - 1)[need - 1]
                if v != v:
                    return parts, None
                sel = (kg <= v).nonzero()[0]  # all ties of the need-th: the stable order among them
                idx, kg = idx[sel], kg[sel]
            parts.append(idx[np.argsort(kg, kind="stable")][:need])
            need -= len(parts[-1])
        return parts, need

    def after(self, p: int, mask: np.ndarray) -> np.ndarray:
        """The positions past the first ``p`` of the order (``p`` <= what ``head`` gave) where
        ``mask`` (over the queue) holds, in order."""
        self._refined()
        h = self._head
        assert h is not None  # (``head`` came first)
        rest: np.ndarray = h[p:]
        rest = rest[mask[rest]]
        if h is self._full:
            return rest
        seen = np.zeros(self.n, dtype=bool)
        seen[h] = True
        out: np.ndarray = np.concatenate((rest, self._sorted((mask & ~seen).nonzero()[0])))
        return out

    def known(self, p: int) -> np.ndarray:
        """The positions past the first ``p`` of the order that are already sorted (what
        ``head`` last gave, or all of them once sorted whole), in order."""
        h = self._head
        return _NO_POS if h is None else h[p:]

    def rest(self, p: int, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """The positions past the first ``p`` of the order (``p`` <= what ``head`` gave) where
        ``mask`` holds, in queue order, not sorted, with their key and group: ``first_of``
        finds the first of any subset of them in the order (the walk's tail takes a few of
        many). ``mask`` is a fresh array of the caller's: it is changed here."""
        self._refined()
        h = self._head
        assert h is not None  # (``head`` came first)
        if self.key is None:  # an order given as positions: the rank in it is the key
            ranks = np.zeros(self.n, dtype=bool)
            ranks[p:] = mask[h[p:]]
            ranks = ranks.nonzero()[0]
            return h[ranks], ranks.astype(np.float64), None
        mask[h[:p]] = False
        idx = mask.nonzero()[0]
        return idx, self.key[idx], None if self.group is None else self.group[idx]


def stable_argsort(key: np.ndarray) -> np.ndarray:
    """``np.argsort(key, kind="stable")``; integer keys spanning fewer than 2**16 values (token
    counts: sjf) as uint16, which numpy sorts by radix, several times faster."""
    if key.dtype.kind in "iu" and len(key) > RADIX_MIN:
        lo = key.min()
        if key.max() - lo < RADIX_SPAN:
            return np.argsort((key - lo).astype(np.uint16), kind="stable")
    return np.argsort(key, kind="stable")


def first_of(key: np.ndarray, group: np.ndarray | None) -> int:
    """Where the first in the order is among requests in queue order with these keys and groups
    (``Order.rest``): lowest group, then lowest key, NaN last (as the sort); ``argmin`` gives
    the first of equal keys, the one earlier in the queue, as the stable sort does."""
    if group is not None:
        sel = (group == group.min()).nonzero()[0]
        return int(sel[first_of(key[sel], None)])
    j = int(key.argmin())
    if key[j] != key[j]:  # argmin stops at the first NaN: look among the numbers
        num = (key == key).nonzero()[0]
        if len(num):
            j = int(num[key[num].argmin()])
    return j


def stable_order(key: np.ndarray, descending: bool = False) -> Order:
    """Indices by ``key`` (ascending, or descending), ties in queue (arrival) order: what
    ``sorted(range(n), key=key.__getitem__, reverse=descending)`` gives (Python's sort is stable
    both ways), read lazily (``Order``)."""
    return Order(-key if descending else key)
