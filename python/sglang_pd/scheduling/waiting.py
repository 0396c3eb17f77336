"""The waiting queue with its numbers kept as columns (issue 20: decision time).

A prefill decision ranks every waiting request, and reading ``SchedReq`` properties request by
request was most of its cost (hundreds of microseconds at 1,000 waiting). ``WaitingQueue`` IS
the arrival-ordered list of requests (a ``list`` subclass: every caller that reads a list,
compares it with one or concatenates it keeps working) and also holds, position for position,
numpy columns of the numbers the policies read: arrival, TTFT SLO (NaN when the request has
none, i.e. ``slo_ttft_s`` is falsy: the policies fill their default), arrival + SLO with the
no-SLO default filled in when the queue is given it (``due``: a deadline in one subtraction,
issue 28) and the SLO with that default filled in (``slo_or``: kairos reads it as is), prefilled_len,
cached_len, prefill_remaining, and each request's work features for the configured chunk size
(``cost_model.work_features``: chunks, r(r + 2H), context summed over the chunks), from which a
work estimate is four products and three sums. It also counts neighbour pairs with equal and with
decreasing arrivals (``ordered``, ``distinct``), kept as requests come and go, so FCFS finish
times can skip their tie pass. ``scheduling/prefill/queue_view.py: Queue`` reads these columns
instead of the requests.

Who keeps them right: the owner of the queue (``core/scheduler.py: Scheduler``) adds and
removes requests only through the list methods below, which update the columns of the requests
concerned, and calls ``refresh(req)`` after it changes a waiting request's numbers (a chunk
extended, a partial prefill released). A request's numbers must not change behind its back while
it waits; ``check()`` verifies the columns against the requests (tests, integrity checks).
Mutations that would reorder the list wholesale (sort, reverse, slice assignment) raise.
Slices and copies are plain lists (no columns): policies fed those read the requests.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple
from collections.abc import Iterable, Sequence

import numpy as np

from sglang_pd.scheduling.cost_model import work_features
from sglang_pd.scheduling.types import SchedReq

# float columns, then int columns (one 2-D array each: an insert or removal shifts one block);
# remaining and prefilled are also kept as floats (exact: whole numbers below 2**53), which the
# cost model's array arithmetic reads without a cast per operation
ARRIVAL, SLO, DUE, SLO_OR, REMAINING_F, PREFILLED_F, CHUNKS, QUAD, CONTEXT_SUM = range(9)
PREFILLED, CACHED, REMAINING = 0, 1, 2
_NF = 9
_MIN_CAP = 64


class Columns(NamedTuple):
    """The queue's columns, position for position (``WaitingQueue.views``)."""

    arrival: np.ndarray
    slo: np.ndarray  # TTFT SLO in seconds, NaN where the request has none
    due: np.ndarray  # arrival + (SLO or the queue's ``no_slo_s``): NaN without ``no_slo_s``
    slo_or: np.ndarray  # SLO or the queue's ``no_slo_s``: NaN without ``no_slo_s``
    remaining_f: np.ndarray  # ``remaining`` as float64 (exact)
    prefilled_f: np.ndarray  # ``prefilled`` as float64 (exact)
    chunks: np.ndarray  # ``cost_model.work_features`` for chunks of the queue's ``chunk``:
    quad: np.ndarray  # chunks, r(r + 2H), context summed over the chunks (float64)
    context_sum: np.ndarray
    prefilled: np.ndarray
    cached: np.ndarray
    remaining: np.ndarray
    objects: np.ndarray  # the requests (``objects[idx].tolist()`` picks many at C speed)


def _floats(r: SchedReq, chunk: int | None, no_slo_s: float | None) -> tuple[float, ...]:
    # the deadline policies' ``slos + arrival`` per request (the same IEEE sum: a + b == b + a)
    slo_or = math.nan if no_slo_s is None else (r.slo_ttft_s or no_slo_s)
    return (r.arrival, (r.slo_ttft_s or math.nan), slo_or + r.arrival, slo_or, float(r.prefill_remaining),
            float(r.prefilled_len),
            *work_features(r.prefill_remaining, r.prefilled_len, chunk))


def _ints(r: SchedReq) -> tuple[int, int, int]:
    return r.prefilled_len, r.cached_len, r.prefill_remaining


