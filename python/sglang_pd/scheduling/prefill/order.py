"""What a prefill policy reads: the waiting queue's numbers (``Queue``) and its order, read lazily
(``Order``). Issue 20 (decision time): both are numpy arrays, so a decision is a few dozen array
operations, not a Python pass over every waiting request."""

from __future__ import annotations

from operator import itemgetter
from typing import Generic
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from sglang_pd.scheduling.cost_model import work_features_array
from sglang_pd.scheduling.types import R
from sglang_pd.scheduling.waiting import WaitingQueue


RADIX_MIN, RADIX_SPAN = 64, 1 << 16  # integer keys sorted as uint16 (radix): how many, range
MIN_PART = 64  # a group is partitioned before its sort only when this many more than needed
_NO_POS = np.empty(0, dtype=np.intp)


class Queue(Generic[R]):
    """One read of the waiting queue: the per-request numbers the policies need, as numpy arrays
    in the queue's order. From a ``WaitingQueue`` (the Scheduler's) they are its columns, kept
    incrementally, so nothing is read from the requests; from any other sequence (tests, a
    policy's own subset) they are read from the requests here, once. Every policy then runs the
    same array code on either, so both give the same decision."""

    __slots__ = ("reqs", "arrival", "slo", "pre", "cached", "rem", "fresh", "n_started", "_objs",
                 "_remf", "_pref", "_features", "_ordered", "_distinct", "_src")
    _ordered: bool | None  # None: not known yet (a sub-queue asks its parent)
    _distinct: bool | None

    def __init__(self, waiting: Sequence[R]) -> None:
        self.reqs = waiting
        if isinstance(waiting, WaitingQueue):
            c = waiting.views()
            self.arrival, self.slo, self.pre, self.cached, self.rem = c.arrival, c.slo, c.prefilled, c.cached, c.remaining
            self._objs: np.ndarray | None = c.objects
            self._remf: np.ndarray | None = c.remaining_f
            self._pref: np.ndarray | None = c.prefilled_f
            self._features: tuple[int | None, tuple[np.ndarray, ...]] | None = (waiting.chunk, (c.chunks, c.quad, c.context_sum))
            # arrivals ascending / and all different (the queue counts its neighbour pairs)
            self._ordered, self._distinct = waiting.ordered, waiting.distinct
        else:
            n = len(waiting)
            self.arrival = np.fromiter((r.arrival for r in waiting), np.float64, n)
            self.slo = np.fromiter((r.slo_ttft_s or np.nan for r in waiting), np.float64, n)
            self.pre = np.fromiter((r.prefilled_len for r in waiting), np.int64, n)
            self.cached = np.fromiter((r.cached_len for r in waiting), np.int64, n)
            self.rem = np.fromiter((r.prefill_remaining for r in waiting), np.int64, n)
            self._objs = self._remf = self._pref = self._features = None
            self._ordered = self._distinct = False  # not known: not assumed
        self._src: tuple[Queue[R], np.ndarray] | None = None  # a sub-queue's parent and positions
        # not started: no KV of its own yet (prefix-cache hits count as context, not as started)
        self.fresh = self.pre <= self.cached
        self.n_started = len(self.fresh) - int(np.count_nonzero(self.fresh))  # holding pages

    def __len__(self) -> int:
        return len(self.pre)

    @property
    def remf(self) -> np.ndarray:
        """``rem`` as float64 (exact), for the cost model's arithmetic."""
        if self._remf is None:
            self._remf = self.rem.astype(np.float64)
        return self._remf

    @property
    def pref(self) -> np.ndarray:
        """``pre`` as float64 (exact)."""
        if self._pref is None:
            self._pref = self.pre.astype(np.float64)
        return self._pref

    def work_features(self, chunk: int) -> tuple[np.ndarray, ...]:
        """``cost_model.work_features`` of every request: the waiting queue's columns when it
        keeps them for this chunk size, else computed here."""
        f = self._features
        if f is None or f[0] != chunk:
            src = self._src
            if src is not None and src[0]._features is not None and src[0]._features[0] == chunk:
                feats = tuple(x[src[1]] for x in src[0]._features[1])  # a sub-queue: its rows
            else:
                feats = work_features_array(self.remf, self.pref, chunk)
            f = self._features = (chunk, feats)
        return f[1]

    def positions(self, reqs: Iterable[R]) -> np.ndarray:
        """Where each of ``reqs`` that is in the queue is (a few: by arrival when the queue is
        in arrival order, each checked by identity), in queue order."""
        objs, reqs_ = self._objs, self.reqs
        found: list[int] = []
        if objs is not None and self.ordered:
            a, n = self.arrival, len(self)
            for r in reqs:
                k = int(a.searchsorted(r.arrival))
                while k < n and objs[k] is not r and a[k] == r.arrival:
                    k += 1
                if k < n and objs[k] is r:
                    found.append(k)
        else:
            want = set(reqs)
            found = [k for k, r in enumerate(reqs_) if r in want]
        return np.array(sorted(found), dtype=np.intp)

    @property
    def ordered(self) -> bool:
        """Arrivals known to be ascending."""
        if self._ordered is None:
            self._inherit_order()
        return self._ordered  # type: ignore[return-value]

    @property
    def distinct(self) -> bool:
        """Arrivals known to be ascending and all different (FCFS finish times need no ties)."""
        if self._distinct is None:
            self._inherit_order()
        return self._distinct  # type: ignore[return-value]

    def _inherit_order(self) -> None:
        """A sub-queue in its parent's order keeps both properties."""
        parent, idx = self._src  # type: ignore[misc]
        asc = len(idx) < 2 or bool((idx[1:] > idx[:-1]).all())
        self._ordered, self._distinct = parent.ordered and asc, parent.distinct and asc

    def earliest_arrival(self) -> float:
        a = self.arrival
        return float(a[0] if self.ordered else a.min())

    def pick(self, idx: np.ndarray) -> list[R]:
        """``[reqs[i] for i in idx]``."""
        if self._objs is not None:
            picked: list[R] = self._objs[idx].tolist()
            return picked
        reqs = self.reqs
        return [reqs[i] for i in idx.tolist()]

    def sub(self, idx: np.ndarray) -> Queue[R]:
        """The requests at ``idx`` (in that order) as a Queue of their own, its
        columns taken from this one (dual queues: one class of the waiting queue)."""
        out = Queue.__new__(Queue)
        out.arrival, out.slo, out.pre = self.arrival[idx], self.slo[idx], self.pre[idx]
        out.cached, out.rem, out.fresh = self.cached[idx], self.rem[idx], self.fresh[idx]
        out.n_started = len(idx) - int(np.count_nonzero(out.fresh))
        out._remf = out._pref = out._features = out._ordered = out._distinct = None
        out._src = (self, idx)  # features and order properties taken from here when asked
        if self._objs is not None:
            out._objs = self._objs[idx]
            out.reqs = out._objs  # type: ignore[assignment]  # read by position only
        else:
            out._objs = None
            out.reqs = self.pick(idx)
        return out

    def take(self, idx: list[int]) -> list[R]:
        """``[reqs[i] for i in idx]`` for a list of positions."""
        if isinstance(self.reqs, np.ndarray):  # a sub-queue's objects
            return self.reqs[idx].tolist()
        if len(idx) == 1:
            return [self.reqs[idx[0]]]
        return list(itemgetter(*idx)(self.reqs))

    def slos(self, default: float) -> np.ndarray:
        """``slo_ttft_s or default`` of every request."""
        return np.where(np.isnan(self.slo), default, self.slo)


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

    __slots__ = ("key", "group", "n", "_head", "_full", "_radix", "_refine", "_refine_from")

    def __init__(self, key: np.ndarray, group: np.ndarray | None = None,
                 refine: Callable[[], None] | None = None, refine_from: int = 0) -> None:
        self.key, self.group, self.n = key, group, len(key)
        self._head: np.ndarray | None = None
        self._full: np.ndarray | None = None
        self._radix: bool | None = None
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
        return o

    def _radix_sorts(self) -> bool:
        """Integer keys of a small range (sjf's token counts) are sorted whole at once: numpy's
        radix sort (``stable_argsort``) costs about what a partial read does."""
        if self._radix is None:
            key = self.key
            self._radix = self.group is None and key.dtype.kind in "iu" and self.n > RADIX_MIN and \
                int(key.max()) - int(key.min()) < RADIX_SPAN
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
                self._full = stable_argsort(self.key)
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
        counts = np.bincount(group).tolist()
        if self._refine is not None and sum(counts[: self._refine_from]) < k:
            self._refined()  # the head reaches the provisional groups
            counts = np.bincount(group).tolist()
        parts: list[np.ndarray] = []
        need = k
        for g, c in enumerate(counts):
            if not c:
                continue
            idx = (group == g).nonzero()[0]
            kg = key[idx]
            if c > need and c >= 2 * need + MIN_PART:
                v = np.partition(kg, need - 1)[need - 1]
                if v != v:
                    return parts, None
                sel = (kg <= v).nonzero()[0]  # all ties of the need-th: the stable order among them
                idx, kg = idx[sel], kg[sel]
            parts.append(idx[np.argsort(kg, kind="stable")][:need])
            need -= len(parts[-1])
            if need <= 0:
                break
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
