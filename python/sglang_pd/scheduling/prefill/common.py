"""What the deadline-aware prefill policies share: deadlines, work in seconds, the budget walk.

Definitions every policy here uses (docs/prefill_scheduling.md):
- Deadline: ``arrival + slo_ttft - deadline margin``. A request without a TTFT SLO (none in the
  request and no ``--slo-ttft-ms`` default) gets ``cfg.prefill_no_slo_ttft_ms`` (30 s): a large
  default deadline, so it ranks behind SLO'd work yet ages like any other request instead of
  waiting behind every SLO'd request forever. On prefill servers the margin
  (``cfg.prefill_deadline_margin_ms``) reserves the KV transfer and the first decode step after
  the prefill, since TTFT is measured at the first token, not at the end of prefill.
- Work: seconds from the ``PrefillCostModel`` for the tokens still to prefill
  (``prefill_remaining``, after prefix hits and done chunks) over the context already in the
  pool, alone, one chunk of ``chunked_prefill_size`` per step.
- The walk: in the policy's order, every grant through ``budget.grant`` (token budget, chunk
  cap, new-request slots and KV admission live there). Whole requests while the budget lasts;
  the first one cut by the token budget ends the step. A cut by the per-request chunk cap does
  not (the step budget is not spent: the walk goes on). A KV refusal ends the step: no
  backfilling past a request the pool cannot take now, or small prompts would keep taking the
  pages it waits for. Requests that would need a new-request slot when none is left are
  skipped (started ones may still continue).
- Chunk sizes: at most ``chunked_prefill_size`` per request; with a step-time budget
  (``--prefill-time-budget-ms``, Medha's adaptive chunking, ``chunking.py``) the largest chunk
  that fits the time left, a request that fits nothing skipped for this step.
- Bound on preempted prefills (ours): a request that starts and is not finished in this step
  becomes a partly prefilled request holding pages (whole-prompt pages on a PD prefill server).
  No new one starts while ``cfg.prefill_max_partial`` are partly prefilled; requests that
  finish within the step are still admitted.
"""

from __future__ import annotations

from bisect import bisect_left
from operator import itemgetter
from typing import Callable, Generic, Sequence

import numpy as np

from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.cost_model import PrefillCostModel
from sglang_pd.scheduling.prefill.chunking import TimeBudgetChunker
from sglang_pd.scheduling.step import StepProfile
from sglang_pd.scheduling.types import PrefillBudget, PrefillPolicy, R
from sglang_pd.scheduling.waiting import WaitingQueue


