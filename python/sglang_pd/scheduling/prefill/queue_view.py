"""What a prefill policy reads: the waiting queue's numbers, as numpy arrays (``Queue``). Issue 20
(decision time): a decision is a few dozen array operations over these, not a Python pass over
every waiting request. The policy's order over them is ``order.py``."""

from __future__ import annotations

from operator import itemgetter
from typing import Generic
from collections.abc import Iterable, Sequence

import numpy as np

from sglang_pd.scheduling.cost_model import work_features_array
from sglang_pd.scheduling.types import R
from sglang_pd.scheduling.waiting import WaitingQueue


class Queue(Generic[R]):
    """One read of the waiting queue: the per-request numbers the policies need, as numpy arrays
    in the queue's order. From a ``WaitingQueue`` (the Scheduler's) they are its columns, kept
    incrementally, so nothing is read from the requests; from any other sequence (tests, a
    policy's own subset) they are read from the requests here, once. Every policy then runs the
    same array code on either, so both give the same decision."""

    __slots__ = ("reqs", "arrival", "slo", "due", "slo_or", "due_default", "pre", "cached", "rem", "fresh", "n_started", "n_empty", "_wq", "_objs",
                 "_remf", "_pref", "_features", "_ordered", "_distinct", "_src")
    _ordered: bool | None  # None: not known yet (a sub-queue asks its parent)
    _distinct: bool | None

    def __init__(self, waiting: Sequence[R]) -> None:
        self.reqs = waiting
        if isinstance(waiting, WaitingQueue):
            c = waiting.views()
            self.arrival, self.slo, self.pre, self.cached, self.rem = c.arrival, c.slo, c.prefilled, c.cached, c.remaining
            # arrival + (SLO or due_default), kept by the queue (None: not kept)
            self.due: np.ndarray | None = c.due if waiting.no_slo_s is not None else None
            self.slo_or: np.ndarray | None = c.slo_or if waiting.no_slo_s is not None else None  # SLO or due_default
            self.due_default: float | None = waiting.no_slo_s
            self._objs: np.ndarray | None = c.objects
            self._remf: np.ndarray | None = c.remaining_f
            self._pref: np.ndarray | None = c.prefilled_f
            self._features: tuple[int | None, tuple[np.ndarray, ...]] | None = (waiting.chunk, (c.chunks, c.quad, c.context_sum))
            # arrivals ascending / and all different (the queue counts its neighbour pairs)
            self._ordered, self._distinct = waiting.ordered, waiting.distinct
            # requests with nothing to prefill, counted by the queue (None: not known)
            self.n_empty: int | None = waiting.n_empty
            self._wq: WaitingQueue | None = waiting  # (its ``remaining_total``: ``rem_total``)
        else:
            n = len(waiting)
            self.arrival = np.fromiter((r.arrival for r in waiting), np.float64, n)
            self.slo = np.fromiter((r.slo_ttft_s or np.nan for r in waiting), np.float64, n)
            self.pre = np.fromiter((r.prefilled_len for r in waiting), np.int64, n)
            self.cached = np.fromiter((r.cached_len for r in waiting), np.int64, n)
            self.rem = np.fromiter((r.prefill_remaining for r in waiting), np.int64, n)
            self._objs = self._remf = self._pref = self._features = self.due = self.slo_or = self.due_default = None
            self._ordered = self._distinct = False  # not known: not assumed
            self.n_empty = self._wq = None
        self._src: tuple[Queue[R], np.ndarray] | None = None  # a sub-queue's parent and positions
        # not started: no KV of its own yet (prefix-cache hits count as context, not as started)
        self.fresh = self.pre <= self.cached
        self.n_started = len(self.fresh) - int(np.count_nonzero(self.fresh))  # holding pages

    def __len__(self) -> int:
        return len(self.pre)

    @property
    def rem_total(self) -> int | None:
        """``rem`` summed, as the waiting queue keeps it (None: not kept)."""
        return None if self._wq is None else self._wq.remaining_total

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
        out.due, out.due_default = None if self.due is None else self.due[idx], self.due_default
        out.slo_or = None  # (``slos_read`` fills it in when asked: most sub-queues' policies do not)
        out.n_started = len(idx) - int(np.count_nonzero(out.fresh))
        out.n_empty = None if self.n_empty is None or self.n_empty else 0  # (none in a part of none)
        out._wq = None
        out._remf = out._pref = out._features = out._ordered = out._distinct = None
        out._src = (self, idx)  # features and order properties taken from here when asked
        if self._objs is not None:
            out._objs = self._objs[idx]
            out.reqs = out._objs  # type: ignore[assignment]  # read by position only
        else:
            out._objs = None
            out.reqs = self.pick(idx)
        return out

    def every(self) -> list[R]:
        """All the requests, in queue order, as a list."""
        if self._objs is not None:
            every: list[R] = self._objs.tolist()
            return every
        return list(self.reqs)

    def take(self, idx: list[int]) -> list[R]:
        """``[reqs[i] for i in idx]`` for a list of positions."""
        if isinstance(self.reqs, np.ndarray):  # a sub-queue's objects
            return self.reqs[idx].tolist()
        if len(idx) == 1:
            return [self.reqs[idx[0]]]
        return list(itemgetter(*idx)(self.reqs))

    def slos(self, default: float) -> np.ndarray:
        """``slo_ttft_s or default`` of every request (a new array)."""
        return np.where(np.isnan(self.slo), default, self.slo)

    def slos_read(self, default: float) -> np.ndarray:
        """``slos(default)`` to read only: the waiting queue's own column when it keeps one for
        this default (two array calls fewer per decision), else a new array."""
        if self.slo_or is not None and self.due_default == default:
            return self.slo_or
        return self.slos(default)
