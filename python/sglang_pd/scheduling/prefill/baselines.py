"""What the two baselines below share: one request-at-a-time walk over a chosen order.

Each grant goes through ``budget.grant`` (token budget, chunk cap, new-request slots, KV
admission). Why a grant came back empty decides what the walk does next, as in ``common.walk``:
an exhausted token budget or a KV refusal ends the step (no backfilling past a request the pool
cannot take now), a missing new-request slot only skips that fresh request.
"""

from __future__ import annotations

from collections.abc import Sequence

from sglang_pd.scheduling.types import PrefillBudget, R


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
