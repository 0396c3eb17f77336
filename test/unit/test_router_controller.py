"""PLA-Serve's instance-pressure controller (Alg. 2) with fake pressures, and the router's
drain-then-switch of a moved worker against fake servers."""

from __future__ import annotations

import asyncio
import math

import aiohttp
import orjson
import pytest
from aiohttp import web

from sglang_pd_router.config import PrefillSpec, RouterConfig
from sglang_pd_router.controller import (
    ControllerConfig,
    InstanceSignals,
    PoolController,
    instance_pressure,
    percentile,
)
from sglang_pd_router.fake_worker import FakeWorker
from sglang_pd_router.metrics import RouterMetrics
from sglang_pd_router.monitor import WorkerMonitor
from sglang_pd_router.workers import WorkerRegistry

CFG = ControllerConfig(cooldown_s=10.0, tau=0.25, delta=0.05, min_per_pool=1)


def _pool(short: list[int], long_: list[int], **kw) -> list[InstanceSignals]:
    """Instances with these queued prefill tokens (10K tokens/s prior)."""
    return ([InstanceSignals(f"s{i}", "short", q, **kw) for i, q in enumerate(short)]
            + [InstanceSignals(f"l{i}", "long", q, **kw) for i, q in enumerate(long_)])


def test_signals_are_normalised_and_pressure_is_in_unit_range() -> None:
    assert instance_pressure(InstanceSignals("a", "short"), CFG) == 0.0
    full = InstanceSignals("a", "short", queued_prefill_tokens=10**9, slo_ttft_deviation=50.0,
                           busy_fraction=3.0)
    assert instance_pressure(full, CFG) == 1.0
    # slack (negative deviation) is not pressure; NaN counts as none
    assert instance_pressure(InstanceSignals("a", "long", slo_ttft_deviation=-0.9), CFG) == 0.0
    assert instance_pressure(InstanceSignals("a", "long", busy_fraction=math.nan), CFG) == 0.0
    # the paper's sign: utilisation lowers pressure, still within [0, 1]
    paper = ControllerConfig.as_written()
    idle, busy = InstanceSignals("a", "long"), InstanceSignals("a", "long", busy_fraction=1.0)
    assert 0.0 <= instance_pressure(busy, paper) < instance_pressure(idle, paper) <= 1.0
    # the queue is measured against the pool's own TTFT reference: 2500 queued tokens are full
    # pressure for the short pool (0.25 s of 0.5 s... doubled) but little for the long pool
    assert instance_pressure(InstanceSignals("a", "short", 5000), CFG) > \
        instance_pressure(InstanceSignals("a", "long", 5000), CFG)


def test_p90_aggregator() -> None:
    assert percentile([0.0] * 9 + [1.0], 90) == pytest.approx(0.1)
    assert percentile([0.3], 90) == 0.3
    with pytest.raises(ValueError):
        percentile([], 90)


def test_moves_toward_the_pressured_pool_then_cools_down_then_moves_back() -> None:
    ctl = PoolController(CFG)
    burst = _pool(short=[0, 0, 0], long_=[80_000, 90_000])  # long pool drowning
    move = ctl.step(0.0, burst)
    assert move is not None and (move.from_role, move.to_role) == ("short", "long")
    assert move.long_pressure > move.short_pressure
    assert ctl.step(5.0, burst) is None  # cool-down
    after = _pool(short=[4000, 4000], long_=[0, 0, 0])  # burst over, shorts queue up
    assert ctl.step(9.9, after) is None
    back = ctl.step(10.0, after)
    assert back is not None and (back.from_role, back.to_role) == ("long", "short")


def test_hysteresis_holds_near_zero_and_for_small_imbalances() -> None:
    ctl = PoolController(ControllerConfig(cooldown_s=0.0))
    # both idle, or almost: P_l = 0 must not make any tiny P_s win (the paper's (1+tau)P does)
    assert ctl.step(0.0, _pool(short=[10], long_=[0, 0])) is None
    assert ctl.last_pressures["long"] == 0.0 and ctl.last_pressures["short"] > 0.0
    # a relative imbalance under tau is not enough either
    assert ctl.step(1.0, _pool(short=[2000], long_=[1700 * 10, 0])) is None


def test_minimum_pool_size_draining_and_unhealthy_are_respected() -> None:
    ctl = PoolController(ControllerConfig(cooldown_s=0.0, min_per_pool=1))
    assert ctl.step(0.0, _pool(short=[0], long_=[90_000])) is None  # short pool at its minimum
    sigs = _pool(short=[0, 0], long_=[90_000])
    sigs[0].draining = True  # the previous move has not finished
    assert ctl.step(1.0, sigs) is None
    sigs = _pool(short=[0, 0], long_=[90_000])
    sigs[0].healthy = False  # only one healthy short instance: it stays
    assert ctl.step(2.0, sigs) is None
    sigs = _pool(short=[0, 0], long_=[90_000])
    move = ctl.step(3.0, sigs)
    assert move is not None and move.url in ("s0", "s1")
    with pytest.raises(ValueError, match="role"):
        ctl.step(4.0, [InstanceSignals("x", "medium")])


