"""The simulator's side of the router's ``PoolController`` (PLA's Alg. 2 over short/long
prefill roles): which instances it manages and the signals it reads.

With a pool controller (``ClusterSpec.pool_controller``), every control period the router's own
``PoolController`` gets one ``InstanceSignals`` per short/long prefill instance, built as the
router builds them from ``/get_load``: queued prefill tokens (the router's count of tokens routed
there and not yet computed), the TTFT SLO deviation of the instance's class and the busy fraction
(the engine's ``LoadTracker``). A move switches the instance's role at once (the server's
``set_prefill_role``); the router's drain-then-switch is simplified away: the dual-queue policy
serves the other class's leftovers anyway, so nothing is stranded.
"""

from __future__ import annotations

from sglang_pd_router.controller import ControllerConfig, InstanceSignals, PoolController

from sglang_pd.sim.instance import Instance


def make_controller(config: ControllerConfig | None, front: list[Instance], pd: bool) -> PoolController | None:
    """The controller, or None without one; refuses a cluster it cannot manage."""
    if config is None:
        return None
    managed = [inst for inst in front if inst.prefill_role in ("short", "long")]
    if not pd or len(managed) < 2:
        raise ValueError("the pool controller needs a PD cluster with >= 2 prefill instances given "
                         "short/long roles (--prefill-role short,...,long)")
    for inst in managed:
        if not inst.sched.prefill_policy.serves_roles:
            raise ValueError("the pool controller switches roles: use --prefill-queues dual")
    return PoolController(config)


def instance_signals(front: list[Instance], now: float) -> list[InstanceSignals]:
    """One per short/long prefill instance, as the router's ``Monitor.signals``."""
    out = []
    for inst in front:
        role = inst.prefill_role
        if role not in ("short", "long"):
            continue
        out.append(InstanceSignals(inst.name, role, queued_prefill_tokens=inst.queued_tokens,
                                   slo_ttft_deviation=inst.loads.mean_deviation(role),
                                   busy_fraction=inst.loads.busy_fraction(now)))
    return out