class WaitingQueue(list[Any]):
    """Requests in arrival order, with numpy columns of their numbers (module docstring)."""

    def __init__(self, reqs: Iterable[SchedReq] = (), chunk: int | None = None,
                 no_slo_s: float | None = None) -> None:
        super().__init__(reqs)
        self.chunk = chunk  # the chunk size of the work features (``work_features``)
        self.no_slo_s = no_slo_s  # the TTFT SLO of a request without one, for ``due`` (None: no ``due``)
        self._views: Columns | None = None
        n = super().__len__()
        cap = max(_MIN_CAP, 2 * n)
        self._f = np.empty((_NF, cap), dtype=np.float64)
        self._i = np.empty((3, cap), dtype=np.int64)
        self._o = np.empty(cap, dtype=object)
        for k, r in enumerate(self):
            self._f[:, k] = _floats(r, chunk, no_slo_s)
            self._i[:, k] = _ints(r)
            self._o[k] = r
        self._count_pairs()
        self._count_rem()

    # ------------------------------------------------------------------ arrival order
    def _count_rem(self) -> None:
        """Count the requests with nothing left to prefill and the tokens left (from scratch)."""
        rem = self._i[REMAINING, : len(self)]
        self._empty = int(np.count_nonzero(rem <= 0))
        self._rem_total: int | None = int(rem.sum())

    def _count_pairs(self) -> None:
        """Count the neighbours with equal arrivals and those out of order (from scratch)."""
        a = self._f[ARRIVAL, : len(self)]
        self._ties = int(np.count_nonzero(a[1:] == a[:-1]))
        self._inversions = int(np.count_nonzero(a[1:] < a[:-1]))

    def _pair(self, left: int, right: int, sign: int) -> None:
        """Count the neighbour pair at positions (left, right) in (sign 1) or out (-1)."""
        x, y = self._f[ARRIVAL, left], self._f[ARRIVAL, right]
        if x == y:
            self._ties += sign
        elif x > y:
            self._inversions += sign

    @property
    def n_empty(self) -> int:
        """Requests with nothing left to prefill (``prefill_remaining <= 0``): rare, and while
        there are none a decision skips the tests for them (issue 28)."""
        return self._empty

    @property
    def remaining_total(self) -> int:
        """``prefill_remaining`` summed over the queue (the plan's first block is sized by it);
        a subset sums it when first asked."""
        if self._rem_total is None:
            self._rem_total = int(self._i[REMAINING, : len(self)].sum())
        return self._rem_total

    @property
    def ordered(self) -> bool:
        """Arrivals ascending (as ``add`` keeps them; ``insert`` at any place may not)."""
        return self._inversions == 0

    @property
    def distinct(self) -> bool:
        """Arrivals ascending and no two equal: FCFS finish times need no tie handling."""
        return self._inversions == 0 and self._ties == 0

    # ------------------------------------------------------------------ columns (views)
    def views(self) -> Columns:
        """Every column at once, as ``Queue`` reads them. Views of the storage, made again only
        when the length or the storage changed (a decision reads them all; making eleven views
        costs microseconds)."""
        n, f = len(self), self._f
        v = self._views
        if v is None or len(v.arrival) != n or v.arrival.base is not f:
            i = self._i
            v = self._views = Columns(f[ARRIVAL, :n], f[SLO, :n], f[DUE, :n], f[SLO_OR, :n], f[REMAINING_F, :n],
                                      f[PREFILLED_F, :n], f[CHUNKS, :n], f[QUAD, :n], f[CONTEXT_SUM, :n], i[PREFILLED, :n],
                                      i[CACHED, :n], i[REMAINING, :n], self._o[:n])
        return v

    arrival = property(lambda self: self.views().arrival)
    slo = property(lambda self: self.views().slo)
    prefilled = property(lambda self: self.views().prefilled)
    cached = property(lambda self: self.views().cached)
    remaining = property(lambda self: self.views().remaining)

    # ------------------------------------------------------------------ finding
    def position(self, req: SchedReq) -> int:
        """Index of ``req`` (by identity). O(log n) through the arrival column while the queue is
        in arrival order (as the Scheduler keeps it); a linear scan otherwise."""
        n = len(self)
        a = req.arrival
        arr = self._f[ARRIVAL, :n]
        k = int(np.searchsorted(arr, a, side="left")) if n else 0
        while k < n and arr[k] == a:
            if list.__getitem__(self, k) is req:
                return k
            k += 1
        for k, r in enumerate(self):  # not in arrival order (built by hand)
            if r is req:
                return k
        raise ValueError(f"request {getattr(req, 'rid', req)!r} is not waiting")

    def __contains__(self, req: object) -> bool:
        try:
            self.position(req)  # type: ignore[arg-type]
        except (ValueError, AttributeError):
            return list.__contains__(self, req)
        return True

    # ------------------------------------------------------------------ keeping the columns
    def _grow(self, need: int) -> None:
        cap = self._f.shape[1]
        if need <= cap:
            return
        cap = max(need, 2 * cap)
        n = len(self)
        f, i, o = np.empty((_NF, cap), np.float64), np.empty((3, cap), np.int64), np.empty(cap, object)
        f[:, :n], i[:, :n], o[:n] = self._f[:, :n], self._i[:, :n], self._o[:n]
        self._f, self._i, self._o = f, i, o

    def insert(self, index: int, req: SchedReq) -> None:  # type: ignore[override]
        n = len(self)
        k = min(max(index + n if index < 0 else index, 0), n)
        self._grow(n + 1)
        if 0 < k < n:
            self._pair(k - 1, k, -1)  # split by the new one
        if k < n:  # numpy copies overlapping slices correctly
            self._f[:, k + 1: n + 1] = self._f[:, k:n]
            self._i[:, k + 1: n + 1] = self._i[:, k:n]
            self._o[k + 1: n + 1] = self._o[k:n]
        self._f[:, k] = _floats(req, self.chunk, self.no_slo_s)
        self._i[:, k] = _ints(req)
        self._o[k] = req
        self._empty += req.prefill_remaining <= 0
        if self._rem_total is not None:
            self._rem_total += req.prefill_remaining
        list.insert(self, k, req)
        if k > 0:
            self._pair(k - 1, k, 1)
        if k < n:
            self._pair(k, k + 1, 1)

    def append(self, req: SchedReq) -> None:
        self.insert(len(self), req)

    def extend(self, reqs: Iterable[SchedReq]) -> None:
        for r in reqs:
            self.insert(len(self), r)

    def __iadd__(self, reqs: Iterable[SchedReq]) -> WaitingQueue:  # type: ignore[override,misc]
        self.extend(reqs)
        return self

    def add(self, req: SchedReq) -> int:
        """Insert in arrival order, after requests that arrived at the same time (as
        ``bisect.insort`` keyed on arrival); return the position."""
        n = len(self)
        k = int(np.searchsorted(self._f[ARRIVAL, :n], req.arrival, side="right")) if n else 0
        self.insert(k, req)
        return k

    def pop(self, index: int = -1) -> SchedReq:  # type: ignore[override]
        n = len(self)
        k = index + n if index < 0 else index
        if not 0 <= k < n:
            raise IndexError("pop index out of range")
        if k > 0:
            self._pair(k - 1, k, -1)
        if k < n - 1:
            self._pair(k, k + 1, -1)
        self._empty -= bool(self._i[REMAINING, k] <= 0)
        if self._rem_total is not None:
            self._rem_total -= int(self._i[REMAINING, k])
        self._f[:, k: n - 1] = self._f[:, k + 1: n]
        self._i[:, k: n - 1] = self._i[:, k + 1: n]
        self._o[k: n - 1] = self._o[k + 1: n]
        self._o[n - 1] = None
        if 0 < k < n - 1:
            self._pair(k - 1, k, 1)  # the neighbours it separated
        req: SchedReq = list.pop(self, k)
        return req

    def remove(self, req: SchedReq) -> None:
        self.pop(self.position(req))

    def __delitem__(self, index: int) -> None:  # type: ignore[override]
        if not isinstance(index, int):
            raise TypeError("WaitingQueue: delete one request at a time")
        self.pop(index)

    def clear(self) -> None:
        self._o[: len(self)] = None
        list.clear(self)
        self._ties = self._inversions = self._empty = self._rem_total = 0

    def __setitem__(self, index, value) -> None:  # type: ignore[no-untyped-def]
        raise TypeError("WaitingQueue keeps arrival order: use add/insert/remove")

    def sort(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        raise TypeError("WaitingQueue keeps arrival order")

    def reverse(self) -> None:
        raise TypeError("WaitingQueue keeps arrival order")

    def __imul__(self, n: int) -> WaitingQueue:  # type: ignore[override,misc]
        raise TypeError("WaitingQueue holds each request once")

    def refresh(self, req: SchedReq) -> None:
        """Re-read ``req``'s lengths after they changed (a chunk extended, pages released).
        Arrival and SLO are fixed while a request waits."""
        k = self.position(req)
        self._empty += (req.prefill_remaining <= 0) - bool(self._i[REMAINING, k] <= 0)
        if self._rem_total is not None:
            self._rem_total += req.prefill_remaining - int(self._i[REMAINING, k])
        self._i[:, k] = _ints(req)
        self._f[REMAINING_F:, k] = _floats(req, self.chunk, self.no_slo_s)[REMAINING_F:]

    # ------------------------------------------------------------------ subsets and checks
    def subset(self, idx: Sequence[int] | np.ndarray) -> WaitingQueue:
        """A new queue of ``self[i] for i in idx`` with its columns taken, not re-read (a
        snapshot for one decision: dual queues hand each class to a policy this way)."""
        idx = np.asarray(idx, dtype=np.intp)
        out = WaitingQueue.__new__(WaitingQueue)
        list.__init__(out, self._o[idx].tolist())
        out.chunk, out.no_slo_s = self.chunk, self.no_slo_s
        out._views = None
        m = len(idx)
        cap = max(_MIN_CAP, m)
        out._f = np.empty((_NF, cap), np.float64)
        out._i = np.empty((3, cap), np.int64)
        out._o = np.empty(cap, object)
        out._f[:, :m] = self._f[:, idx]
        out._i[:, :m] = self._i[:, idx]
        out._o[:m] = self._o[idx]
        out._count_pairs()
        # (a snapshot for one decision: no empty ones in a part of a queue without any; the
        # total summed only if asked)
        out._empty = 0 if not self._empty else int(np.count_nonzero(out._i[REMAINING, :m] <= 0))
        out._rem_total = None
        return out

    def check(self) -> None:
        """Raise if a column disagrees with its request (a number changed behind the queue)."""
        n = len(self)
        for k, r in enumerate(self):
            f = _floats(r, self.chunk, self.no_slo_s)
            if (self._f[ARRIVAL, k] != f[0] or self._o[k] is not r
                    or tuple(self._f[REMAINING_F:, k].tolist()) != f[REMAINING_F:]
                    or not (self._f[SLO, k] == f[1] or (math.isnan(f[1]) and math.isnan(self._f[SLO, k])))
                    or not (self._f[DUE, k] == f[2] or (math.isnan(f[2]) and math.isnan(self._f[DUE, k])))
                    or not (self._f[SLO_OR, k] == f[3] or (math.isnan(f[3]) and math.isnan(self._f[SLO_OR, k])))
                    or tuple(self._i[:, k].tolist()) != _ints(r)):
                raise RuntimeError(f"waiting queue column {k} is stale for {getattr(r, 'rid', r)!r}: "
                                   f"{self._f[:, k].tolist()}, {self._i[:, k].tolist()} vs {f}, {_ints(r)}")
        ties, inversions, empty, total = self._ties, self._inversions, self._empty, self.remaining_total
        self._count_pairs()
        self._count_rem()
        if (empty, total) != (self._empty, self._rem_total):
            raise RuntimeError(f"waiting queue counted {empty} requests with nothing to prefill and {total} "
                               f"tokens to prefill, not {self._empty} and {self._rem_total}")
        if (ties, inversions) != (self._ties, self._inversions):
            raise RuntimeError(f"waiting queue counted {ties} equal and {inversions} unordered arrival "
                               f"neighbours, not {self._ties} and {self._inversions}")
        if n < self._o.shape[0] and any(x is not None for x in self._o[n:].tolist()):
            raise RuntimeError("waiting queue holds references past its end")
