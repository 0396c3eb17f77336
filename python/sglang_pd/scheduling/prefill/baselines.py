"""What the two baselines below share: one request-at-a-time walk over a chosen order.

Each grant goes through ``budget.grant`` (token budget, chunk cap, new-request slots, KV
admission). Why a grant came back empty decides what the walk does next, as in ``common.walk``:
an exhausted token budget or a KV refusal ends the step (no backfilling past a request the pool
cannot take now), a missing new-request slot only skips that fresh request.

Issue 28 (decision time, < 100 us at 1,000 waiting): that walk is a Python pass over every
request (1.1 ms for sglang-spf at 1,000). From the Scheduler's ``WaitingQueue`` the same plan
comes from its columns through the shared planner (``plan.plan_numbers``, whose rules are these
walks' with the options each baseline needs; ``walk.grant_plan`` asks KV admission in plan
order and stops at the first refusal, as the walk does): ``columns_of`` says when. A plain list
(tests, outside callers) and a step with a time allowance (``budget.step_time``: the colocated
interleave, which sizes each grant by the time left and which the shared planner handles by
rules of its own) keep the request-by-request walk, the reference the columns path is tested
against (test_baseline_prefill_policies.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from sglang_pd.scheduling.prefill.order import Order
from sglang_pd.scheduling.prefill.plan import plan_numbers
from sglang_pd.scheduling.prefill.queue_view import Queue
from sglang_pd.scheduling.prefill.walk import grant_plan
from sglang_pd.scheduling.types import PrefillBudget, R
from sglang_pd.scheduling.waiting import WaitingQueue


def started(req: R) -> bool:
    """Partly prefilled: it holds pages and a place in the engine (prefix hits are no start)."""
    return req.prefilled_len > req.cached_len


def grant_or_stop(req: R, budget: PrefillBudget, max_tokens: int | None = None) -> int | None:
    """Tokens granted to ``req``; 0 when only it was refused (no slot for a fresh request);
    None when the step must end (budget spent or KV refused)."""
    if budget.token_budget <= 0:
        return None
    n = budget.grant(req, max_tokens)
    if n:
        return n
    if not started(req) and budget.new_req_slots <= 0:
        return 0
    return None


def count_unfinished(reqs: Sequence[R]) -> int:
    return sum(1 for r in reqs if started(r) and r.prefill_remaining > 0)


def columns_of(waiting: Sequence[R], budget: PrefillBudget) -> Queue[R] | None:
    """The queue's columns when the plan may come from them (module docstring), else None."""
    if budget.step_time is None and isinstance(waiting, WaitingQueue):
        return Queue(waiting)
    return None


def grant_planned(q: Queue[R], order: Order, budget: PrefillBudget, max_partial: int,
                  max_tokens: int | None = None, passing: bool = True) -> list[tuple[R, int]]:
    """The walk over ``order`` from the numbers (``plan_numbers``), then granted."""
    pos, ns = plan_numbers(q, order, budget, max_partial, max_tokens=max_tokens, passing=passing)
    return grant_plan(q, budget, pos, ns)
