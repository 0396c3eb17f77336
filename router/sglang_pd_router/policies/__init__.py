"""Routing policies by name (``--prefill-policy`` / ``--decode-policy`` of the router, the
simulator's ``--router``). Adding one is one file plus one line in ``ROUTING_POLICIES``."""

from __future__ import annotations

from ..request_class import PREFILL_ROLES, REQUEST_CLASSES, classify
from .base import (
    WORKER_KINDS,
    RouteRequest,
    RoutingConfig,
    RoutingPolicy,
    WorkerView,
    load_key,
    predicted_queue_s,
    request_class_of,
)
from .cache_aware import CacheAwarePolicy
from .length_aware import LengthAwarePolicy
from .length_aware_spill import LengthAwareSpillPolicy
from .power_of_two import PowerOfTwoPolicy
from .random_policy import RandomPolicy
from .round_robin import RoundRobinPolicy

ROUTING_POLICIES: dict[str, type[RoutingPolicy]] = {
    "random": RandomPolicy,
    "round_robin": RoundRobinPolicy,
    "power_of_two": PowerOfTwoPolicy,
    "length_aware": LengthAwarePolicy,
    "length_aware_spill": LengthAwareSpillPolicy,  # ours: idle short instances take longs
    "cache_aware": CacheAwarePolicy,  # length_aware's pools, cost net of expected prefix hits
}


def create_routing_policy(
    name: str, cfg: RoutingConfig | None = None, seed: int | None = None
) -> RoutingPolicy:
    """A new policy instance by registry name; unknown names list the known ones."""
    try:
        cls = ROUTING_POLICIES[name]
    except KeyError:
        raise ValueError(
            f"unknown routing policy {name!r}; choose one of {sorted(ROUTING_POLICIES)}"
        ) from None
    return cls(cfg, seed)


__all__ = [
    "PREFILL_ROLES",
    "REQUEST_CLASSES",
    "ROUTING_POLICIES",
    "WORKER_KINDS",
    "RouteRequest",
    "RoutingConfig",
    "RoutingPolicy",
    "WorkerView",
    "classify",
    "create_routing_policy",
    "load_key",
    "predicted_queue_s",
    "request_class_of",
]
