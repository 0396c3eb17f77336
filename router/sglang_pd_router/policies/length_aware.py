"""``length_aware``: PLA-Serve's length disaggregation at the router (§3.2, "Mutual exclusion").

A prefill pick sends short prompts to the short pool and long ones to the long pool (workers
whose ``prefill_role`` is the request's class, or ``both``), and inside the pool the worker with
the least predicted queue time (queued prefill tokens plus this prompt, over its throughput).

Deviations, named: PLA's instances pull from two global queues; a router pushes, so "least
predicted queue time" stands in for "the next free instance of the pool". When a pool has no
healthy member (its last instance died, or is draining for a role move) the request goes to the
least loaded healthy prefill worker of any role rather than failing: a slow answer beats none.

A decode pick (no length split there) takes the worker holding the fewest requests, then the
lowest KV usage.
"""

from __future__ import annotations

from collections.abc import Sequence

from .base import (
    RouteRequest,
    RoutingPolicy,
    WorkerView,
    eligible_indices,
    load_key,
    predicted_queue_s,
    request_class_of,
)


class LengthAwarePolicy(RoutingPolicy):
    name = "length_aware"

    def select(self, req: RouteRequest, workers: Sequence[WorkerView], now: float) -> int | None:
        candidates = eligible_indices(workers)
        if not candidates:
            return None
        prefill = [i for i in candidates if workers[i].kind == "prefill"]
        if not prefill:  # a decode list
            return min(candidates, key=lambda i: (load_key(workers[i], self.cfg), i))
        cls = request_class_of(req, self.cfg)
        pool = [i for i in prefill if workers[i].prefill_role in (cls, "both")]
        if not pool:
            pool = prefill  # fallback named in the module docstring
        new_tokens = max(req.prompt_len - req.cached_len, 0)

        def key(i: int) -> tuple[float, int, int]:
            w = workers[i]
            # a dedicated member beats a "both" one at equal predicted time (keeps the
            # mixed instance free for the other class)
            return (predicted_queue_s(w, self.cfg, new_tokens), w.in_flight,
                    0 if w.prefill_role == cls else 1)

        return min(pool, key=lambda i: (key(i), i))
