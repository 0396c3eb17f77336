"""What the router knows about each worker: health, circuit breaker, in-flight work, the last
polled ``/get_load``, and the prefill role. ``WorkerRegistry.views`` turns it into the pure
policies' ``WorkerView`` snapshots."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from .policies import WorkerView


@dataclass
class CircuitBreaker:
    """Closed -> open after ``threshold`` consecutive failures; open refuses for ``open_s``, then
    lets one trial through (half-open): its success closes, its failure reopens."""

    threshold: int = 5
    open_s: float = 10.0
    failures: int = 0
    opened_at: float = -math.inf
    trial_in_flight: bool = False
    trial_started_at: float = -math.inf  # a trial never reported (its client left) expires

    def state(self, now: float) -> str:
        if self.failures < self.threshold:
            return "closed"
        return "open" if now - self.opened_at < self.open_s else "half_open"

    def allows(self, now: float) -> bool:
        state = self.state(now)
        if state == "closed":
            return True
        return state == "half_open" and (not self.trial_in_flight
                                         or now - self.trial_started_at > self.open_s)

    def on_pick(self, now: float) -> None:
        if self.state(now) == "half_open":
            self.trial_in_flight = True
            self.trial_started_at = now

    def on_success(self) -> None:
        self.failures = 0
        self.trial_in_flight = False

    def on_failure(self, now: float) -> None:
        self.failures += 1
        self.trial_in_flight = False
        if self.failures >= self.threshold:
            self.opened_at = now

    def trip(self, now: float) -> None:
        """Open at once (the worker failed its health checks); a good probe closes it."""
        self.failures = max(self.failures, self.threshold)
        self.opened_at = now
        self.trial_in_flight = False


def validate_url(url: object) -> str:
    """A worker URL as the router stores it: http(s), a host, a port in 1..65535 if given, no
    path, query or whitespace. Raises ValueError saying what is wrong."""
    if not isinstance(url, str) or not url.strip():
        raise ValueError("'url' must be an http(s) URL such as http://10.0.0.1:30000")
    if any(c.isspace() for c in url) or any(ord(c) < 32 for c in url):
        raise ValueError(f"worker URL {url!r} contains whitespace or control characters")
    try:
        parsed = urlparse(url)
        port = parsed.port  # raises on a non-numeric or out-of-range port
    except ValueError as e:
        raise ValueError(f"worker URL {url!r} is malformed: {e}") from None
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"worker URL must look like http://host:port, got {url!r}")
    if port is not None and not 0 < port < 65536:
        raise ValueError(f"worker URL {url!r}: port must be 1..65535")
    if parsed.path.strip("/") or parsed.query or parsed.fragment or parsed.username:
        raise ValueError(f"worker URL {url!r} must have no path, query or credentials")
    return url.rstrip("/")


@dataclass
class Worker:
    url: str
    kind: str  # "prefill" | "decode"
    bootstrap_port: int | None = None
    prefill_role: str = "both"
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)
    health_ok: bool = True  # optimistic until checked (a new worker gets traffic at once)
    health_fails: int = 0
    health_passes: int = 0
    draining: bool = False  # leaving its pool: no new requests, then a role switch
    in_flight: int = 0
    outstanding_prefill_tokens: int = 0  # prompt tokens this router has queued there
    polled: dict[str, Any] = field(default_factory=dict)  # the last /get_load answer
    threshold: int | None = None  # the worker's --short-prefill-threshold, when it reports one
    context_length: int | None = None  # the model's context as the worker reports it
    misconfigured: str | None = None  # why its own settings disagree with its registration
    # tries in flight on this worker: each future is resolved when the worker turns unhealthy
    watchers: set[asyncio.Future] = field(default_factory=set)

    bootstrap_host: str = ""  # the URL's host: where decode finds this prefill's bootstrap

    def __post_init__(self) -> None:
        self.bootstrap_host = urlparse(self.url).hostname or "127.0.0.1"

    def routable(self, now: float) -> bool:
        return (self.health_ok and not self.draining and self.misconfigured is None
                and self.breaker.allows(now))

    def mark_unhealthy(self, now: float) -> None:
        """No new requests, circuit open, and the tries in flight here are told to give up."""
        self.health_ok = False
        self.breaker.trip(now)
        for fut in list(self.watchers):
            if not fut.done():
                fut.set_result(self)

    def queued_prefill_tokens(self) -> int:
        # The poll sees every router's work but is up to one poll period old; this router's own
        # count is current. The larger is the better estimate with one router or several.
        polled = int(self.polled.get("num_queue_prefill_tokens", 0) or 0)
        return max(polled, self.outstanding_prefill_tokens)

    def view(self, now: float) -> WorkerView:
        return WorkerView(
            url=self.url, kind=self.kind, prefill_role=self.prefill_role,
            healthy=self.routable(now), in_flight=self.in_flight,
            queued_prefill_tokens=self.queued_prefill_tokens(),
            num_running_reqs=int(self.polled.get("num_running_reqs", 0) or 0),
            token_usage=float(self.polled.get("token_usage", 0.0) or 0.0))

    def describe(self, now: float) -> dict[str, Any]:
        return {"url": self.url, "kind": self.kind, "bootstrap_port": self.bootstrap_port,
                "prefill_role": self.prefill_role if self.kind == "prefill" else None,
                "healthy": self.health_ok, "routable": self.routable(now),
                "circuit": self.breaker.state(now), "draining": self.draining,
                "misconfigured": self.misconfigured,
                "in_flight": self.in_flight,
                "queued_prefill_tokens": self.queued_prefill_tokens()}


class WorkerRegistry:
    """Workers by kind, in the order they were added (policies index into these lists)."""

    def __init__(self, cb_threshold: int = 5, cb_open_s: float = 10.0) -> None:
        self.cb_threshold = cb_threshold
        self.cb_open_s = cb_open_s
        self.by_kind: dict[str, list[Worker]] = {"prefill": [], "decode": []}

    def add(self, url: str, kind: str, bootstrap_port: int | None = None) -> Worker:
        if kind not in self.by_kind:
            raise ValueError(f"worker kind must be prefill or decode, got {kind!r}")
        if self.find(url) is not None:
            raise ValueError(f"worker {url} is already registered")
        worker = Worker(url, kind, bootstrap_port,
                        breaker=CircuitBreaker(self.cb_threshold, self.cb_open_s))
        self.by_kind[kind].append(worker)
        return worker

    def remove(self, url: str) -> Worker:
        worker = self.find(url)
        if worker is None:
            raise KeyError(url)
        self.by_kind[worker.kind].remove(worker)
        return worker

    def find(self, url: str) -> Worker | None:
        url = url.rstrip("/")
        for workers in self.by_kind.values():
            for w in workers:
                if w.url == url:
                    return w
        return None

    def context_length(self) -> int | None:
        """The smallest context any worker reports (prompts longer than it fit nowhere)."""
        known = [w.context_length for w in self.all() if w.context_length]
        return min(known) if known else None

    def all(self) -> list[Worker]:
        return self.by_kind["prefill"] + self.by_kind["decode"]

    def views(self, kind: str, now: float, avoid: frozenset[str] = frozenset()
              ) -> tuple[list[Worker], list[WorkerView]]:
        """The workers of ``kind`` and their views; ``avoid`` (workers that failed this request)
        count as unhealthy while any other is routable."""
        workers = self.by_kind[kind]
        views = [w.view(now) for w in workers]
        if avoid and any(v.healthy and v.url not in avoid for v in views):
            for v in views:
                if v.url in avoid:
                    v.healthy = False
        return workers, views

    def pool_sizes(self) -> dict[str, int]:
        sizes = {"short": 0, "long": 0, "both": 0}
        for w in self.by_kind["prefill"]:
            sizes[w.prefill_role] = sizes.get(w.prefill_role, 0) + 1
        return sizes