class Queue(Generic[R]):
    """One read of the waiting queue: the per-request numbers the policies need, as numpy arrays
    in the queue's order. From a ``WaitingQueue`` (the Scheduler's) they are its columns, kept
    incrementally, so nothing is read from the requests; from any other sequence (tests, a
    policy's own subset) they are read from the requests here, once. Every policy then runs the
    same array code on either, so both give the same decision."""

    __slots__ = ("reqs", "arrival", "slo", "pre", "cached", "rem", "fresh", "n_started", "_objs")

    def __init__(self, waiting: Sequence[R]) -> None:
        self.reqs = waiting
        if isinstance(waiting, WaitingQueue):
            self.arrival, self.slo = waiting.arrival, waiting.slo
            self.pre, self.cached, self.rem = waiting.prefilled, waiting.cached, waiting.remaining
            self._objs: np.ndarray | None = waiting.objects
        else:
            n = len(waiting)
            self.arrival = np.fromiter((r.arrival for r in waiting), np.float64, n)
            self.slo = np.fromiter((r.slo_ttft_s or np.nan for r in waiting), np.float64, n)
            self.pre = np.fromiter((r.prefilled_len for r in waiting), np.int64, n)
            self.cached = np.fromiter((r.cached_len for r in waiting), np.int64, n)
            self.rem = np.fromiter((r.prefill_remaining for r in waiting), np.int64, n)
            self._objs = None
        # not started: no KV of its own yet (prefix-cache hits count as context, not as started)
        self.fresh = self.pre <= self.cached
        self.n_started = len(self.fresh) - int(np.count_nonzero(self.fresh))  # holding pages

    def __len__(self) -> int:
        return len(self.pre)

    def pick(self, idx: np.ndarray) -> list[R]:
        """``[reqs[i] for i in idx]``."""
        if self._objs is not None:
            return self._objs[idx].tolist()
        reqs = self.reqs
        return [reqs[i] for i in idx.tolist()]

    def sub(self, idx: np.ndarray) -> "Queue[R]":
        """The requests at ``idx`` (in that order) as a Queue of their own, its
        columns taken from this one (dual queues: one class of the waiting queue)."""
        out = Queue.__new__(Queue)
        out.arrival, out.slo, out.pre = self.arrival[idx], self.slo[idx], self.pre[idx]
        out.cached, out.rem, out.fresh = self.cached[idx], self.rem[idx], self.fresh[idx]
        out.n_started = len(idx) - int(np.count_nonzero(out.fresh))
        if self._objs is not None:
            out._objs = self._objs[idx]
            out.reqs = out._objs  # read by position only
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
    condition keeps, in order, sorting only those. A NaN at the k-th key, or k near n, sorts
    the whole queue. ``Order.of(perm)`` wraps an order computed elsewhere."""

    __slots__ = ("key", "group", "n", "_head", "_full")

    def __init__(self, key: np.ndarray, group: np.ndarray | None = None) -> None:
        self.key, self.group, self.n = key, group, len(key)
        self._head: np.ndarray | None = None
        self._full: np.ndarray | None = None

    @classmethod
    def of(cls, perm: Sequence[int] | np.ndarray) -> "Order":
        perm = np.asarray(perm, dtype=np.intp)
        o = cls.__new__(cls)
        o.key = o.group = None
        o.n = len(perm)
        o._head = o._full = perm
        return o

    def _sorted(self, idx: np.ndarray) -> np.ndarray:
        """``idx`` (ascending) in the order."""
        if self.group is None:
            return idx[np.argsort(self.key[idx], kind="stable")]
        return idx[np.lexsort((self.key[idx], self.group[idx]))]

    def full(self) -> np.ndarray:
        if self._full is None:
            if self.group is None:
                self._full = np.argsort(self.key, kind="stable")
            else:  # by key, then a stable sort by group keeps each group in key order
                by_key = np.argsort(self.key, kind="stable")
                self._full = by_key[np.argsort(self.group[by_key].astype(np.int8), kind="stable")]
            self._head = self._full
        return self._full

    def head(self, k: int) -> np.ndarray:
        """The first ``k`` positions of the order."""
        h = self._head
        if h is not None and (len(h) >= k or h is self._full):
            return h[:k]
        if 4 * k >= self.n:
            return self.full()[:k]
        key = self.key
        if self.group is None:
            v = np.partition(key, k - 1)[k - 1]
            if v != v:  # NaN: fewer than k numbers
                return self.full()[:k]
            cand = np.flatnonzero(key <= v)
        else:
            cum = np.bincount(self.group).cumsum()
            g = int(cum.searchsorted(k))  # the group the k-th request is in
            need = k - (int(cum[g - 1]) if g else 0)
            in_g = self.group == g
            v = np.partition(key[in_g], need - 1)[need - 1]
            if v != v:
                return self.full()[:k]
            cand = np.flatnonzero((self.group < g) | (in_g & (key <= v)))
        h = self._head = self._sorted(cand)[:k]
        return h

    def after(self, p: int, mask: np.ndarray) -> np.ndarray:
        """The positions past the first ``p`` of the order (``p`` <= what ``head`` gave) where
        ``mask`` (over the queue) holds, in order."""
        h = self._head
        rest = h[p:]
        rest = rest[mask[rest]]
        if h is self._full:
            return rest
        seen = np.zeros(self.n, dtype=bool)
        seen[h] = True
        return np.concatenate((rest, self._sorted(np.flatnonzero(mask & ~seen))))


def stable_order(key: np.ndarray, descending: bool = False) -> Order:
    """Indices by ``key`` (ascending, or descending), ties in queue (arrival) order: what
    ``sorted(range(n), key=key.__getitem__, reverse=descending)`` gives (Python's sort is stable
    both ways), read lazily (``Order``)."""
    return Order(-key if descending else key)


class DeadlinePolicy(PrefillPolicy):
    """Base of the deadline-aware prefill policies: a cost model (shared shape, own fit) and the
    definitions above. ``cost_model`` given = fixed from outside (tests, the simulator)."""

    def __init__(self, cfg: PolicyConfig | None = None, cost_model: PrefillCostModel | None = None) -> None:
        super().__init__(cfg)
        self.model = cost_model if cost_model is not None else PrefillCostModel.from_config(self.cfg)
        self.chunk = self.cfg.chunked_prefill_size
        self.default_slo_s = self.cfg.slo_ttft_s or self.cfg.prefill_no_slo_ttft_ms / 1e3
        self.margin_s = self.cfg.prefill_deadline_margin_ms / 1e3
        self.max_partial = self.cfg.prefill_max_partial

    def observe(self, step: StepProfile, elapsed_s: float, now: float) -> None:
        self.model.observe(step, elapsed_s, now)

    def slo_s(self, req: R) -> float:
        return req.slo_ttft_s or self.default_slo_s

    def deadline(self, req: R) -> float:
        return req.arrival + (req.slo_ttft_s or self.default_slo_s) - self.margin_s

    def deadlines(self, q: Queue) -> np.ndarray:
        return q.arrival + q.slos(self.default_slo_s) - self.margin_s

    def work_s(self, req: R) -> float:
        """Seconds of prefill still to do (alone, chunk by chunk)."""
        return self.model.request_s(req.prefill_remaining, req.prefilled_len, self.chunk)

    def works(self, q: Queue) -> np.ndarray:
        return self.model.request_times_array(q.rem, q.pre, self.chunk)

    def total_work_s(self, req: R) -> float:
        """Seconds of the whole prefill from its prefix hits on (Medha's w_total)."""
        new = req.prefilled_len + req.prefill_remaining - req.cached_len
        return self.model.request_s(new, req.cached_len, self.chunk)

    def total_works(self, q: Queue) -> np.ndarray:
        return self.model.request_times_array(q.pre + q.rem - q.cached, q.cached, self.chunk,
                                              empty_is_zero=True)

    def rho(self, req: R, now: float) -> float:
        """Medha §4.1's relative slack: (deadline - now - remaining work) / total work."""
        return (self.deadline(req) - now - self.work_s(req)) / max(self.total_work_s(req), 1e-9)

    def walk(self, q: Queue, order: Sequence[int] | np.ndarray, budget: PrefillBudget,
             fits: Callable[[R, int], bool | None] | None = None, now: float = 0.0) -> list[tuple[R, int]]:
        chunker = TimeBudgetChunker.for_config(self.cfg, self.model, lambda r: self.rho(r, now),
                                               budget.rider_contexts)
        return walk(q, order, budget, self.max_partial, fits, chunker)


FIRST_BLOCK = 128  # requests of the order read at once by the walk; each next block 4x larger


def walk(q: Queue, order: Order | Sequence[int] | np.ndarray, budget: PrefillBudget, max_partial: int,
         fits: Callable[[R, int], bool | None] | None = None,
         chunker: TimeBudgetChunker | None = None) -> list[tuple[R, int]]:
    """Grant ``q.reqs[i] for i in order`` (every waiting request once, in the policy's order)
    front to back under the rules in the module docstring. ``fits(req, n)``, when given, is a
    policy's own constraint, asked right before the grant of ``n`` tokens: True grants, False
    skips the request, None ends the walk (nothing later can fit).

    Speed (issue 20: the decision is timed): the order is read a block at a time (``Order``:
    a step rarely goes past its first few dozen, which are all that is sorted). Without
    ``fits`` or a chunker the walk is arithmetic on the queue's numbers (``_walk_numbers``);
    with them it asks them request by request. Both give what the one-by-one walk gives
    (test_waiting_columns.py checks it against one)."""
    if not isinstance(order, Order):
        order = Order.of(order)
    if fits is None and chunker is None:
        return _walk_numbers(q, order, budget, max_partial)
    plan: list[tuple[R, int]] = []
    partial = started_left = q.n_started
    pos, total, block = 0, order.n, FIRST_BLOCK
    while pos < total:
        idx = order.head(pos + block)[pos:]
        pos += len(idx)
        block *= 4
        rems: list[int] = q.rem[idx].tolist()
        fresh_of: list[bool] = q.fresh[idx].tolist()
        reqs = q.pick(idx)
        for j, req in enumerate(reqs):
            rem, fresh = rems[j], fresh_of[j]
            n_want = min(rem, budget.token_budget, budget.chunk_size)
            if fresh:
                if budget.new_req_slots <= 0:
                    if started_left <= 0:
                        return plan  # only fresh requests are left and none may start
                    continue
                if n_want < rem and partial >= max_partial:
                    continue  # would be one more partly prefilled request holding pages
            else:
                started_left -= 1
            cap = None
            if chunker is not None:  # Medha adaptive chunking: the chunk that fits the time left
                cap = chunker.size(req, n_want)
                if cap == 0:
                    continue  # skipped this step (never re-queued in a loop)
                if fresh and cap < rem and partial >= max_partial:
                    continue
                n_want = cap
            if fits is not None:
                ok = fits(req, n_want)
                if not ok:
                    if ok is None:
                        return plan
                    continue
            n = budget.grant(req, cap)
            if n == 0:
                return plan  # KV refusal: no backfilling past it
            if chunker is not None:
                chunker.add(req, n)
            plan.append((req, n))
            if fresh and n < rem:
                partial += 1
            if budget.token_budget <= 0:
                return plan
    return plan


NARROW_AGAIN = 16  # requests left in a window above which a skip filters them (a few array ops)
RUN_MIN = 8  # requests before the next stop for which a run search (a few array ops) pays


def _walk_numbers(q: Queue, order: Order, budget: PrefillBudget, max_partial: int) -> list[tuple[R, int]]:
    """The walk without ``fits`` or a chunker: the plan follows from the queue's numbers.
    - The order is read in windows (blocks of it, each next one 4x larger).
    - Runs: from a position on, the requests that each take their whole remainder (within the
      chunk cap, the tokens left and the slots left) are granted at once, the run's end found
      by prefix sums of the window (one search each for the budget and the slots).
    - The request that ends a run (cut by the chunk cap or the budget, no slot, 0 tokens) goes
      through the rules one by one.
    - Once the slot or partial rules skip every fresh request that would be cut (budget nearly
      spent) or every fresh one (no slot left), only the requests those rules leave are
      visited (the rules only tighten as the walk goes on): each window is filtered as it is
      read, the rest of the current one when a skip leaves many, and when few requests are
      left in all, they are found over the rest of the order at once (``Order.after``:
      only those are sorted).
    KV admission is asked afterwards, in plan order, through ``budget.grant_run``, which cuts
    the plan at the first refusal, as the walk would have stopped there (nothing before a
    refusal depends on the KV)."""
    chunk = budget.chunk_size
    tokens, slots = budget.token_budget, budget.new_req_slots
    partial = started_left = q.n_started
    rem_all, fresh_all = q.rem, q.fresh
    got: list[int] = []  # queue positions granted, in plan order
    ns: list[int] = []
    starts: list[bool] = []
    total, size, read = order.n, FIRST_BLOCK, 0
    src: np.ndarray | None = None  # once set: what is left to visit, in order (else the order)
    filt = 0  # 1: fresh ones only whole within the tokens left; 2: no fresh ones
    done = False
    while not done:
        if src is None:
            if read >= total:
                break
            seg = order.head(read + size)[read:]
            read += len(seg)
        else:
            if read >= len(src):
                break
            seg = src[read: read + size]
            read += size
        size *= 4
        rem_a, fresh_a = rem_all[seg], fresh_all[seg]
        if filt:
            keep = ~fresh_a if filt == 2 else ~fresh_a | (rem_a <= min(tokens, chunk))
            seg, rem_a, fresh_a = seg[keep], rem_a[keep], fresh_a[keep]
        j = m = 0
        while j < len(seg):  # a window, or what is left of it after a filter
            if j:
                seg, rem_a, fresh_a = seg[j:], rem_a[j:], fresh_a[j:]
                if filt:
                    keep = ~fresh_a if filt == 2 else ~fresh_a | (rem_a <= min(tokens, chunk))
                    seg, rem_a, fresh_a = seg[keep], rem_a[keep], fresh_a[keep]
            m = len(seg)
            rems: list[int] = rem_a.tolist()
            fresh_of: list[bool] = fresh_a.tolist()
            stops = np.flatnonzero((rem_a <= 0) | (rem_a > chunk)).tolist()  # never in a run
            stops.append(m)
            cum_tok = cum_new = None
            j = no_run_until = 0
            refilter = False
            while j < m:
                stop = stops[bisect_left(stops, j)]
                if stop - j >= RUN_MIN and j >= no_run_until:
                    # a run from j: whole requests within the tokens and slots left, up to the
                    # stop, found by prefix sums of the window (made at its first run)
                    if cum_tok is None:
                        cum_tok, cum_new = rem_a.cumsum(), fresh_a.cumsum()
                    base_tok = int(cum_tok[j - 1]) if j else 0
                    e = min(int(cum_tok.searchsorted(tokens + base_tok, "right")), stop)
                    base_new = int(cum_new[j - 1]) if j else 0
                    if slots < e - j:
                        e = min(e, int(cum_new.searchsorted(max(slots, 0) + base_new, "right")))
                    if e - j < RUN_MIN:
                        no_run_until = e + RUN_MIN  # runs are short here: go one by one a while
                    if e > j:
                        got.extend(seg[j:e].tolist())
                        ns.extend(rems[j:e])
                        starts.extend(fresh_of[j:e])
                        new = int(cum_new[e - 1]) - base_new
                        tokens -= int(cum_tok[e - 1]) - base_tok
                        slots -= new
                        started_left -= e - j - new
                        j = e
                        if tokens <= 0:
                            done = True
                            break
                        if e == m:
                            break
                # the request at j, by the rules
                rem, fresh = rems[j], fresh_of[j]
                j += 1
                n_want = min(rem, tokens, chunk)
                if fresh:
                    skip = 0
                    if slots <= 0:
                        if started_left <= 0:
                            done = True  # only fresh requests are left and none may start
                            break
                        skip = 2  # from here on only partly prefilled ones can go
                    elif n_want < rem and partial >= max_partial:
                        skip = 1  # from here on fresh ones go only whole, within what is left
                    if skip:
                        if filt < skip:
                            filt = skip
                            if src is None and read < total:
                                # few left in all: find them over the rest of the order at once
                                mask = ~fresh_all if filt == 2 else ~fresh_all | (rem_all <= min(tokens, chunk))
                                if 8 * int(np.count_nonzero(mask)) < total - read:
                                    src, read, size = order.after(read - m + j, mask), 0, FIRST_BLOCK
                                    j = m = 0
                                    break
                        if m - j > NARROW_AGAIN:
                            refilter = True
                            break
                        continue
                else:
                    started_left -= 1
                if n_want <= 0:
                    done = True  # grant would refuse: the walk ends as at a KV refusal
                    break
                got.append(int(seg[j - 1]))
                ns.append(n_want)
                starts.append(fresh)
                tokens -= n_want
                slots -= fresh
                if fresh and n_want < rem:
                    partial += 1
                if tokens <= 0:
                    done = True
                    break
            if done or not refilter:
                break
    if not got:
        return []
    reqs = q.take(got)
    k = budget.grant_run(reqs, ns, starts)  # cut at the first KV refusal
    return list(zip(reqs[:k], ns[:k])) if k < len(reqs) else list(zip(reqs, ns))


def fcfs_finish_array(arrivals: np.ndarray, works: np.ndarray, now: float) -> np.ndarray:
    """Kairos Alg. 2 for every request at once: the finish time of each under FCFS from ``now``,
    counting all requests that arrived at or before it (``<=``: equal arrivals count each
    other). Every waiting request has arrived, so max(t, arrival) = t and this is a prefix sum
    over the arrival order (``arrivals`` ascending; ``np.cumsum`` adds left to right, as a
    loop would). A run of equal arrivals all finish when its last one does. O(n)."""
    n = len(works)
    fin = np.cumsum(np.concatenate(([now], works)))[1:]
    if n > 1:
        ends = np.flatnonzero(arrivals[:-1] != arrivals[1:])  # last index of each run but the last
        if len(ends) < n - 1:  # some equal neighbours
            starts = np.concatenate(([0], ends + 1))
            run_end = np.concatenate((ends, [n - 1]))
            last = np.repeat(run_end, np.diff(np.concatenate((starts, [n]))))
            fin = fin[last]
    return fin


def fcfs_finish(arrivals: Sequence[float], works: Sequence[float], now: float) -> list[float]:
    """``fcfs_finish_array`` over lists."""
    return fcfs_finish_array(np.asarray(arrivals, dtype=np.float64), np.asarray(works, dtype=np.float64),
                             now).tolist()
