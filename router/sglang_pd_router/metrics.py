"""The router's Prometheus metrics, in its own CollectorRegistry (as ``frontend/metrics.py``
does), labelled by request class (short | long) where a request has one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST
_P = "sglang_pd_router_"
# router-added latency is sub-millisecond when healthy; queueing can make it seconds
_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1,
                    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass
class RouterMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        reg = self.registry
        self._children: dict[tuple[int, tuple[object, ...]], Any] = {}
        self.requests = Counter(_P + "requests", "Requests answered, by route, class and status",
                                ["route", "request_class", "status"], registry=reg)
        self.routed = Counter(_P + "routed_requests", "Requests sent to a prefill+decode pair "
                              "(prefill=\"local\": prefilled on the decode worker, no transfer)",
                              ["request_class", "prefill", "decode"], registry=reg)
        self.retries = Counter(_P + "retries", "Attempts repeated on another room/worker pair",
                               ["request_class"], registry=reg)
        self.failures = Counter(_P + "failures", "Requests that ended in an error",
                                ["request_class", "reason"], registry=reg)
        self.rejected = Counter(_P + "rejected", "Requests refused with 503 (queue full/timeout)",
                                ["reason"], registry=reg)
        self.in_flight = Gauge(_P + "requests_in_flight", "Requests being served", registry=reg)
        self.queued = Gauge(_P + "requests_queued", "Requests waiting for a slot", registry=reg)
        self.pool_size = Gauge(_P + "pool_size", "Prefill workers per role", ["role"],
                               registry=reg)
        self.pool_pressure = Gauge(_P + "pool_pressure", "Controller pool pressure in [0, 1]",
                                   ["role"], registry=reg)
        self.moves = Counter(_P + "role_moves", "Prefill workers moved between pools",
                             ["from_role", "to_role", "outcome"], registry=reg)
        self.workers_healthy = Gauge(_P + "workers_healthy", "Routable workers", ["kind"],
                                     registry=reg)
        self.added_latency = Histogram(
            _P + "added_latency_seconds",
            "Router time from a request's arrival to its decode request being sent "
            "(queueing, classification, selection, retries' backoff)",
            ["request_class"], buckets=_LATENCY_BUCKETS, registry=reg)

    def child(self, metric: Any, *labels: object) -> Any:
        """``metric.labels(*labels)``, looked up once: ``labels()`` takes a lock and builds
        strings, which shows on the router's per-request profile. The cache grows exactly as the
        metric's own label sets do (bounded by routes, classes, statuses and workers)."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*map(str, labels))
        return found

    def render(self) -> bytes:
        return generate_latest(self.registry)
