"""The routing-policy interface shared by the router and the simulator (DESIGN.md §5).

Pure: no torch, no I/O, no clock. The caller passes ``now`` and a snapshot of each worker
(``WorkerView``); a policy answers with the index of the worker it picks. The router builds the
views from its in-flight counters and periodic ``/get_load`` polls; the simulator builds them from
its simulated instances. Adding a policy is one file plus one line in ``policies/__init__.py``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from collections.abc import Hashable, Sequence

from ..request_class import SHORT_PREFILL_THRESHOLD, classify

WORKER_KINDS = ("prefill", "decode")


@dataclass
class RouteRequest:
    prompt_len: int  # new prompt tokens (exact with a tokenizer, else estimated)
    cached_len: int = 0
    slo_ttft_s: float | None = None
    request_class: str = ""  # "short" | "long" once classified ("" = unclassified)
    # the prompt in blocks (cache_aware.prefix_blocks; Mooncake hash_ids in the simulator): what
    # the cache-aware policy matches against what it routed before; () = unknown
    prefix_blocks: Sequence[Hashable] = ()


@dataclass
class WorkerView:
    url: str
    kind: str  # "prefill" | "decode"
    prefill_role: str = "both"  # "short" | "long" | "both" (prefill workers)
    healthy: bool = True
    in_flight: int = 0  # requests this router has outstanding there
    queued_prefill_tokens: int = 0  # last polled /get_load value plus tokens routed there since
    num_running_reqs: int = 0
    token_usage: float = 0.0  # KV pool fraction in use
    prefill_tokens_per_s: float = 0.0  # learned throughput (0 = unknown) for predicted queue time


@dataclass
class RoutingConfig:
    # Prompts of at most this many tokens are "short" (PLA-Serve's boundary L_m, §3.2). Servers
    # report theirs in /get_server_info or /get_load; the router adopts it so both sides agree.
    short_prefill_threshold: int = SHORT_PREFILL_THRESHOLD
    # Prefill throughput assumed for a worker whose own is not yet learned (tokens/s); only the
    # ratio between workers matters for least predicted queue time, so a rough prior is enough.
    default_prefill_tokens_per_s: float = 10000.0
    # cache_aware on a decode list: a follow-up goes to the decode holding most of its history
    # (decode-side reuse transfers only the rest) while that decode holds at most this many
    # requests more than the least loaded one; past it, balance wins (policies/cache_aware.py)
    decode_reuse_slack: int = 2

    def __post_init__(self) -> None:
        if isinstance(self.short_prefill_threshold, bool) or not isinstance(
            self.short_prefill_threshold, int
        ):
            raise ValueError(
                f"short_prefill_threshold must be an int, got {self.short_prefill_threshold!r}"
            )
        if self.short_prefill_threshold < 1:
            raise ValueError(
                f"short_prefill_threshold must be >= 1 token, got {self.short_prefill_threshold}"
            )
        if isinstance(self.decode_reuse_slack, bool) or not isinstance(self.decode_reuse_slack, int) \
                or self.decode_reuse_slack < 0:
            raise ValueError(f"decode_reuse_slack must be an int >= 0, got {self.decode_reuse_slack!r}")
        if not self.default_prefill_tokens_per_s > 0:  # also refuses NaN
            raise ValueError(
                "default_prefill_tokens_per_s must be > 0, "
                f"got {self.default_prefill_tokens_per_s}"
            )


def request_class_of(req: RouteRequest, cfg: RoutingConfig) -> str:
    """The request's class: the one already set on it, else by its prompt length."""
    if req.request_class:
        return req.request_class
    return classify(req.prompt_len, cfg.short_prefill_threshold)


def eligible_indices(workers: Sequence[WorkerView]) -> list[int]:
    """Indices of the healthy workers (the only ones any policy may pick)."""
    return [i for i, w in enumerate(workers) if w.healthy]


class RoutingPolicy(ABC):
    """Picks one worker of a list (all of one kind: the router asks once for prefill, once for
    decode). Stateful policies (round_robin's cursor, random's generator) keep their state here,
    so one instance serves one list of workers."""

    name: str = ""
    # the router fills RouteRequest.prefix_blocks (hashing the prompt) only for a policy that
    # reads them (cache_aware), so the others pay nothing
    reads_prefix_blocks: bool = False
    # prompt tokens the last ``select`` expects already cached on the worker it picked (set by
    # cache_aware): the router nets them out of the queued prefill work it charges that worker
    last_pick_hit: int = 0

    def __init__(self, cfg: RoutingConfig | None = None, seed: int | None = None) -> None:
        self.cfg = cfg if cfg is not None else RoutingConfig()
        self.seed = seed

    @abstractmethod
    def select(self, req: RouteRequest, workers: Sequence[WorkerView], now: float) -> int | None:
        """Index into ``workers`` of the chosen one; None when no worker is eligible."""


def predicted_queue_s(worker: WorkerView, cfg: RoutingConfig, new_tokens: int = 0) -> float:
    """Seconds until ``new_tokens`` more prompt tokens would be prefilled on ``worker``: its
    queued prefill tokens plus these, over its learned (else the assumed) throughput."""
    rate = worker.prefill_tokens_per_s or cfg.default_prefill_tokens_per_s
    return (worker.queued_prefill_tokens + new_tokens) / rate


def decode_held(worker: WorkerView) -> int:
    """Requests a decode worker holds: running there plus routed by us and not yet answered."""
    return worker.in_flight + worker.num_running_reqs


def load_key(worker: WorkerView, cfg: RoutingConfig) -> tuple[float, float, float]:
    """Smaller is less loaded. Prefill: predicted queue time first (tokens, not request counts,
    are what a prefill worker spends its time on). Decode: requests held, then KV usage."""
    if worker.kind == "prefill":
        return (predicted_queue_s(worker, cfg), float(worker.in_flight), worker.token_usage)
    return (float(decode_held(worker)), worker.token_usage, float(worker.in_flight))
