"""What a scheduling policy sees and returns (DESIGN.md section 3).

Policies are pure: no torch, no sockets, time passed in. The engine and the simulator hand
them objects satisfying ``SchedReq`` and a ``PrefillBudget`` whose KV check goes through the
small ``KVAdmission`` interface (a page allocator in the engine, a counter in the simulator).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol, TypeVar, runtime_checkable

from sglang_pd.core.step import StepProfile
from sglang_pd.scheduling.config import DEFAULT_SHORT_PREFILL_THRESHOLD, PolicyConfig


@runtime_checkable
class SchedReq(Protocol):
    """Read-only view of a request. All lengths in tokens, times in seconds."""

    rid: str
    arrival: float

    @property
    def prompt_len(self) -> int: ...
    @property
    def cached_len(self) -> int: ...  # prefix-cache hits (0 until the prefix cache exists)
    @property
    def prefilled_len(self) -> int: ...  # tokens whose KV is in the pool
    @property
    def prefill_remaining(self) -> int: ...  # tokens still to prefill (0 when decoding)
    @property
    def n_generated(self) -> int: ...
    @property
    def seq_len(self) -> int: ...
    @property
    def first_token_time(self) -> float | None: ...
    @property
    def slo_ttft_s(self) -> float | None: ...
    @property
    def slo_tpot_s(self) -> float | None: ...
    @property
    def predicted_output_len(self) -> int | None: ...


R = TypeVar("R", bound=SchedReq)


class KVAdmission(Protocol):
    """Tokens-level view of free KV memory for admission decisions. It may also have
    ``admit_run(reqs, new_tokens) -> int``: ``can_admit`` then ``admit`` for each in order up to
    the first refusal, returning how many were admitted (one call for a whole plan; without
    it the budget makes the two calls per request)."""

    def can_admit(self, req: SchedReq, new_tokens: int) -> bool: ...
    def admit(self, req: SchedReq, new_tokens: int) -> None: ...


class StepTime(Protocol):
    """A step's prefill time allowance, spent request by request (the colocated interleave's,
    ``scheduling/colocated.py``): ``fit`` sizes a request's chunk by the time left at that
    request's own context (a chunk over a long context costs more per token), ``spend`` books
    a grant. Short prompts beside a long partly prefilled one are not held to its chunk size."""

    def fit(self, req: SchedReq, want: int) -> int: ...  # most of ``want`` tokens that fit (0: none)
    def spend(self, req: SchedReq, n: int) -> None: ...
    def spent(self) -> bool: ...  # nothing more fits this step (no request can take a token)
    keep: float  # time ``fit`` leaves for the requests planned behind the one it sizes
    def keep_for(self, reqs: Sequence[SchedReq], ns: Sequence[int]) -> list[float]: ...  # keep, per request


@dataclass
class PrefillBudget:
    """One step's prefill allowance. ``grant`` is the only way to spend it."""

    token_budget: int  # new tokens this step may still take (all requests together)
    chunk_size: int  # most new tokens one request may take in one step
    new_req_slots: int  # requests not yet started that may still start
    kv: KVAdmission
    granted: list[tuple[SchedReq, int]] = field(default_factory=list)
    # set by a policy that chooses to wait (a batching window): with an empty plan the engine
    # sleeps until this time (or the next arrival) instead of treating the empty plan as stuck
    hold_deadline: float | None = None
    # KV lengths of the decodes that ride along this step (mixed steps, --enable-mixed-chunk):
    # time-budgeted chunking (Medha) counts their time first
    rider_contexts: Sequence[int] = ()
    # this instance's prefill role (``Scheduler.prefill_role``, request_class.PREFILL_ROLES):
    # which class it serves first; scheduler state, read by policies that honour roles
    role: str = "both"
    # colocated servers with running decodes: the step's prefill time allowance (``StepTime``);
    # every grant is sized by it at the request's own context. None: tokens only
    step_time: StepTime | None = None

    def hold_until(self, t: float) -> None:
        """Ask the engine not to run prefill before ``t`` (seconds, the ``now`` clock) unless
        something changes; several holds keep the earliest."""
        self.hold_deadline = t if self.hold_deadline is None else min(self.hold_deadline, t)

    def grant(self, req: SchedReq, max_tokens: int | None = None) -> int:
        """Give ``req`` as many tokens as the budget allows (0 = none); record the grant."""
        want = req.prefill_remaining if max_tokens is None else min(max_tokens, req.prefill_remaining)
        n = min(want, self.token_budget, self.chunk_size)
        if n > 0 and self.step_time is not None:
            n = self.step_time.fit(req, n)
        starting = req.prefilled_len <= req.cached_len  # prefix hits are not a start
        if n <= 0 or (starting and self.new_req_slots <= 0) or not self.kv.can_admit(req, n):
            return 0
        self.kv.admit(req, n)
        if self.step_time is not None:
            self.step_time.spend(req, n)
        self.token_budget -= n
        self.new_req_slots -= int(starting)
        self.granted.append((req, n))
        return n

    def grant_run(self, reqs: Sequence[SchedReq], ns: list[int], starting: Sequence[bool]) -> int:
        """``grant`` of ``ns[j]`` tokens to ``reqs[j]`` for j in order, where the caller has
        already worked out from the queue's numbers what ``grant`` would give each one, in turn
        (``ns[j] > 0`` within the token budget and chunk cap left at its turn, a slot for each
        starting one: ``starting[j]``). Only KV admission is left to ask, request by request
        as ``grant`` does; stops at the first refusal. Returns how many were granted: the same
        outcome as those calls to ``grant`` without re-reading each request's lengths
        (issue 20: decision time). With a ``step_time`` each request is sized by it as ``grant``
        does: the first one cut by it is granted what fits, ``ns`` lowered in place to that, and
        the run ends there (the step's time is spent)."""
        if self.step_time is not None:
            return self._grant_run_timed(reqs, ns)
        admit_run = getattr(self.kv, "admit_run", None)
        if admit_run is not None:
            k: int = admit_run(reqs, ns)
        else:
            can, admit = self.kv.can_admit, self.kv.admit
            k = 0
            for r, n in zip(reqs, ns):
                if not can(r, n):
                    break
                admit(r, n)
                k += 1
        if k:
            if k < len(ns):  # (all admitted, the usual case: no copies)
                reqs, ns, starting = reqs[:k], ns[:k], starting[:k]
            self.token_budget -= sum(ns)
            self.new_req_slots -= starting.count(True) if isinstance(starting, list) else sum(starting)
            self.granted.extend(zip(reqs, ns))
        return k

    def _grant_run_timed(self, reqs: Sequence[SchedReq], ns: list[int]) -> int:
        st = self.step_time
        assert st is not None
        keeps, k = st.keep_for(reqs, ns), 0
        for r, n, keep in zip(reqs, list(ns), keeps):
            st.keep = keep  # time left for the requests planned behind r (StepTime.keep_for)
            got = self.grant(r, n)  # sized by the time left (never more than n: n fits the budget)
            st.keep = 0.0
            if got == 0:
                break
            ns[k] = got
            k += 1
            if got < n and not keep:
                break
        return k


