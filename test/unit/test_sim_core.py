"""The simulator's event core (python/sglang_pd/sim/): exact timings of small hand-computed
cases, determinism, conservation (every request ends, every page comes back), aborts."""

from __future__ import annotations

import pytest

from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.cost_model import PrefillCoeffs
from sglang_pd.sim.cluster import Cluster
from sglang_pd.sim.cluster_spec import ClusterSpec, SimResult
from sglang_pd.sim.profiles import StepCost, build_cost
from sglang_pd.sim.workload import Arrival, Workload, from_trace, synthetic


def toy_cost(capacity: int = 100_000) -> StepCost:
    """Prefill step: 0.1 s + 1 ms per token; decode step: 10 ms; 1000 bytes of KV per token."""
    return StepCost("toy", PrefillCoeffs(launch_s=0.1, b=0.001), lambda b, ctx, cmax: 0.01, 1000.0, capacity)


def run(spec: ClusterSpec, arrivals: list[Arrival], cost: StepCost | None = None) -> SimResult:
    return Cluster(spec, cost or toy_cost()).run(Workload(arrivals))


def assert_conserved(res: SimResult) -> None:
    for inst in res.instances:
        s = inst.sched
        s.check_integrity()
        assert s.allocator.num_used == 0, inst.name
        assert not (s.waiting or s.running or s.parked or inst.prealloc), inst.name
        assert inst.transferring == 0 and inst.in_flight == 0, inst.name


def test_colocated_exact_timings() -> None:
    """r0 (100 tokens, 3 out) at 0; r1 (50, 2) at 0.05 waits for r0's prefill (0.2 s). Then
    r1's prefill interleaves with r0's decodes (scheduling/colocated.py, mixed steps off):
    B = 1.5 x the cold 20 ms decode step buys fewer than 32 tokens at the measured 2 ms per
    token, so 32 tokens (0.132 s), r0's decode (10 ms), the last 18 (0.118 s): r1's first token
    at 0.46; then both decode together."""
    res = run(ClusterSpec(num_colocated=1), [Arrival(0.0, 100, 3), Arrival(0.05, 50, 2)])
    r0, r1 = res.tracks
    assert r0.first_token == pytest.approx(0.2) and r1.first_token == pytest.approx(0.46)
    assert r1.finish == pytest.approx(0.47) and r0.finish == pytest.approx(0.47)
    assert_conserved(res)


def test_pd_exact_timings_with_transfer() -> None:
    """Prefill 0.2 s; 100 tokens x 1000 B over 1 MB/s = 0.1 s after the only chunk, + 50 ms
    latency: first token at 0.35; two decode steps of 10 ms."""
    spec = ClusterSpec(num_prefill=1, num_decode=1, link_gb_s=0.001, link_latency_ms=50.0)
    res = run(spec, [Arrival(0.0, 100, 3)])
    (t,) = res.tracks
    assert t.prefill_done == pytest.approx(0.2) and t.decode_ready == 0.0
    assert t.first_token == pytest.approx(0.35) and t.finish == pytest.approx(0.37)
    assert_conserved(res)


def test_pd_one_token_request_ends_at_its_transfer() -> None:
    res = run(ClusterSpec(num_prefill=1, num_decode=1, link_gb_s=0.001, link_latency_ms=0.0), [Arrival(0.0, 10, 1)])
    (t,) = res.tracks
    assert t.first_token == pytest.approx(0.11 + 0.01) and t.finish == t.first_token
    assert_conserved(res)


def _mixed_workload(n: int = 600, qps: float = 40.0) -> Workload:
    return synthetic([("sharegpt-lengths", 0.9), ("fixed:6000:300", 0.1)], n, qps=qps, seed=3)


@pytest.mark.parametrize("spec", [
    ClusterSpec(num_colocated=2),
    ClusterSpec(num_prefill=2, num_decode=2),
    ClusterSpec(num_prefill=1, num_decode=2, prefill_policy="kairos+", decode_policy="continuous", exact=True),
], ids=["colocated", "pd", "pd-kairos+"])
def test_every_request_finishes_and_pages_come_back_under_memory_pressure(spec: ClusterSpec) -> None:
    spec.cfg = PolicyConfig(slo_ttft_ms=2000, slo_tpot_ms=100, max_running_requests=64)
    cost = build_cost("llama-3-8b@h100", kv_capacity_tokens=40_000)  # a few requests fill it
    res = Cluster(spec, cost).run(_mixed_workload())
    assert all(t.finish is not None and not t.error for t in res.tracks)
    assert all(t.first_token is not None and t.arrival <= t.first_token <= t.finish for t in res.tracks)
    if spec.num_colocated:
        assert sum(i.sched.num_retractions for i in res.instances) > 0  # the pool did run dry
    else:
        assert any(t.decode_ready > t.arrival for t in res.tracks)  # decode pre-allocation waited
    assert_conserved(res)


