"""The progress rule: what the scheduling mechanism promises whatever a prefill policy ranks.

Policies rank; the mechanism (``core/scheduler.py: Scheduler``) makes sure the ranking cannot
stop the engine. Issue 28 found the failure this rule closes: a newer, higher-ranked request
took the pages an older partial prefill needed for its last chunk, the KV refusal ended the
step, and ``unblock`` threw away the newer partial, which the policy ranked first again: both
restarted for ever (12,313 partial prefills thrown away in 200 s of virtual time). The rule:

1. Reservation. A prefill starts (its first chunk is admitted) only when its whole prompt fits
   in the free pages beside what the started prefills still need to finish (their remainders,
   "reserved pages") and the decode headroom. A started prefill draws on its own reservation.
   So, as long as running decodes do not grow into the reserve, every started prefill can
   finish without taking a page from anyone: nothing is thrown away to make room for a request
   ranked above it. (A PD prefill server allocates the whole prompt at the first chunk: nothing
   to reserve.)
2. Refusals end a step only for the refused. After the policy's plan, if a KV refusal cut it
   short, or it is empty without a hold (a batch that could not be granted, e.g. dual queues
   with no free request slot), the started prefills it left out continue in arrival order
   within the step's token budget, each asking the pool for its own pages.
2b. Bounded backfill. If the refusal was of a fresh request (one rule 1 kept out), fresh
   requests the plan left out then go on too, oldest first, within the budget and request slots
   left, each asking the pool under rule 1 (a refusal skips only it): a short prompt ranked
   behind a long one that does not fit yet need not wait for it (issue 28's Medha head-of-line
   wait). Only while every refused fresh request is within its TTFT target (its SLO, else the
   no-SLO far target, ``scheduling/slo.py``): once one is overdue nothing fresh goes past it, the
   pages freed go to it as before, so its wait is bounded by about its target plus the time the
   requests running then take to free its pages (and the policy still ranking it first). Not
   when the policy holds (``budget.hold_until``: it chose to wait) nor with a policy that serves
   roles (the dual queues: each step is all-short or all-long, which a backfill could break).
   PD prefill servers (whole-prompt pages) follow the same rule.
3. Bounded, ranked preemption. Only when decodes grew into the reserve (pages are short and
   nothing can run) is a partial prefill thrown away: the one the policy ranked last (its most
   recent plan: partials it granted rank above those it left out, newest last), and no request
   more than ``MAX_PREFILL_PREEMPTIONS`` times; a partial that already holds every page of its
   prompt (PD prefill) never, since it needs nothing. Past the bound decodes are retracted
   instead (the existing fallback) or the engine waits for running requests to finish.
Derived bound (property-tested in test/unit/test_progress_properties.py): thrown-away prefill
work is at most ``MAX_PREFILL_PREEMPTIONS`` prompts per request, and with no running decode the
reserve always fits (decodes that finish or are retracted give back every page they grew), so
an idle engine with queued work always schedules something or aborts a request with a reason.
With the prefix cache on (``core/radix_cache.py``), a preempted partial's filled pages join the
tree, so its restart mostly hits them instead of recomputing; "thrown away" above is the bound
without the cache (or after those pages are evicted), which the property tests check.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol, TypeVar

MAX_PREFILL_PREEMPTIONS = 2  # times one request's partial prefill may be thrown away


class _Partial(Protocol):
    pages: list[int]

    @property
    def prefill_target(self) -> int: ...


def pages_for(tokens: int, page_size: int) -> int:
    return -(-tokens // page_size)


def remaining_pages(req: _Partial, page_size: int) -> int:
    """Pages a request still needs before its prefill is done."""
    return max(pages_for(req.prefill_target, page_size) - len(req.pages), 0)


def reserved_pages(started: Iterable[_Partial], page_size: int) -> int:
    """Rule 1: pages the started prefills still need, kept from fresh admissions."""
    return sum(remaining_pages(r, page_size) for r in started)


_P = TypeVar("_P", bound=_Partial)


def pick_victim(partials: Sequence[_P], rank: Mapping[_P, int], preemptions: Mapping[_P, int],
                page_size: int, bounded: bool = True) -> _P | None:
    """Rule 3: the partial prefill to throw away, or None. ``partials`` in arrival order;
    ``rank``: positions in the policy's most recent plan; ``preemptions``: times each request
    was thrown away so far. Partials holding all their pages are never chosen; with
    ``bounded``, neither are those already thrown away ``MAX_PREFILL_PREEMPTIONS`` times."""
    best: _P | None = None
    best_key: tuple[int, int] | None = None
    unranked = len(rank) + 1
    for i, r in enumerate(partials):
        if remaining_pages(r, page_size) == 0:
            continue  # needs nothing: it can always go on (a PD prefill's whole-prompt pages)
        if bounded and preemptions.get(r, 0) >= MAX_PREFILL_PREEMPTIONS:
            continue
        key = (rank.get(r, unranked), i)  # the policy's last plan first, then arrival
        if best_key is None or key > best_key:
            best, best_key = r, key
    return best