def test_picks_the_least_pressured_donor() -> None:
    ctl = PoolController(ControllerConfig(cooldown_s=0.0))
    move = ctl.step(0.0, _pool(short=[3000, 100, 2000], long_=[200_000]))
    assert move is not None and move.url == "s1"


def test_bad_config_is_refused() -> None:
    for bad in ({"period_s": 0}, {"tau": -1}, {"min_per_pool": -1}, {"percentile": 0},
                {"alpha": 0, "beta": 0, "gamma": 0}, {"gamma": math.inf}):
        with pytest.raises(ValueError):
            ControllerConfig(**bad)


async def _monitor(workers: list[FakeWorker], **cfg_kw) -> WorkerMonitor:
    cfg = RouterConfig(prefills=[PrefillSpec(w.url) for w in workers], decodes=[],
                       drain_timeout_s=5.0, **cfg_kw)
    registry = WorkerRegistry()
    for w in workers:
        registry.add(w.url, "prefill", 1)
    session = aiohttp.ClientSession()
    monitor = WorkerMonitor(cfg, registry, session, RouterMetrics(), {}, lambda t: None)
    for w in registry.all():
        await monitor.discover(w)
    return monitor


@pytest.mark.timeout(30)
@pytest.mark.parametrize("server_has_route", [True, False])
async def test_a_moved_worker_drains_then_switches_role(server_has_route: bool) -> None:
    fakes = [FakeWorker("prefill") for _ in range(3)]
    for fake, role in zip(fakes, ("short", "short", "long")):
        await fake.start()
        fake.server_info = {"prefill_role": role}
        fake.load = {"prefill_role": role, "num_reqs": 0}
        fake.role_route = server_has_route
    monitor = await _monitor(fakes, controller=ControllerConfig(cooldown_s=0.0))
    try:
        fakes[2].load.update(num_queue_prefill_tokens=100_000, num_reqs=3)
        fakes[1].load.update(num_queue_prefill_tokens=500)  # so fakes[0] is the donor
        await monitor.poll_loads()
        donor = monitor.registry.find(fakes[0].url)
        assert donor is not None
        donor.in_flight = 1  # still serving a request of ours
        move = await monitor.control_step()
        assert move is not None and move.url == fakes[0].url and move.to_role == "long"
        assert donor.draining and not donor.routable(0.0)
        await asyncio.sleep(0.3)
        assert fakes[0].role_requests == []  # waits for its work to finish
        donor.in_flight = 0
        for _ in range(100):
            if not donor.draining:
                break
            await asyncio.sleep(0.05)
        assert donor.prefill_role == "long" and not donor.draining
        assert fakes[0].role_requests == (["long"] if server_has_route else [])
        assert monitor.registry.pool_sizes() == {"short": 1, "long": 2, "both": 0}
        # the next poll keeps the router's role even where the server could not switch
        await monitor.poll_loads()
        assert donor.prefill_role == "long"
        outcome = "switched" if server_has_route else "router_only"
        assert f'outcome="{outcome}"' in monitor.metrics.render().decode()
    finally:
        await monitor.stop()
        await monitor.session.close()
        for f in fakes:
            await f.stop()


class _RefusingWorker(FakeWorker):
    """A server that refuses the role switch (e.g. started without dual queues or a role)."""

    async def _set_role(self, request):  # type: ignore[no-untyped-def]
        self.role_requests.append(orjson.loads(await request.read()).get("role"))
        return web.json_response({"error": {"message": "needs --prefill-queues dual"}},
                                 status=400)


@pytest.mark.timeout(30)
async def test_a_refused_role_switch_leaves_the_worker_in_its_pool() -> None:
    fakes = [_RefusingWorker("prefill"), FakeWorker("prefill"), FakeWorker("prefill")]
    for fake, role in zip(fakes, ("short", "short", "long")):
        await fake.start()
        fake.server_info = {"prefill_role": role}
        fake.load = {"prefill_role": role, "num_reqs": 0}
    monitor = await _monitor(fakes, controller=ControllerConfig(cooldown_s=0.0))
    try:
        fakes[2].load.update(num_queue_prefill_tokens=100_000, num_reqs=3)
        fakes[1].load.update(num_queue_prefill_tokens=500)  # so fakes[0] is the donor
        await monitor.poll_loads()
        donor = monitor.registry.find(fakes[0].url)
        assert donor is not None
        move = await monitor.control_step()
        assert move is not None and move.url == fakes[0].url and move.to_role == "long"
        await asyncio.wait_for(asyncio.gather(*monitor._tasks), 10)
        assert fakes[0].role_requests == ["long"]  # asked, and refused
        assert donor.prefill_role == "short" and not donor.draining
        assert donor.routable(0.0)  # serving its old pool again
        assert monitor.moves == []
        assert monitor.registry.pool_sizes() == {"short": 2, "long": 1, "both": 0}
        assert 'outcome="failed"' in monitor.metrics.render().decode()
        # not pinned in the router: the server's own role keeps being adopted
        await monitor.poll_loads()
        assert donor.prefill_role == "short" and fakes[0].url not in monitor.role_pinned
    finally:
        await monitor.stop()
        await monitor.session.close()
        for f in fakes:
            await f.stop()