def test_same_seed_same_run_noise_included() -> None:
    def once() -> list[tuple]:
        spec = ClusterSpec(num_prefill=2, num_decode=1, prefill_policy="kairos+", prefix_cache_tokens=1_000_000,
                           cfg=PolicyConfig(slo_ttft_ms=8000, slo_tpot_ms=50))
        wl = from_trace("mooncake", limit=150, qps=2.0)
        res = Cluster(spec, build_cost("minimax-m2.5@h200x4", noise=0.05, seed=7)).run(wl)
        return [(t.p_inst, t.cached_len, t.first_token, t.finish) for t in res.tracks]

    a, b = once(), once()
    assert a == b and any(c for _, c, _, _ in a)  # prefix hits happened


def test_request_larger_than_the_pool_fails_alone() -> None:
    res = run(ClusterSpec(num_prefill=1, num_decode=1), [Arrival(0.0, 500, 2), Arrival(0.01, 5000, 2),
                                                           Arrival(0.02, 300, 2)], toy_cost(capacity=2000))
    ok, big, ok2 = res.tracks
    assert "KV" in big.error and big.first_token is None
    assert not ok.error and not ok2.error and ok2.finish is not None
    assert_conserved(res)


def test_prefix_cache_hits_shorten_prefill() -> None:
    """The second request shares 2 of its 3 blocks with the first: 1024 cached tokens."""
    arrivals = [Arrival(0.0, 1500, 2, (1, 2, 3)), Arrival(5.0, 1500, 2, (1, 2, 9))]
    res = run(ClusterSpec(num_colocated=1, prefix_cache_tokens=100_000), arrivals)
    first, second = res.tracks
    assert first.cached_len == 0 and second.cached_len == 1024
    assert first.first_token == pytest.approx(0.1 + 1.5)
    assert second.first_token - second.arrival == pytest.approx(0.1 + 0.001 * (1500 - 1024))
    assert_conserved(res)


def test_closed_loop_keeps_concurrency() -> None:
    wl = synthetic([("fixed:100:5", 1.0)], 20, concurrency=4, seed=1)
    res = Cluster(ClusterSpec(num_colocated=1), toy_cost()).run(wl)
    assert len(res.tracks) == 20 and all(t.finish is not None for t in res.tracks)
    assert sum(1 for t in res.tracks if t.arrival == 0.0) == 4
    assert_conserved(res)


def test_first_token_time_reaches_the_policies_on_both_sides() -> None:
    """Pacing decode policies (slack, slack+) read ``first_token_time``, as the engine sets it."""
    res = run(ClusterSpec(num_prefill=1, num_decode=1), [Arrival(0.0, 100, 4), Arrival(0.0, 30, 4)])
    for t in res.tracks:
        assert t.dreq.first_token_time == t.first_token
        assert t.preq.first_token_time == t.prefill_done


def test_closed_loop_drains_when_many_finish_at_once() -> None:
    """Equal requests finish in the same step: the loop issues only what is left."""
    wl = synthetic([("fixed:50:3", 1.0)], 10, concurrency=4, seed=1)
    res = Cluster(ClusterSpec(num_colocated=1), toy_cost()).run(wl)
    assert len(res.tracks) == 10 and all(t.finish is not None and not t.error for t in res.tracks)


def test_exact_mode_reaches_wrapped_policies() -> None:
    """Dual queues wrap the named policy and an AWD batcher: all of them read the truth."""
    from sglang_pd.sim.instance import Instance

    cost = build_cost("llama-3-8b@h100")
    cfg = PolicyConfig(prefill_queues="dual", role="prefill")
    inst = Instance(0, "prefill", cfg, cost, "kairos+", "slack+", exact=True)
    pp, dp = inst.sched.prefill_policy, inst.sched.decode_policy
    for obj in (pp, pp.long_policy, pp.awd):
        assert obj.model.coeffs == cost.prefill and not obj.model.learn
    assert dp.model.step_s(4, 4000, 1000) == cost.decode(4, 4000, 1000)


def test_the_clock_stops_at_the_last_real_event() -> None:
    """Pending PD timeouts of requests that went on are not events: the run ends at the last finish."""
    res = run(ClusterSpec(num_prefill=1, num_decode=1), [Arrival(0.0, 100, 3), Arrival(0.5, 100, 3)])
    assert res.sim_end_s == max(t.finish for t in res.tracks) < 2.0
