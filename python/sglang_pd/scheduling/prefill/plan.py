"""The budget walk's plan from the queue's numbers alone (``plan_numbers``): the walk without a
per-request constraint, applied fast (the rules are in ``common.py``'s module docstring; the
walk itself, and the one-by-one form with ``fits`` or a chunker, are ``walk.py``).

Issue 20 (the decision is timed; the bar is 100 us at 1,000 waiting): without a per-request
constraint (``fits``, a time-budget chunker) the plan follows from the queue's numbers alone,
and ``plan_numbers`` works it out with a few dozen array operations and no Python loop over
requests (but one: a first block that holds several budgets, where the walk passes over more
requests than it grants, is walked in one Python pass, ``_pass``: issue 28, fewer calls). The
rules, restated for that:
- ``c = min(rem, chunk)``: what a request takes while the step's tokens last.
- A fresh request that a chunk cuts (``rem > chunk``) becomes partly prefilled: once
  ``max_partial`` are, the later ones are skipped. So of these, only the first
  ``max_partial - partial`` in the order may go (a prefix count).
- A fresh request needs a slot: only the first ``slots`` fresh requests that may go do.
  (The one-by-one walk ends, not skips, at a fresh request when no slot and no started
  request is left; nothing could be granted after it either way, so the plans agree.)
- The rest go whole while the prefix sum of their ``c`` stays within the tokens: one
  ``searchsorted`` finds the request that reaches the budget. It takes what is left and the
  step ends, unless it is fresh and the partial bound is reached: then it is skipped, and
  from there on a fresh request goes only whole within what is left (the tail: ``_tail``).
- A request with nothing to prefill (0 tokens) ends the walk at its turn.
Two options for the baselines' own rules (issue 34's policies, issue 28's bar): ``max_tokens``
caps every request's grant (``budget.grant``'s ``max_tokens``: vLLM's long-prefill threshold
acts as a smaller chunk), and ``passing=False`` makes the walk strict first come first served
(vLLM's waiting queue): the first request the rules above would skip (no slot, or one more
partly prefilled one past the bound) ends the walk instead, so the plan is a prefix of the
order and there is no tail.
The order is read a block at a time (``Order.head``; the first block sized from the budget),
the tail over the requests the rules still allow (``Order.after``: only those are sorted).
KV admission is asked afterwards, in plan order, through ``budget.grant_run``, which cuts the
plan at the first refusal as the walk would have stopped there (nothing before a refusal
depends on the KV). ``walk`` with ``fits`` or a chunker asks them request by request.
test_waiting_columns.py checks both against a one-by-one walk.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from sglang_pd.scheduling.prefill.order import Order, stable_argsort, first_of
from sglang_pd.scheduling.prefill.queue_view import Queue
from sglang_pd.scheduling.types import PrefillBudget, R

SCAN_MAX = 256  # the tail's candidates past the sorted part sorted and scanned when this few
FILTER_MIN = 128  # the tail scans a sorted part this long after an array filter, shorter ones as is
MIN_BLOCK = 32  # least first block of ``plan_numbers`` (else sized from the budget)
PASS_MAX = 384  # a first block up to this long, holding more than PASS_BUDGETS budgets of
PASS_BUDGETS = 2  # tokens, is walked in one Python pass (``_pass``)
KNOWN_MIN = 32  # the tail scans the sorted part alone first when at least this long
CUT_FIRST = 16  # with a policy's cut, the order's first this many are walked and cut first

_NO_POS = np.empty(0, dtype=np.intp)
_acc = np.add.accumulate  # ``cumsum`` without the method's overhead (the same sums)
_NO_TOKENS = np.empty(0, dtype=np.int64)

# a policy's own limit on the plan: given its positions and tokens, how many of them to keep
Cut = Callable[[np.ndarray, np.ndarray], int]
Piece = np.ndarray | list[int]  # a piece of the plan: a block's, or a Python walk's (as lists)


def plan_numbers(q: Queue[R], order: Order, budget: PrefillBudget, max_partial: int,
                 cut: Cut | None = None, max_tokens: int | None = None,
                 passing: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The walk without ``fits`` or a chunker, before KV admission: the queue positions granted
    and their tokens, in plan order (module docstring), cut by ``cut``. ``budget`` is read,
    not spent. ``max_tokens``: the most any one request is granted; ``passing=False``: the
    first request the rules skip ends the walk (module docstring)."""
    tokens, chunk, slots = budget.token_budget, budget.chunk_size, budget.new_req_slots
    if max_tokens is not None and max_tokens < chunk:
        chunk = max_tokens  # (what ``budget.grant(req, max_tokens)`` gives: the lesser of both)
    n = order.n
    if tokens <= 0 or chunk <= 0 or n == 0:
        return _NO_POS, _NO_TOKENS  # every request would get 0 tokens: the walk ends at once
    if cut is not None and n > CUT_FIRST:
        early = _cut_early(q, order, tokens, chunk, slots, max_partial, cut, passing)
        if early is not None:
            return early
    rem_all, fresh_all = q.rem, q.fresh
    partial = q.n_started
    pos: list[Piece] = []  # pieces of the plan, in order
    ns: list[Piece] = []
    tail: tuple[int, int, int] | None = None  # where the tail starts: position, tokens, slots
    # first block: enough requests of the queue's mean size to spend the budget 5 times over
    total = q.rem_total  # (kept by the waiting queue)
    if total is None:
        total = int(rem_all.sum())
    read, size = 0, max(MIN_BLOCK, 5 * tokens * n // max(total, 1) + 1)
    seg = order.head(size)
    r = rem_all[seg]
    # a first block of a few hundred that holds several budgets (so the walk passes over more
    # requests than it grants: skipped ones, the tail) in one Python pass, whose steps cost
    # less than the array rules' calls there (issue 28); one that mostly goes whole by arrays
    c0 = np.minimum(r, chunk)  # (the array rules' first block reuses both, and the sums)
    cum0 = _acc(c0)  # (``np.add.accumulate``: ``cumsum``'s sums, less call overhead)
    held = int(cum0[-1])
    if held < tokens and len(seg) < n:
        # the block holds less than one budget, so a second one will be read: read it now with
        # the first (the size the loop would give it), one pass of the array rules instead of
        # two (sjf: its shortest 167 all go, then 353 more were read; issue 28)
        m = len(seg)
        seg = order.head(m + 2 * (tokens - held) * m // max(held, 1) + MIN_BLOCK)
        size = len(seg)  # (the loop's first block: the same positions)
        r = rem_all[seg]
        c0 = np.minimum(r, chunk)
        cum0 = _acc(c0)
        held = int(cum0[-1])
    if len(seg) <= PASS_MAX and held > PASS_BUDGETS * tokens:
        read = m = len(seg)
        got: list[int] = []
        got_n: list[int] = []
        done, tokens, slots, partial = _pass(seg, r, fresh_all, tokens, slots, partial, q.n_started,
                                             chunk, max_partial, got, got_n, passing)
        _add(pos, ns, got, got_n)
        if done or read >= n:
            read = n
        elif passing and (slots <= 0 or (partial >= max_partial and tokens < chunk)):  # fresh ones
            tail = (read, tokens, slots)  # go only whole within less than a chunk, or not at all
            read = n
        else:  # next block: what the tokens left take at this block's mean size, twice over
            size = 2 * tokens * m // max(sum(got_n), 1) + MIN_BLOCK
    while read < n:
        base = read
        seg = order.head(read + size)[read:]
        read += len(seg)
        f = fresh_all[seg]
        if base:
            r = rem_all[seg]
            c = np.minimum(r, chunk)  # (a new array: the rules below zero what may not go in place)
            cum = None
        else:  # the first block, read above: ``order.head`` gave the same positions
            c, cum = c0, cum0
        m = len(seg)
        ok = None  # which ones the partial and slot rules let go (None: all)
        big = f & (r > chunk)  # fresh ones a chunk cuts: each one more partly prefilled
        n_big = int(np.count_nonzero(big))
        cuts = False  # whether the rules let some of ``big`` go (else none is counted below)
        if n_big:
            quota = max_partial - partial
            cuts = quota > 0
            if cuts:
                ok = ~big | (_acc(big, dtype=np.intp) <= quota)
                c[~ok] = 0
            else:
                ok = ~big
                c[big] = 0
            cum = None
        if cum is None:
            cum = _acc(c)
        end = int(cum.searchsorted(tokens))  # the request that reaches the budget
        if slots < m:  # slots may run out in this block: the first ``slots`` fresh ones that go
            goes = f if ok is None else f & ok
            # only if they run out at or before ``end`` does the slot rule change what goes
            # before it, and ``end`` (sjf: 256 slots, the budget spent by the 249th)
            if int(np.count_nonzero(goes[: end + 1])) > slots:
                has_slot = ~f if slots <= 0 else ~f | (_acc(goes, dtype=np.intp) <= slots)
                ok = has_slot if ok is None else ok & has_slot
                c[~ok] = 0
                cum = _acc(c)
                end = int(cum.searchsorted(tokens))
        stop = False  # (strict FCFS: a request the rules skip in this block ends the walk)
        if not passing and ok is not None:
            s = int(ok.argmin())
            if not ok[s]:  # the first one the rules skip: it and all after it do not go
                ok[s:] = False
                c[s:] = 0
                cum = _acc(c)
                end = int(cum.searchsorted(tokens))
                stop = True
        if q.n_empty != 0 and r.min() <= 0:  # a request with nothing to prefill ends the walk at its turn
            zero = r <= 0 if ok is None else (r <= 0) & ok
            z = int(zero.argmax())
            if zero[z] and z < end:
                _emit(pos, ns, seg, c, ok, z)
                break
        if end == m:  # the whole block goes (as far as the rules let it)
            _emit(pos, ns, seg, c, ok, m)
            tokens -= int(cum[-1])
            if ok is None:
                slots -= int(np.count_nonzero(f))
                partial += n_big
            else:
                slots -= int(np.count_nonzero(f & ok))
                if cuts:
                    partial += int(np.count_nonzero(big & ok))
            if stop:
                break
            # only started requests may go from here on (strict: the next block's slot rule ends it)
            if slots <= 0 and read < n and passing:
                tail = (read, tokens, slots)
                break
            # next block: what the tokens left take at this block's mean size, twice over
            size = 2 * tokens * m // max(int(cum[-1]), 1) + MIN_BLOCK
            continue
        if cum[end] == tokens:  # it fits exactly: the budget is spent
            _emit(pos, ns, seg, c, ok, end + 1)
            break
        _emit(pos, ns, seg, c, ok, end)
        left = tokens - (int(cum[end - 1]) if end else 0)
        if cuts and f[end]:  # (else none of ``big`` went: ok is None only without any)
            before = big[:end] if ok is None else big[:end] & ok[:end]
            partial += int(np.count_nonzero(before))
        if not f[end] or partial < max_partial:  # it takes what is left: the step is full
            pos.append(seg[end: end + 1])
            ns.append(np.array([left], dtype=np.int64))
            break
        # a fresh one the budget would cut, and the partial bound is reached: skipped (strict:
        if not passing:  # it ends the walk)
            break
        used = f[:end] if ok is None else f[:end] & ok[:end]
        tail = (base + end + 1, left, slots - int(np.count_nonzero(used)))
        break
    if tail is not None:
        if cut is not None and pos:  # cut already before the tail: the tail is not needed
            p, t = _joined(pos, ns)
            k = cut(p, t)
            if k < len(p):
                return p[:k], t[:k]
        _tail(q, order, *tail, chunk, pos, ns)
    if not pos:
        return _NO_POS, _NO_TOKENS
    p, t = _joined(pos, ns)
    if cut is not None:
        k = cut(p, t)
        p, t = p[:k], t[:k]
    return p, t


def _cut_early(q: Queue[R], order: Order, tokens: int, chunk: int, slots: int, max_partial: int,
               cut: Cut, passing: bool) -> tuple[np.ndarray, np.ndarray] | None:
    """The plan if a policy's cut (or the walk) ends it within the order's first ``CUT_FIRST``
    requests, else None. A cut often ends the step within a few grants (kairos+: an urgent
    request with little room to give), and then the first block, sized for the budget, need
    not be read (for kairos+, reading past the urgent groups sorts by u, the FCFS simulation
    ``refine``): the plan is built front to back and a cut keeps a prefix of it, so the cut
    of its first grants is the cut of the whole plan (issue 28)."""
    seg = order.head(CUT_FIRST)
    got: list[int] = []
    got_n: list[int] = []
    done = _pass(seg, q.rem[seg], q.fresh, tokens, slots, q.n_started, q.n_started, chunk, max_partial,
                 got, got_n, passing)[0]
    if not got:
        return (_NO_POS, _NO_TOKENS) if done else None
    p, t = np.array(got, dtype=np.intp), np.array(got_n, dtype=np.int64)
    k = cut(p, t)
    return (p[:k], t[:k]) if k < len(p) or done else None


def _pass(seg: np.ndarray, rem: np.ndarray, fresh_all: np.ndarray, tokens: int, slots: int,
          partial: int, started_left: int, chunk: int, max_partial: int, got: list[int],
          got_n: list[int], passing: bool = True) -> tuple[bool, int, int, int]:
    """The walk's rules request by request over ``seg`` (the order's first block), as the
    one-by-one walk applies them; the grants are appended to ``got``/``got_n``. Returns whether
    the walk ended here (the tokens spent, a request with nothing to prefill reached, or only
    fresh requests left with no slot), and the tokens, slots and partial count left.
    ``rem``: their tokens to prefill; ``started_left``: the started requests not yet passed;
    ``passing=False``: a request the rules skip ends the walk."""
    lim = chunk if chunk < tokens else tokens  # the most one request may take now
    add, add_n = got.append, got_n.append
    for i, x, f in zip(seg.tolist(), rem.tolist(), fresh_all[seg].tolist()):
        if f:
            if slots <= 0:
                if started_left <= 0 or not passing:  # no slot, and nothing started is left
                    return True, tokens, slots, partial  # (or strict: nothing passes it)
                continue
            if x > lim:  # cut: one more partly prefilled request
                if partial >= max_partial:
                    if not passing:
                        return True, tokens, slots, partial
                    continue
                partial += 1
                c = lim
            else:
                c = x
            slots -= 1
        else:
            started_left -= 1
            c = x if x <= lim else lim
        if c <= 0:
            return True, tokens, slots, partial  # nothing to prefill: the walk ends at its turn
        add(i)
        add_n(c)
        tokens -= c
        if tokens <= 0:
            return True, tokens, slots, partial
        if tokens < lim:
            lim = tokens
    return False, tokens, slots, partial


def _joined(pos: list[Piece], ns: list[Piece]) -> tuple[np.ndarray, np.ndarray]:
    """The plan's pieces as two arrays (the tail's piece, last, may be lists: ``_add``)."""
    if len(pos) == 1:
        p, t = pos[0], ns[0]
        if isinstance(p, list):
            return np.array(p, dtype=np.intp), np.array(t, dtype=np.int64)
        return p, t  # type: ignore[return-value]  # (arrays: only the tail's piece is lists)
    return np.concatenate(pos, dtype=np.intp), np.concatenate(ns, dtype=np.int64)


def _emit(pos: list[Piece], ns: list[Piece], seg: np.ndarray, c: np.ndarray,
          ok: np.ndarray | None, k: int) -> None:
    """Add the first ``k`` of a block (those the rules let go) to the plan, whole (``c``)."""
    if k:
        if ok is None:
            pos.append(seg[:k])
            ns.append(c[:k])
        else:
            sel = ok[:k]
            pos.append(seg[:k][sel])
            ns.append(c[:k][sel])


def _tail(q: Queue[R], order: Order, p: int, tokens: int, slots: int, chunk: int,
          pos: list[Piece], ns: list[Piece]) -> None:
    """The walk past position ``p`` of the order once fresh requests go only whole within the
    tokens left (the partial bound is reached and fewer than a chunk is left) or not at all
    (no slot left). Then a request goes iff it is started or a fresh one within the tokens
    left, so the next one granted is the first in the order of those (every one before it
    was too long for more tokens than are left now, or granted): it is found with one
    ``argmin`` over them (``Order.rest``, not sorted: the tail grants a few of many), then
    the rest are filtered by the tokens now left; when at most ``SCAN_MAX`` remain they are
    sorted once and scanned instead (issue 28: a sort of a few dozen and one Python scan cost
    less than an ``argmin`` and a ``compress`` per grant). The sorted part is scanned without
    an array pre-filter unless longer than ``FILTER_MIN`` (``_scan``: fewer numpy calls). A
    started one reaching the budget takes what is left and the step ends; a request with
    nothing to prefill ends it."""
    rem_all, fresh_all = q.rem, q.fresh
    started = q.n_started > 0
    got: list[int] = []
    got_n: list[int] = []
    if slots <= 0 and not started:
        return
    # first the part of the order already sorted (``Order.known``: the block the walk read,
    # where the tail mostly ends): one scan, no pass over the whole queue; a short one (kairos:
    # ~20 left of its first block) is left to the candidates below, which hold it too, so the
    # tail is one sort and one scan, not two scans (issue 28)
    seg = order.known(p)
    if len(seg) >= KNOWN_MIN:
        done, tokens, slots = _scan(seg, rem_all, fresh_all, tokens, slots, chunk, started, got, got_n)
        if done:
            _add(pos, ns, got, got_n)
            return
        p += len(seg)
    if slots > 0:  # a fresh one within the tokens left (and the chunk), a started one always
        allowed = q.rem <= min(tokens, chunk)
        if started:
            allowed |= ~fresh_all
    else:
        allowed = ~fresh_all
    idx, key, group = order.rest(p, allowed)
    if not len(idx):
        _add(pos, ns, got, got_n)
        return
    if len(idx) <= SCAN_MAX:  # few: sorted (stably, as the order) and scanned as the known part
        # unless the first of them (one ``argmin``) ends the walk, as it often does (kairos: a
        # started one takes the tokens left; issue 28: no sort, no scan)
        j = first_of(key, group)
        i = int(idx[j])
        x = int(rem_all[i])
        n = min(x, chunk, tokens)
        if x <= 0 or n >= tokens or (not started and slots <= 1 and fresh_all[i]):
            if x > 0:  # (nothing to prefill: the walk ends at its turn, nothing granted)
                got.append(i)
                got_n.append(n)
            _add(pos, ns, got, got_n)
            return
        by = np.argsort(key, kind="stable")
        if group is not None:
            by = by[np.argsort(group[by], kind="stable")]
        _scan(idx[by], rem_all, fresh_all, tokens, slots, chunk, started, got, got_n)
        _add(pos, ns, got, got_n)
        return
    # one array, a column per request (one ``compress`` filters them all): key, fit,
    # position, group; ungrouped, built only once the tail grants a second one (it often
    # ends with the first: that one is read from ``key`` alone)
    t: np.ndarray | None = None
    # the length that must fit the tokens left: 0 for a started one (it always goes)
    fit = np.where(fresh_all, q.remf, 0.0) if started else q.remf
    if group is not None:  # by group (stable: queue order within one): the first group leads
        t = _table(key, fit, idx, group)
    while True:
        if t is None:
            j = first_of(key, None)
            i = int(idx[j])
        else:
            j = first_of(t[0] if group is None else t[0, : int(t[3].searchsorted(t[3, 0], "right"))], None)
            i = int(t[2, j])
        x = int(rem_all[i])
        if x <= 0:
            break  # nothing to prefill: the walk ends at its turn
        n = min(x, chunk, tokens)  # a fresh one here is within both: all of it
        got.append(i)
        got_n.append(n)
        tokens -= n
        slots -= bool(fresh_all[i])
        if tokens <= 0 or (slots <= 0 and not started):
            break
        if t is None:
            t = _table(key, fit, idx, None)
        if slots > 0:
            keep = t[1] <= min(tokens, chunk)
        else:
            keep = ~fresh_all[t[2].astype(np.intp)]
        keep[j] = False
        t = t.compress(keep, axis=1)
        if not t.shape[1]:
            break
    _add(pos, ns, got, got_n)


def _scan(seg: np.ndarray, rem_all: np.ndarray, fresh_all: np.ndarray, tokens: int, slots: int,
          chunk: int, started: bool, got: list[int], got_n: list[int]) -> tuple[bool, int, int]:
    """The tail over ``seg`` (positions in the order's order): a started one always goes, a
    fresh one only while a slot is left and within the tokens left (the limits only tighten, so
    one skipped now is skipped for good); the grants are appended to ``got``/``got_n``. Returns
    whether the walk ended here (the tokens or the slots spent, or a request with nothing to
    prefill reached), and the tokens and slots left."""
    lim = min(tokens, chunk) if slots > 0 else -1  # the longest fresh one that may go now
    if len(seg) > FILTER_MIN:  # long (sjf's tail reads hundreds): those that may go now first,
        f = fresh_all[seg]  # a superset of those that will (the limits only tighten)
        seg = seg[~f if slots <= 0 else ~f | (rem_all[seg] <= lim)]
    for i, x, fr in zip(seg.tolist(), rem_all[seg].tolist(), fresh_all[seg].tolist()):
        if fr and x > lim:
            continue  # no slot left, or too long for the tokens left: skipped
        if x <= 0:
            return True, tokens, slots  # nothing to prefill: the walk ends at its turn
        n = min(x, chunk, tokens)
        got.append(i)
        got_n.append(n)
        tokens -= n
        slots -= fr
        if tokens <= 0 or (slots <= 0 and not started):
            return True, tokens, slots
        lim = min(tokens, chunk) if slots > 0 else -1
    return False, tokens, slots


def _table(key: np.ndarray, fit: np.ndarray, idx: np.ndarray, group: np.ndarray | None) -> np.ndarray:
    """The tail's candidates as rows key, fit, position (, group: sorted by it, stably)."""
    t = np.empty((3 if group is None else 4, len(idx)))
    t[0], t[1], t[2] = key, fit[idx], idx
    if group is not None:
        t[3] = group
        t = t[:, stable_argsort(group)]
    return t


def _add(pos: list[Piece], ns: list[Piece], got: list[int],
         got_n: list[int]) -> None:
    """Add the tail's grants to the plan, as lists: ``_joined`` converts them with the rest
    (one ``concatenate`` each, not an array and a ``concatenate``: issue 28)."""
    if got:
        pos.append(got)
        ns.append(got_n)
