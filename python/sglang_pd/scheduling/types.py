"""What a scheduling policy sees and returns (DESIGN.md section 3).

Policies are pure: no torch, no sockets, time passed in. The engine and the simulator hand
them objects satisfying ``SchedReq`` and a ``PrefillBudget`` whose KV check goes through the
small ``KVAdmission`` interface (a page allocator in the engine, a counter in the simulator).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Protocol, Sequence, TypeVar, runtime_checkable


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
    """Tokens-level view of free KV memory for admission decisions."""

    def can_admit(self, req: SchedReq, new_tokens: int) -> bool: ...
    def admit(self, req: SchedReq, new_tokens: int) -> None: ...


@dataclass
class PrefillBudget:
    """One step's prefill allowance. ``grant`` is the only way to spend it."""

    token_budget: int  # new tokens this step may still take (all requests together)
    chunk_size: int  # most new tokens one request may take in one step
    new_req_slots: int  # requests not yet started that may still start
    kv: KVAdmission
    granted: list[tuple[SchedReq, int]] = field(default_factory=list)

    def grant(self, req: SchedReq, max_tokens: int | None = None) -> int:
        """Give ``req`` as many tokens as the budget allows (0 = none); record the grant."""
        want = req.prefill_remaining if max_tokens is None else min(max_tokens, req.prefill_remaining)
        n = min(want, self.token_budget, self.chunk_size)
        starting = req.prefilled_len == 0
        if n <= 0 or (starting and self.new_req_slots <= 0) or not self.kv.can_admit(req, n):
            return 0
        self.kv.admit(req, n)
        self.token_budget -= n
        self.new_req_slots -= int(starting)
        self.granted.append((req, n))
        return n


class PrefillPolicy(ABC):
    """Chooses which waiting requests prefill this step, and how many tokens each (a chunk plan)."""

    name: str = ""

    @abstractmethod
    def schedule(self, waiting: Sequence[R], now: float, budget: PrefillBudget) -> list[tuple[R, int]]:
        """Return [(req, n_tokens)] spent through ``budget.grant``; ``waiting`` is in arrival order."""


class DecodePolicy(ABC):
    """Chooses which running requests take a decode step now."""

    name: str = ""

    @abstractmethod
    def schedule(self, running: Sequence[R], now: float) -> list[R]:
        """Return this step's decode batch (a subset of ``running``)."""
