"""The budget walk: grant the waiting requests in a policy's order under the step's budget (the
rules are in ``common.py``'s module docstring). Without a per-request constraint the plan comes
from the queue's numbers (``plan.py``, array code) and only KV admission is asked here; with
``fits`` or a time-budget chunker the walk asks them request by request
(``_walk_one_by_one``). test_waiting_columns.py checks both against a one-by-one walk.
With a step-time allowance (``budget.step_time``: the colocated interleave while decodes run)
every request's chunk is sized by the time left at its own context: the plan from the numbers
is granted request by request through it (``_grant_timed``): while others are planned behind
a request, it leaves them their predicted time up to ``1 - chunk/step tokens`` of the step
(``StepTime.keep_for``: the chunk cap's share, in time), and the first request cut with nothing
left to others ends the step, as a cut by the token budget does; tokens the time cut leaves are
planned again down the order first (``_replan_after_time_cut``); the one-by-one walk skips a request that
fits nothing (a long context where not one token fits the time left: a shorter one behind
it may still fit).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

import numpy as np

from sglang_pd.scheduling.prefill.chunking import TimeBudgetChunker
from sglang_pd.scheduling.prefill.order import Order
from sglang_pd.scheduling.prefill.plan import Cut, plan_numbers
from sglang_pd.scheduling.prefill.queue_view import Queue
from sglang_pd.scheduling.types import PrefillBudget, R

FIRST_BLOCK = 128  # requests of the order read at once by the one-by-one walk; each next 4x larger


def walk(q: Queue[R], order: Order | Sequence[int] | np.ndarray, budget: PrefillBudget, max_partial: int,
         fits: Callable[[R, int], bool | None] | None = None,
         chunker: TimeBudgetChunker | None = None, cut: Cut | None = None) -> list[tuple[R, int]]:
    """Grant ``q.reqs[i] for i in order`` (every waiting request once, in the policy's order)
    front to back under the rules in common.py's docstring. ``fits(req, n)``, when given, is a
    policy's own constraint, asked right before the grant of ``n`` tokens: True grants, False
    skips the request, None ends the walk (nothing later can fit). ``cut(positions, tokens)``
    is the array form of a ``fits`` that never skips (only ends): how many of the plan's
    requests to keep (used without ``fits`` and a chunker)."""
    if not isinstance(order, Order):
        order = Order.of(order)
    if fits is None and chunker is None:
        pos, ns = plan_numbers(q, order, budget, max_partial, cut)
        if budget.step_time is not None:
            if cut is None:  # (a policy's own cut is not asked again about a longer plan)
                pos, ns = _replan_after_time_cut(q, order, budget, max_partial, pos, ns)
            return _grant_timed(q, budget, pos, ns, max_partial)
        return grant_plan(q, budget, pos, ns)
    return _walk_one_by_one(q, order, budget, max_partial, fits, chunker)


def grant_plan(q: Queue[R], budget: PrefillBudget, pos: np.ndarray, ns: np.ndarray) -> list[tuple[R, int]]:
    """Grant ``ns[j]`` tokens to the request at ``pos[j]``, in order (``budget.grant_run``: the
    plan was worked out from the numbers; only KV admission is asked, cut at its first refusal)."""
    if not len(pos):
        return []
    reqs = q.pick(pos)
    tokens: list[int] = ns.tolist()
    start = len(budget.granted)
    budget.grant_run(reqs, tokens, q.fresh[pos].tolist())
    return cast("list[tuple[R, int]]", budget.granted[start:])  # what grant_run recorded: the grants


def _replan_after_time_cut(q: Queue[R], order: Order, budget: PrefillBudget, max_partial: int,
                           pos: np.ndarray, ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The plan from the numbers, plus the next requests of the order for the tokens the time
    allowance will not let the planned ones take: a long context's planned chunk (4K tokens at
    500-800K context: 0.4-0.65 s) gets the 100-400 tokens that fit the step's time, and two
    such partials planned side by side used the whole token budget, so the short prompts
    ranked after them were in no step while the long ones ran (issue 28, the Medha scenario,
    session 5: 4,869 steps held a long one only while shorts waited). The extra requests are
    planned by the same rules (``plan_numbers`` over the rest of the order, with the slots and
    the partial-prefill room the plan leaves) and granted after the plan's, each in the time
    the ones before it leave (``keep_for``)."""
    st = budget.step_time
    assert st is not None
    if not len(pos):
        return pos, ns
    tokens: list[int] = ns.tolist()
    freed = sum(n - min(n, st.fit(r, n)) for r, n in zip(q.pick(pos), tokens))  # (st.keep is 0 here)
    if freed <= 0:
        return pos, ns
    head = order.head(min(order.n, len(pos) + FIRST_BLOCK))
    at = (head == pos[-1]).nonzero()[0]
    if not len(at) or at[0] + 1 >= len(head):
        return pos, ns
    fresh, rem = q.fresh[pos], q.rem[pos]
    saved = budget.token_budget, budget.new_req_slots
    budget.token_budget = freed
    budget.new_req_slots -= int(np.count_nonzero(fresh))
    started = int(np.count_nonzero(fresh & (ns < rem)))  # fresh ones the plan leaves partly prefilled
    try:
        more, more_ns = plan_numbers(q, Order.of(head[at[0] + 1:]), budget, max_partial - started)
    finally:
        budget.token_budget, budget.new_req_slots = saved
    if not len(more):
        return pos, ns
    return np.concatenate((pos, more)), np.concatenate((ns, more_ns))


def _grant_timed(q: Queue[R], budget: PrefillBudget, pos: np.ndarray, ns: np.ndarray,
                 max_partial: int) -> list[tuple[R, int]]:
    """``grant_plan`` under a step-time allowance: each planned request gets what fits the time
    left at its own context (at most its planned tokens); the first one cut ends the step, and
    a fresh one the cut would leave partly prefilled is left out while ``max_partial`` are."""
    st = budget.step_time
    assert st is not None
    plan: list[tuple[R, int]] = []
    partial = q.n_started
    reqs, tokens = q.pick(pos), ns.tolist()
    keeps = st.keep_for(reqs, tokens)
    for req, n, rem, fresh, keep in zip(reqs, tokens, q.rem[pos].tolist(), q.fresh[pos].tolist(), keeps):
        st.keep = keep  # time left for the requests planned behind this one
        m = st.fit(req, n)
        if m <= 0 and keep:
            st.keep = 0.0
            continue  # nothing fits it beside the time kept for those behind: they still go
        if m <= 0 or (fresh and m < rem and n == rem and partial >= max_partial):
            break
        got = budget.grant(req, m)
        st.keep = 0.0
        if got == 0:
            break  # KV refusal (or no slot): no backfilling past it
        plan.append((req, got))
        partial += int(fresh and got < rem)
        if got < n and not keep:
            break
    st.keep = 0.0
    return plan


def _walk_one_by_one(q: Queue[R], order: Order, budget: PrefillBudget, max_partial: int,
                     fits: Callable[[R, int], bool | None] | None,
                     chunker: TimeBudgetChunker | None) -> list[tuple[R, int]]:
    """The walk asking ``fits`` and the chunker request by request, the order read a block at
    a time (``Order.head``: a step rarely goes past its first few dozen)."""
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
            if budget.step_time is not None:  # the colocated interleave's time left, at req's context
                if budget.step_time.spent():
                    return plan
                timed = budget.step_time.fit(req, n_want)
                if timed == 0 or (fresh and timed < rem and partial >= max_partial):
                    continue  # fits nothing here; a request over a shorter context may
                cap = n_want = timed
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