class _Policy(ABC):
    name: str = ""

    def __init__(self, cfg: PolicyConfig | None = None) -> None:
        self.cfg = cfg if cfg is not None else PolicyConfig()

    def observe(self, step: StepProfile, elapsed_s: float, now: float) -> None:
        """Called after every engine step with what it held and its wall time (cost models
        learn here). Default: nothing."""

    def use_cost_model(self, model: Any) -> None:
        """Predict with ``model`` from now on (the simulator's exact-cost reference), in this
        policy and every part it wraps. Default: a policy without a cost model ignores it."""


class PrefillPolicy(_Policy):
    """Chooses which waiting requests prefill this step, and how many tokens each (a chunk plan)."""

    # whether ``schedule`` honours ``budget.role`` (the dual queues): only then may the role change
    serves_roles: ClassVar[bool] = False

    def class_threshold(self) -> int:
        """The short/long boundary in new tokens this policy classifies by now (request_class.py):
        the configured one; policies with their own (fitted) boundary override this."""
        return self.cfg.short_prefill_threshold or DEFAULT_SHORT_PREFILL_THRESHOLD

    @abstractmethod
    def schedule(self, waiting: Sequence[R], now: float, budget: PrefillBudget) -> list[tuple[R, int]]:
        """Return [(req, n_tokens)] spent through ``budget.grant``; ``waiting`` is in arrival order."""


class DecodePolicy(_Policy):
    """Chooses which running requests take a decode step now."""

    @abstractmethod
    def schedule(self, running: Sequence[R], now: float) -> list[R]:
        """Return this step's decode batch (a subset of ``running``)."""
