"""Decode-side prefix reuse with delta KV transfer (issue 30; SGLang keeps a decode-side radix
cache for the same reason, #19746).

A decode server started with ``--disaggregation-decode-enable-radix-cache`` keeps finished
requests' KV (prompt and output) in its own radix cache (core/radix_cache.py). When a follow-up
request reaches the head of its pre-allocation queue, its prompt is matched against that cache:
the hit's pages are locked and become the request's first pages, only the rest are allocated,
and the Register sent to the prefill names the hit (``Register.prefix_len``, tokens, whole
pages) beside ``dst_pages`` (the rest). The prefill computes what it must (its own cache may
hit too) and writes only src pages ``[prefix_len / page_size, ...)`` into ``dst_pages``: the
notification slices stay relative to ``dst_pages``, so the receiver's coverage check is the
same as without reuse.

Why a field of ours in the decode -> prefill Register, not a request-body field for routers:
the registration never passes through a router (SGLang's or ours); routers only forward
``bootstrap_host/port/room``. Decode alone knows what its cache holds when it reserves pages,
so it alone can say it. Compatibility: a prefill without the field (msgspec ignores unknown
fields) sees ``len(dst_pages)`` short of its prompt's pages and refuses the room (503), never
writes at the wrong offset; a decode without it sends 0 and gets every page, as before.

The hit is capped below the prompt's last token (as on prefill, core/prefix_hits.py), so at
least one page always travels and the first token rides with it (messages.kv_notif).
Pages: the hit's pages are shared with the tree (locked), never registered and never
quarantined (``PrefixHits.own_pages``): no peer ever writes into them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sglang_pd.core.pd_rules import pages_for
from sglang_pd.core.radix_cache import Match

if TYPE_CHECKING:
    from sglang_pd.core.scheduler import Scheduler
    from sglang_pd.engine.request import Req


def reusable_pages(prompt_len: int, page_size: int) -> int:
    """The most leading pages of a prompt decode may reuse: every whole page before the page
    holding the prompt's last token (that one always travels, with the first token)."""
    return max(prompt_len - 1, 0) // page_size


def check_prefix_len(prefix_len: int, page_size: int) -> str | None:
    """Why a Register's ``prefix_len`` is malformed, or None (the page count is checked against
    the prompt once both sides are known: KVSenderState.check_num_pages)."""
    if prefix_len < 0 or prefix_len % page_size:
        return (f"prefix_len {prefix_len} must be a non-negative multiple of page_size "
                f"{page_size} (decode reuses whole pages only)")
    return None


@dataclass
class Reservation:
    """What the head of decode's queue needs: ``hit`` pages from the cache (``match`` to lock)
    and ``new`` pages to allocate; ``need`` counts the free pages it takes (locking a hit takes
    its evictable pages out of the free count)."""

    match: Match | None
    hit: int
    new: int

    @property
    def need(self) -> int:
        return self.new + (self.match.unlocked if self.match is not None else 0)


def plan(sched: Scheduler, req: Req) -> Reservation:
    """The decode-side hit of ``req``'s prompt (none without a cache). A look, not a lock."""
    ps = sched.page_size
    total = pages_for(req.prompt_len, ps)
    hits = sched.hits
    if hits is None:
        return Reservation(None, 0, total)
    n = reusable_pages(req.prompt_len, ps)
    m = hits.cache.match(req.token_ids(0, n * ps), n)
    return Reservation(m, len(m.pages), total - len(m.pages))


def reserve(sched: Scheduler, req: Req, res: Reservation) -> None:
    """Lock the hit (it becomes the request's first pages), then allocate and park the rest:
    in this order, so the allocation's eviction cannot take the hit."""
    hits = sched.hits
    if hits is not None and res.match is not None:
        req.kv_len = req.cached_len = res.hit * sched.page_size  # hits.start counts it
        hits.start(req, res.match if res.hit else None)
    sched.park(req, num_pages=res.new)


@dataclass
class ReuseStats:
    """Decode's side of the delta transfer, for /get_load and /metrics."""

    reused_tokens: int = 0  # prompt tokens whose KV came from this decode's cache
    received_pages: int = 0  # pages registered for prefill to write (prompt pages - reused)

    def count(self, res: Reservation, page_size: int) -> None:
        self.reused_tokens += res.hit * page_size
        self.received_pages += res.new

    def as_dict(self) -> dict[str, int]:
        return {"num_decode_reused_tokens_total": self.reused_tokens,
                "num_decode_registered_pages_total": self.received_pages}
