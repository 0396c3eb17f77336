"""The simulator driving the router's PoolController (sim/cluster.py): a burst of long prompts
moves a short instance to the long pool, a later burst of short ones moves one back; per-class
TTFT SLOs; the controller's signals mean what the servers' /get_load fields mean."""

from __future__ import annotations

import argparse

import pytest
from sglang_pd_router.controller import ControllerConfig

from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.cost_model import PrefillCoeffs
from sglang_pd.sim.cli import add_common, cluster_spec
from sglang_pd.sim.cluster import Cluster
from sglang_pd.sim.cluster_spec import ClusterSpec, SimResult
from sglang_pd.sim.profiles import StepCost
from sglang_pd.sim.report import class_ttft
from sglang_pd.sim.workload import Arrival, Workload

THRESHOLD = 256


def toy_cost() -> StepCost:
    """Prefill step: 0.1 s + 1 ms per token; decode step: 10 ms."""
    return StepCost("toy", PrefillCoeffs(launch_s=0.1, b=0.001), lambda b, ctx, cmax: 0.01, 1000.0, 200_000)


def spec(controller: ControllerConfig | None, roles: list[str] | None = None) -> ClusterSpec:
    cfg = PolicyConfig(slo_ttft_ms=400, prefill_queues="dual", short_prefill_threshold=THRESHOLD)
    s = ClusterSpec(4, 2, prefill_roles=roles or ["short", "short", "short", "long"], cfg=cfg,
                    router_prefill="length_aware", router_decode="round_robin", slo_ttft_s_long=20.0,
                    pool_controller=controller)
    s.routing.short_prefill_threshold = THRESHOLD
    return s


def burst_workload() -> Workload:
    """10 s of long prompts (2000 tokens every 0.5 s: 4x what one long instance computes),
    quiet, then 20 s of short ones (100 tokens, 25/s: more than two short instances compute)."""
    longs = [Arrival(0.5 * k, 2000, 4) for k in range(20)]
    shorts = [Arrival(60.0 + 0.04 * k, 100, 4) for k in range(500)]
    return Workload(longs + shorts)


def run(controller: ControllerConfig | None) -> tuple[Cluster, SimResult]:
    cluster = Cluster(spec(controller), toy_cost())
    return cluster, cluster.run(burst_workload())


CTRL = ControllerConfig(period_s=1.0, cooldown_s=3.0, queue_ref_s_short=0.4, queue_ref_s_long=20.0,
                        default_prefill_tokens_per_s=1000.0)


def test_long_burst_moves_a_short_instance_and_the_short_burst_moves_one_back() -> None:
    cluster, res = run(CTRL)
    moves = [(t, m.from_role, m.to_role) for t, m in res.moves]
    assert moves, "the controller never moved an instance"
    t0, src, dst = moves[0]
    assert (src, dst) == ("short", "long") and t0 < 10.0  # during the long burst
    back = [t for t, s, d in moves if (s, d) == ("long", "short")]
    assert back and min(back) >= 60.0  # only once short traffic presses
    # the roles really changed: the moved instance served long prompts while it was long
    roles = [inst.prefill_role for inst in cluster.front]
    assert roles.count("long") >= 1 and roles.count("short") >= 1
    # every request still finishes
    assert all(t.finish is not None and not t.error for t in res.tracks)


def test_controller_beats_fixed_roles_on_the_long_burst() -> None:
    _, fixed = run(None)
    _, moved = run(CTRL)
    long_fixed = class_ttft(fixed, 0.4)["long"]
    long_moved = class_ttft(moved, 0.4)["long"]
    assert long_moved["ttft_p90_s"] < long_fixed["ttft_p90_s"]


def test_per_class_slos_and_classes() -> None:
    _, res = run(None)
    for t in res.tracks:
        assert t.request_class == ("long" if t.prompt_len > THRESHOLD else "short")
        assert t.slo_ttft_s == (20.0 if t.request_class == "long" else None)  # short: the default
    by = class_ttft(res, 0.4)
    assert by["long"]["n"] == 20 and by["short"]["n"] == 500


def test_signals_match_the_instances() -> None:
    cluster = Cluster(spec(CTRL), toy_cost())
    cluster.run(Workload([Arrival(0.0, 2000, 2), Arrival(0.0, 100, 2)]))
    sigs = {s.url: s for s in cluster.signals()}
    assert set(sigs) == {"p0", "p1", "p2", "p3"}
    assert sigs["p3"].role == "long" and sigs["p0"].role == "short"
    assert all(s.queued_prefill_tokens == 0 for s in sigs.values())  # all computed
    assert sigs["p3"].busy_fraction > 0  # it computed the long prompt within the last 10 s


def test_controller_needs_roles_and_dual_queues() -> None:
    with pytest.raises(ValueError, match="short/long roles"):
        Cluster(spec(CTRL, roles=["both"] * 4), toy_cost())
    s = spec(CTRL)
    s.cfg = PolicyConfig(slo_ttft_ms=400, prefill_queues="single")
    s.prefill_roles = ["both", "both", "both", "both"]
    with pytest.raises(ValueError):
        Cluster(s, toy_cost())


def test_cli_flags() -> None:
    ap = argparse.ArgumentParser()
    add_common(ap)
    a = ap.parse_args(["--prefill", "4", "--prefill-queues", "dual", "--prefill-role", "short,short,long,long",
                       "--pool-controller", "on", "--slo-ttft-ms", "400", "--slo-ttft-ms-long", "8000",
                       "--controller-period-s", "0.5"])
    s = cluster_spec(a)
    assert s.slo_ttft_s_long == 8.0
    assert s.pool_controller is not None and s.pool_controller.period_s == 0.5
    assert (s.pool_controller.queue_ref_s_short, s.pool_controller.queue_ref_s_long) == (0.4, 8.0)
    a = ap.parse_args(["--slo-ttft-ms-long", "-1"])
    with pytest.raises(ValueError, match="slo-ttft-ms-long"):
        cluster_spec(a)
