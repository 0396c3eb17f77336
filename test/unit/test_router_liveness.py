"""Liveness of a request's legs (issue 35): a hung worker cannot hold requests, failures are
charged to the worker that caused them, unhealthy workers' in-flight tries are retried, marks
clear on the first good probe; and slow clients cannot hold connections."""

from __future__ import annotations

import asyncio

import pytest

from router_helpers import GEN, raw_exchange, router_cluster
from sglang_pd_router.fake_worker import FakeBehaviour

pytestmark = pytest.mark.timeout(60)
FAST = dict(kv_deadline_s=0.5, first_byte_timeout_s=0.3, health_check_timeout_s=0.3,
            cb_failure_threshold=1, cb_timeout_s=3600, decode_policy="round_robin")


@pytest.mark.parametrize("stream", [False, True])
async def test_a_hung_decode_costs_one_retry_and_opens_its_circuit_not_the_prefills(
        stream: bool) -> None:
    async with router_cluster(n_decode=2, **FAST) as c:
        hung, good = c.decodes
        hung.hung = True
        # the prefill waits for decode like ours do (bootstrap): it never answers either
        c.prefills[0].behaviour = FakeBehaviour(delay_s=0.0)

        async def one() -> int:
            async with c.client.post(c.url + "/generate", json={**GEN, "stream": stream}) as r:
                await r.read()
                return r.status

        statuses = await asyncio.wait_for(asyncio.gather(*(one() for _ in range(4))), 20)
        assert statuses == [200] * 4
        hung_w = c.service.registry.find(hung.url)
        assert hung_w.breaker.state(asyncio.get_running_loop().time()) == "open"
        assert c.service.registry.find(c.prefills[0].url).breaker.failures == 0
        assert good.answered == 4


async def test_prefill_error_while_decode_never_registered_is_decodes_fault() -> None:
    async with router_cluster(n_decode=2, **{**FAST, "cb_failure_threshold": 5},
                              max_retries=1) as c:
        hung = c.decodes[0]  # round robin: the first try goes to it
        hung.hung = True
        c.prefills[0].behaviour = FakeBehaviour(status=500)  # its KV transfer failed
        async with c.client.post(c.url + "/generate", json=GEN) as r:
            assert r.status == 500  # both tries failed
        prefill_w = c.service.registry.find(c.prefills[0].url)
        # try 1: the decode never registered (silent): its fault; try 2 (live decode): prefill's
        assert c.service.registry.find(hung.url).breaker.failures == 1
        assert prefill_w.breaker.failures == 1


async def test_a_prefill_slower_than_the_deadline_but_alive_is_waited_for() -> None:
    async with router_cluster(**FAST) as c:
        c.prefills[0].behaviour = FakeBehaviour(delay_s=1.5)  # three deadlines, probes pass
        c.decodes[0].behaviour = FakeBehaviour(delay_s=1.6)
        async with c.client.post(c.url + "/generate", json=GEN) as r:
            assert r.status == 200
        assert len(c.prefills[0].bodies) == 1  # no retry


async def test_in_flight_tries_on_a_worker_turning_unhealthy_are_retried() -> None:
    async with router_cluster(n_decode=2, decode_policy="round_robin",
                              health_failure_threshold=1) as c:
        slow, good = c.decodes
        slow.behaviour = FakeBehaviour(delay_s=30)
        task = asyncio.ensure_future(c.client.post(c.url + "/generate", json=GEN))
        while not slow.bodies:
            await asyncio.sleep(0.01)
        slow.healthy = False
        await c.service.monitor.check_health()
        resp = await asyncio.wait_for(task, 5)
        assert resp.status == 200 and (await resp.json())["meta_info"]["served_by"] == "decode"
        assert good.answered == 1 and slow.cancelled == 1


async def test_an_unhealthy_mark_clears_on_the_first_good_probe() -> None:
    async with router_cluster(health_failure_threshold=1) as c:
        d = c.decodes[0]
        w = c.service.registry.find(d.url)
        d.healthy = False
        await c.service.monitor.check_health()
        assert not w.health_ok and w.breaker.state(0) != "closed"
        d.healthy = True
        await c.service.monitor.recheck_unhealthy()
        assert w.routable(asyncio.get_running_loop().time())
        async with c.client.post(c.url + "/generate", json=GEN) as r:
            assert r.status == 200


async def test_silent_and_trickling_connections_are_closed() -> None:
    async with router_cluster(client_idle_timeout_s=0.5, body_timeout_s=0.5) as c:
        # headers trickled and never finished: closed by the idle timer, no answer
        t0 = asyncio.get_running_loop().time()
        out = await raw_exchange(c.port, b"POST /generate HTTP/1.1\r\nHost: x\r\n", 5.0)
        assert out == b"" and asyncio.get_running_loop().time() - t0 < 4.0
        # a connection that sends nothing
        assert await raw_exchange(c.port, b"", 5.0) == b""
        # a body trickled: 408 and the connection closes
        out = await raw_exchange(c.port, b"POST /generate HTTP/1.1\r\nHost: x\r\n"
                                 b"Content-Length: 100\r\n\r\n{\"text\"", 5.0)
        assert out.startswith(b"HTTP/1.1 408"), out[:100]


async def test_connections_over_the_cap_are_closed() -> None:
    async with router_cluster(max_connections=2) as c:
        held = [await asyncio.open_connection("127.0.0.1", c.port) for _ in range(2)]
        await asyncio.sleep(0.1)
        assert await raw_exchange(c.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", 3) == b""
        for _, writer in held:
            writer.close()
        await asyncio.sleep(0.1)
        out = await raw_exchange(c.port, b"GET /health HTTP/1.1\r\nHost: x\r\n"
                                 b"Connection: close\r\n\r\n", 3)
        assert out.startswith(b"HTTP/1.1 200")
