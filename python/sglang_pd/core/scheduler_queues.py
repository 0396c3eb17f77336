"""The scheduler's state: its queues (waiting, running, parked), PD parking and quarantine,
page release and the integrity check. ``core/scheduler.py`` tells the memory story; the
pool-pressure rules are in ``core/pool_pressure.py``, the step composition in ``scheduler.py``.
"""

from __future__ import annotations

from sglang_pd.core.page_allocator import Allocator
from sglang_pd.core.prefix_hits import PrefixHits
from sglang_pd.core.radix_cache import EvictingAllocator, RadixCache
from sglang_pd.core.scheduled_step import SchedulerReq
from sglang_pd.core.step import ReqState
from sglang_pd.scheduling.colocated import ColocatedInterleave
from sglang_pd.scheduling.config import PREFILL_ROLES, PolicyConfig
from sglang_pd.scheduling.types import DecodePolicy, PrefillPolicy
from sglang_pd.scheduling.slo import no_slo_ttft_s
from sglang_pd.scheduling.waiting import WaitingQueue


class SchedulerQueues:
    """The queues and the pages their requests hold; no scheduling decision is made here."""

    def __init__(self, allocator: Allocator, cfg: PolicyConfig, prefill_policy: PrefillPolicy,
                 decode_policy: DecodePolicy, whole_prompt_pages: bool = False,
                 prefix_cache: bool = False) -> None:
        # with a prefix cache (core/prefix_hits.py) the scheduler sees evictable cached pages as
        # free (EvictingAllocator); ``base_allocator`` is the allocator itself
        self.base_allocator = allocator
        self.hits: PrefixHits | None = None
        if prefix_cache:
            cache = RadixCache(cfg.page_size, allocator)
            self.hits = PrefixHits(cache, allocator)
            allocator = EvictingAllocator(allocator, cache)
        self.allocator = allocator
        self.cfg = cfg
        self.page_size = cfg.page_size
        self.prefill_policy = prefill_policy
        self.decode_policy = decode_policy
        # which class this prefill instance serves first (request_class.PREFILL_ROLES): our state,
        # handed to the policy in every budget; only a policy that serves roles lets it change
        self.prefill_role = cfg.prefill_role
        self.whole_prompt_pages = whole_prompt_pages
        self.max_running = cfg.max_running_requests
        self.chunk_size = cfg.chunked_prefill_size
        self.max_prefill_tokens = max(cfg.max_prefill_tokens, cfg.chunked_prefill_size)
        # arrival order, with the columns the prefill policies read (scheduling/waiting.py): every
        # change to a waiting request's lengths goes through here and is written back (refresh)
        self.waiting: WaitingQueue = WaitingQueue(chunk=cfg.chunked_prefill_size, no_slo_s=no_slo_ttft_s(cfg))
        self.running: list[SchedulerReq] = []  # admission order
        self.parked: dict[SchedulerReq, None] = {}  # held outside the queues (PD), insertion order
        self.quarantine: dict[object, list[int]] = {}  # pages a peer may still write, by key
        self.hold_deadline: float | None = None  # the prefill policy waits until then
        self.num_retractions = 0
        self.num_preempted_prefills = 0
        # colocated: prefill interleaves with running decodes by a time budget (colocated.py)
        lace = cfg.role == "colocated" and cfg.colocated_decode == "interleave"
        self.interleave = ColocatedInterleave(cfg) if lace else None
        self._decodes_waited = False  # the last step was prefill only while decodes ran
        self.num_preempted_prefill_tokens = 0  # prefill work thrown away (tokens), for the watchdog
        # progress rule 3 (core/progress.py): times each waiting request's partial prefill was
        # thrown away, and positions in the policy's most recent non-empty plan
        self.prefill_preemptions: dict[SchedulerReq, int] = {}
        self.last_rank: dict[SchedulerReq, int] = {}

    # ------------------------------------------------------------------ queues
    def set_prefill_role(self, role: str) -> None:
        """Switch the class this prefill instance serves first (the router's pool controller)."""
        if role not in PREFILL_ROLES:
            raise ValueError(f"prefill role must be one of {PREFILL_ROLES}, got {role!r}")
        if not self.prefill_policy.serves_roles:
            raise ValueError("the prefill role can only change on a server started with "
                             "--prefill-queues dual (or a --prefill-role)")
        self.prefill_role = role

    def add(self, req: SchedulerReq) -> None:
        req.state = ReqState.WAITING
        if self.hits is not None and not req.pages:
            self.hits.rematch(req)  # its prefix hit, looked up (locked only at admission)
        # arrival order; retracted requests go back in front of later arrivals
        self.waiting.add(req)

    def all_reqs(self) -> list[SchedulerReq]:
        return self.waiting + self.running + list(self.parked)

    def find(self, rid: str) -> SchedulerReq | None:
        return next((r for r in self.all_reqs() if r.rid == rid), None)

    def remove(self, req: SchedulerReq) -> None:
        """Take a request out of wherever it is and free its pages (finish, abort, error)."""
        if req in self.parked:
            del self.parked[req]
        elif req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.release(req)
        self.prefill_preemptions.pop(req, None)
        self.last_rank.pop(req, None)

    def release(self, req: SchedulerReq) -> None:
        """``req`` gives its pages up (its computed KV joins the prefix cache, if any)."""
        if self.hits is not None:
            self.hits.release(req)
        elif req.pages:
            self.allocator.free(req.pages)
            req.pages = []
        req.kv_len = 0

    def flush_cache(self) -> int:
        """Empty the prefix cache of everything no request uses; pages freed."""
        return self.hits.cache.flush() if self.hits is not None else 0

    # ------------------------------------------------------------------ PD parking
    def park(self, req: SchedulerReq, num_pages: int = 0) -> None:
        """Hold ``req`` outside the queues with its pages (allocating ``num_pages`` more): a PD
        prefill whose KV is being sent, a PD decode whose KV is arriving."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        if num_pages:
            req.pages.extend(self.allocator.alloc(num_pages))
        req.state = ReqState.PARKED
        self.parked[req] = None

    def unpark(self, req: SchedulerReq) -> None:
        """A parked request joins the waiting queue as it is (pages and KV kept; arrival order):
        a PD prefill request once its decode has registered its destination."""
        del self.parked[req]
        self.add(req)

    def start_running(self, req: SchedulerReq, kv_len: int) -> None:
        """A parked request whose KV (``kv_len`` tokens) has arrived joins the decode batch."""
        self.parked.pop(req, None)
        req.kv_len = kv_len
        req.state = ReqState.RUNNING
        self.running.append(req)

    def quarantine_pages(self, key: object, req: SchedulerReq) -> None:
        """Take ``req``'s pages away from it but keep them allocated until ``release_quarantine``:
        a failed or aborted transfer's peer may still be writing into them."""
        pages = self.hits.own_pages(req) if self.hits is not None else req.pages
        req.pages = []
        if pages:
            self.quarantine.setdefault(key, []).extend(pages)

    def release_quarantine(self, key: object) -> None:
        pages = self.quarantine.pop(key, None)
        if pages:
            self.allocator.free(pages)

    @property
    def pending_pages(self) -> int:
        """Pages that will come back without any scheduling decision (transfers end or time out)."""
        return sum(len(r.pages) for r in self.parked) + sum(map(len, self.quarantine.values()))

    # ------------------------------------------------------------------ state
    @property
    def has_work(self) -> bool:
        """Compute to do (parked requests wait on transfers, not on compute)."""
        return bool(self.waiting or self.running)

    def holding(self, now: float) -> bool:
        return self.hold_deadline is not None and now < self.hold_deadline

    @property
    def num_used_tokens(self) -> int:
        return self.allocator.num_used * self.page_size

    def check_integrity(self) -> None:
        self.allocator.check_integrity()
        self.waiting.check()
        hits = self.hits
        held = sum(len(r.pages) - (hits.shared(r) if hits else 0) for r in self.all_reqs())
        held += sum(map(len, self.quarantine.values()))
        cached = hits.cache.num_pages if hits is not None else 0
        if held + cached != self.base_allocator.num_used:
            raise RuntimeError(f"pages held by requests and quarantine ({held}) + cached ({cached}) "
                               f"!= pages in use ({self.base_allocator.num_used})")
