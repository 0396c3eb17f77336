"""One simulated server: the engine's own ``Scheduler`` with registry policies over a
``CountingAllocator``, stepped by a ground-truth ``StepCost`` (sim/profiles.py).

The engine's step (engine_core.py) is mirrored here without a model: ``schedule`` -> the step
takes ``StepCost.step_s`` -> ``after_extend`` / ``after_decode`` -> tokens counted ->
``observe(profile, elapsed)``; nothing scheduled with work queued -> ``unblock``. PD rules come
from core/pd_rules.py, as in engine/pd.py: a PD request joins a prefill instance's waiting
queue only once its decode instance has pre-allocated its pages (until then it is held in
``bootstrapping``), prefill allocates whole-prompt pages and parks a request after its first
token until its KV transfer ends; decode pre-allocates in FIFO order.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from sglang_pd.core.load_signals import LoadTracker
from sglang_pd.core.page_allocator import CountingAllocator
from sglang_pd.core.pd_rules import decode_admits, pages_for, prefill_schedulable, whole_prompt_pages
from sglang_pd.core.scheduled_step import ScheduledStep
from sglang_pd.core.scheduler import Scheduler
from sglang_pd.core.step import ForwardMode, StepProfile
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.registry import create_decode_policy, create_prefill_policy
from sglang_pd.sim.prefix_cache import PrefixCache
from sglang_pd.sim.profiles import ExactDecode, StepCost
from sglang_pd.sim.request import SimReq


@dataclass(eq=False)
class Track:
    """One request across the cluster: what the results are made of."""

    index: int
    arrival: float
    prompt_len: int
    output_len: int
    hash_ids: tuple[int, ...] = ()
    cached_len: int = 0
    source: str = ""
    slo_ttft_s: float | None = None
    request_class: str = ""  # short | long by new prompt tokens (set when the cluster classifies)
    p_inst: int = -1  # prefill (or colocated) instance
    d_inst: int = -1  # decode instance (PD)
    prefill_started: float | None = None  # the first step that ran it (engine/request_log.py's)
    first_chunk_done: float | None = None
    prefill_done: float | None = None
    decode_ready: float | None = None
    last_chunk: int = 0  # tokens of the last prefill chunk (streamed transfer tail)
    xfer_started: bool = False
    reused_len: int = 0  # decode-side reuse: leading prompt tokens the decode already held
    transfer_tokens: int = 0  # prompt tokens whose KV crossed the link (prompt - reused_len)
    first_token: float | None = None
    finish: float | None = None
    error: str = ""
    preq: ClusterReq | None = None
    dreq: ClusterReq | None = None


@dataclass(eq=False)
class ClusterReq(SimReq):
    """A SimReq whose prefix-cache hit (``kv_len`` starts at it) stays out of the policies'
    view until the request holds pages. The policies read ``prefilled_len > 0`` as "started,
    holding pages" (fresh-request slots, the partial-prefill bound) and ``prefilled_len``
    as including the hit (work over cached context): with a hit both cannot hold at once.
    Until the policies test ``prefilled_len > cached_len`` for "started" (reported to the
    lead), a fresh request with a hit shows ``prefilled_len`` 0 and ``cached_len`` 0 (its new
    tokens over no context: work estimates miss the cached context's read cost), and from its
    first grant on, the true values."""

    track: Track = None  # type: ignore[assignment]  # always given: the cluster makes it with its Track

    @property  # type: ignore[misc]
    def cached_len(self) -> int:
        return self._hit if self.pages else 0

    @cached_len.setter
    def cached_len(self, value: int) -> None:
        self._hit = value

    @property
    def prefilled_len(self) -> int:
        return self.kv_len if self.pages else max(self.kv_len - self._hit, 0)


@dataclass(eq=False)
class Instance:
    index: int
    role: str  # colocated | prefill | decode
    cfg: PolicyConfig
    cost: StepCost
    prefill_policy: str
    decode_policy: str
    exact: bool = False
    prefix_cache: PrefixCache | None = None
    reserved_pages: int = 0  # decode: --num-reserved-decode-tokens in pages
    sched: Scheduler = field(init=False)
    prealloc: deque = field(default_factory=deque)  # decode: parked, waiting for pages
    # prefill: PD requests whose decode has not pre-allocated yet, in arrival order (dict as an
    # ordered set); outside the Scheduler, so no policy sees them (engine: parked, no pages)
    bootstrapping: dict = field(default_factory=dict)
    transferring: int = 0  # decode: pages held, KV on its way
    step: ScheduledStep | None = None
    step_profile: StepProfile | None = None
    step_s: float = 0.0
    step_started: float = 0.0
    busy_s: float = 0.0
    queued_tokens: int = 0  # prefill tokens routed here and not yet computed (router's view)
    in_flight: int = 0  # requests routed here and not yet done with this instance
    wake_at: float | None = None  # a pending hold deadline wake-up
    # the server's per-class TTFT SLO deviation and busy fraction (/get_load), for the pool
    # controller: the engine's own bookkeeping, fed with simulated steps and first tokens
    loads: LoadTracker = field(default_factory=LoadTracker)
    num_steps: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0

    def __post_init__(self) -> None:
        pages = self.cost.kv_capacity_tokens // self.cfg.page_size + 1  # + page 0 (dummy)
        pp = create_prefill_policy(self.prefill_policy, self.cfg)
        dp = create_decode_policy(self.decode_policy, self.cfg)
        if self.exact:  # the no-prediction-error reference: both policies read the truth
            pp.use_cost_model(self.cost.exact_model())
            dp.use_cost_model(ExactDecode(self.cost.decode))
        self.sched = Scheduler(CountingAllocator(pages), self.cfg, pp, dp,
                               whole_prompt_pages=whole_prompt_pages(self.role))

    @property
    def name(self) -> str:
        return f"{self.role[0]}{self.index}"

    @property
    def prefill_role(self) -> str:
        """The class this instance serves now: its scheduler's (switchable) role."""
        return self.sched.prefill_role

    def set_prefill_role(self, role: str) -> None:
        """As ``EngineCore.set_prefill_role`` (the server's /set_prefill_role)."""
        try:
            self.sched.set_prefill_role(role)
        except ValueError as e:
            raise ValueError(f"instance {self.name}: {e}") from None

    def record_first_token(self, req: ClusterReq, now: float) -> None:
        """A first token computed here: its (TTFT - SLO) / SLO into its class's deviation."""
        self.loads.first_token(req, now, self.sched.prefill_policy.class_threshold())

    @property
    def busy(self) -> bool:
        return self.step is not None

    def token_usage(self) -> float:
        a = self.sched.allocator
        return a.num_used / a.num_usable if a.num_usable else 0.0

    # ------------------------------------------------------------------ admission
    def refuses(self, prompt_len: int) -> str | None:
        """As ``EngineCore._validate``: a prompt the KV pool cannot hold is refused at once."""
        pool = self.sched.allocator.num_usable * self.cfg.page_size
        if prompt_len + 1 > pool:
            return f"the prompt has {prompt_len} tokens; the KV pool holds only {pool}"
        return None

    def add(self, req: ClusterReq) -> None:
        """A request routed here to compute (colocated / prefill, or a decode-side retraction)."""
        self.sched.add(req)

    def add_pd(self, req: ClusterReq, decode_reserved: bool) -> None:
        """Prefill: a PD request routed here waits, outside the queues and without pages, until
        its decode instance has pre-allocated its pages (``PrefillSide.admit``)."""
        if prefill_schedulable(decode_reserved):
            self.sched.add(req)
        else:
            self.bootstrapping[req] = None

    def decode_reserved(self, req: ClusterReq) -> bool:
        """Prefill: ``req``'s decode pre-allocated its pages (its Register arrived): it joins the
        waiting queue (``PrefillSide._registered``). False if it was not waiting for that."""
        if req not in self.bootstrapping:
            return False
        del self.bootstrapping[req]
        self.sched.add(req)  # by arrival: its deadline still counts from the router's arrival
        return True

    def park_for_decode(self, req: ClusterReq) -> None:
        """Decode: the request waits, parked without pages, for pre-allocation (FIFO)."""
        self.sched.park(req)
        self.prealloc.append(req)

    def preallocate(self) -> list[ClusterReq]:
        """Decode: give queue heads their prompt's pages while the PD rule admits them."""
        out = []
        sched, alloc = self.sched, self.sched.allocator
        ps = self.cfg.page_size
        max_running = self.cfg.max_running_requests
        while self.prealloc:
            req = self.prealloc[0]
            need = pages_for(req.prompt_len, ps)
            if not decode_admits(len(sched.running), self.transferring, max_running, need,
                                 self.reserved_pages, alloc.num_free):
                break
            self.prealloc.popleft()
            sched.park(req, num_pages=need)  # as DecodeSide._preallocate
            self.transferring += 1
            out.append(req)
        return out

    # ------------------------------------------------------------------ steps
    def start_step(self, now: float) -> tuple[float | None, list[tuple[ClusterReq, str]]]:
        """Schedule one step; returns (its end time or None, requests that can never run)."""
        sched = self.sched
        aborted: list[tuple[ClusterReq, str]] = []
        for _ in range(64):  # unblock frees one partial prefill per call, as the engine's loop
            step = sched.schedule(now)
            if step is not None:
                break
            if not sched.has_work:
                return None, aborted
            preempted = sched.num_preempted_prefills
            never = sched.unblock(now)
            aborted += never  # type: ignore[arg-type]
            for r, _ in never:
                sched.remove(r)
            if not never and sched.num_preempted_prefills == preempted:
                return None, aborted  # holding, or waiting on parked pages / the decode policy
        else:
            return None, aborted
        self.step = step
        self.step_profile = step.profile()
        for r, _ in step.prefill_plan:
            t = r.track  # type: ignore[attr-defined]
            if t.prefill_started is None:
                t.prefill_started = now
        dur = self.cost.step_s(step)
        self.step_s = dur
        self.step_started = now
        return now + dur, aborted

    def finish_step(self, now: float) -> tuple[list[ClusterReq], list[ClusterReq]]:
        """Advance the finished step. Returns (requests whose prefill completed and that got
        their first token here, requests whose last token this step produced)."""
        step, sched = self.step, self.sched
        assert step is not None
        self.step = None
        self.num_steps += 1
        self.busy_s += self.step_s
        self.loads.step(now, self.step_s)
        first: list[ClusterReq] = []
        decoded: list[ClusterReq]
        if step.mode is ForwardMode.DECODE:
            decoded = step.reqs  # type: ignore[assignment]
            sched.after_decode(decoded)
        else:
            pre = step.prefill_plan
            for r, n in pre:
                self.queued_tokens -= n
                self.prefill_tokens += n
                t = r.track  # type: ignore[attr-defined]
                if t.first_chunk_done is None:
                    t.first_chunk_done = now
                t.last_chunk = n
            first = sched.after_extend(pre)  # type: ignore[assignment]
            decoded = step.decode_reqs  # type: ignore[assignment]
            sched.after_decode(decoded)
        done = []
        for r in decoded:  # the hot loop of a run: one pass, no property calls
            n = r.n_generated + 1
            r.n_generated = n
            if n >= r.output_len:
                done.append(r)
        self.decode_tokens += len(decoded)
        for r in first:
            r.n_generated = 1
        prof = self.step_profile
        assert prof is not None
        prof.total_s = prof.forward_s = self.step_s
        sched.observe(prof, self.step_s, now)
        return first, done
