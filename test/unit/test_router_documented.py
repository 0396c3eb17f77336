"""docs/router.md's reliability claims that had no test (issue 32 section 5): the bounded queue's
``--queue-timeout-secs``, errors after the first byte (a stream that cannot migrate ends with a
clear SSE error event, never a hang), and an unhealthy worker coming back on its own once its
``/health`` passes again. Fake workers on loopback; every wait is a hang guard, no timing bar."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import orjson
import pytest

from router_helpers import GEN, router_cluster
from sglang_pd_router.fake_worker import FakeBehaviour

pytestmark = pytest.mark.timeout(60)


async def _events(resp) -> list[dict]:
    text = (await resp.read()).decode()
    return [orjson.loads(line[5:]) for line in text.split("\n")
            if line.startswith("data:") and line[5:].strip() != "[DONE]"]


async def _until(cond: Callable[[], object], what: str, timeout_s: float = 10.0) -> None:
    """Poll ``cond`` (a hang guard, not a timing bar)."""
    for _ in range(int(timeout_s / 0.02)):
        if cond():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"never happened within {timeout_s}s: {what}")


# ---------------------------------------------------------------------- --queue-timeout-secs
async def test_a_queued_request_gets_503_when_no_slot_frees_within_the_queue_timeout() -> None:
    async with router_cluster(max_concurrent_requests=1, queue_size=4,
                              queue_timeout_s=0.2) as c:
        d = c.decodes[0]
        d.behaviour = FakeBehaviour(delay_s=30.0)  # the one slot stays taken
        held = asyncio.ensure_future(c.client.post(c.url + "/generate", json=GEN))
        await _until(lambda: d.bodies, "the first request reached decode")
        async with asyncio.timeout(10):  # a hang guard: the queue timeout is 0.2 s
            async with c.client.post(c.url + "/generate", json=GEN) as r:
                assert r.status == 503 and r.headers.get("Retry-After") == "1"
                assert "no slot within 0.2s" in (await r.json())["error"]["message"]
        assert len(d.bodies) == 1  # the refused request never reached a worker
        assert c.service.admission.waiting == 0
        assert 'rejected_total{reason="queue"} 1.0' in c.service.metrics.render().decode()
        held.cancel()
        await asyncio.gather(held, return_exceptions=True)


async def test_a_queued_request_is_served_when_the_slot_frees_and_a_full_queue_refuses() -> None:
    # first_byte_timeout_s: the held decode is not probed (and retried) while the test runs
    async with router_cluster(max_concurrent_requests=1, queue_size=1, queue_timeout_s=30.0,
                              first_byte_timeout_s=60.0) as c:
        d = c.decodes[0]
        d.hung = True  # holds every answer until released below
        first = asyncio.ensure_future(c.client.post(c.url + "/generate", json=GEN))
        await _until(lambda: c.service.admission.active == c.service.admission.max_active, "the first took the slot")
        second = asyncio.ensure_future(c.client.post(c.url + "/generate", json=GEN))
        await _until(lambda: c.service.admission.waiting == 1, "the second is queued")
        # the queue (size 1) is full: a third is refused at once, not queued
        async with c.client.post(c.url + "/generate", json=GEN) as r:
            assert r.status == 503 and "queue is full" in await r.text()
        d.hung = False
        for task in (first, second):
            resp = await asyncio.wait_for(task, 10)
            assert resp.status == 200, await resp.text()
            resp.release()
        assert d.answered == 2 and c.service.admission.waiting == 0


# ---------------------------------------------------------------------- after the first byte
@pytest.mark.parametrize("path, body", [
    ("/generate", {"text": "hello", "stream": True, "sampling_params": {"max_new_tokens": 8}}),
    ("/v1/completions", {"model": "m", "prompt": "hello", "stream": True, "max_tokens": 8}),
    # migratable, but migration is off below
    ("/generate", {"input_ids": [1, 2, 3], "stream": True, "sampling_params": {"max_new_tokens": 8}}),
])
async def test_decode_breaking_mid_stream_ends_the_stream_with_an_error_event(path, body) -> None:
    async with router_cluster(max_migrations=0) as c:
        c.decodes[0].behaviour = FakeBehaviour(break_after=3)
        async with asyncio.timeout(20):
            async with c.client.post(c.url + path, json=body) as r:
                assert r.status == 200  # the first byte went out before the break
                got = await _events(r)
        assert [e["meta_info"]["completion_tokens"] for e in got[:-1]] == [1, 2, 3]
        assert got[-1]["error"]["code"] == 502 and "decode" in got[-1]["error"]["message"]
        # bytes were sent: no retry on another pair
        assert len(c.prefills[0].bodies) == 1 and len(c.decodes[0].bodies) == 1


@pytest.mark.parametrize("body", [
    {"text": "hello", "stream": True, "sampling_params": {"max_new_tokens": 8}},
    {"input_ids": [1, 2, 3], "stream": True, "sampling_params": {"max_new_tokens": 8}},
])
async def test_decode_going_silent_mid_stream_ends_in_an_error_not_a_hang(body) -> None:
    # a stream that cannot migrate (a text prompt, or migration off) and goes silent is ended by
    # the request timeout with an error event
    async with router_cluster(max_migrations=0, request_timeout_s=1.0,
                              first_byte_timeout_s=0.3, health_check_timeout_s=0.3) as c:
        c.decodes[0].behaviour = FakeBehaviour(hang_after=2)
        async with asyncio.timeout(20):
            async with c.client.post(c.url + "/generate", json=body) as r:
                assert r.status == 200
                got = await _events(r)
        assert [e["meta_info"]["completion_tokens"] for e in got[:-1]] == [1, 2]
        assert got[-1]["error"]["code"] == 504 and "timed out" in got[-1]["error"]["message"]


# ---------------------------------------------------------------------- health recovery
async def test_an_unhealthy_worker_comes_back_by_itself_when_health_passes() -> None:
    # the regular health interval is an hour: only the fast re-probe of unhealthy workers can
    # bring it back
    async with router_cluster(health_failure_threshold=1) as c:
        d = c.decodes[0]
        w = c.service.registry.find(d.url)
        assert w is not None
        d.healthy = False
        await c.service.monitor.check_health()
        assert not w.health_ok
        async with c.client.get(c.url + "/health") as r:
            assert r.status == 503  # no routable decode
        async with c.client.post(c.url + "/generate", json=GEN) as r:
            assert r.status >= 500 and d.bodies == []  # never sent to the unhealthy worker
        d.healthy = True
        await _until(lambda: w.health_ok, "the re-probe cleared the mark")
        async with c.client.get(c.url + "/health") as r:
            assert r.status == 200
        async with c.client.post(c.url + "/generate", json=GEN) as r:
            assert r.status == 200 and len(d.bodies) == 1


async def test_health_success_threshold_counts_consecutive_good_probes() -> None:
    async with router_cluster(health_failure_threshold=2, health_success_threshold=2) as c:
        d = c.decodes[0]
        w = c.service.registry.find(d.url)
        monitor = c.service.monitor
        await monitor.stop()  # probes by hand only
        d.healthy = False
        await monitor.check_health()
        assert w.health_ok  # one failure of the two needed
        await monitor.check_health()
        assert not w.health_ok
        d.healthy = True
        await monitor.recheck_unhealthy()
        assert not w.health_ok  # one good probe of the two needed
        d.healthy = False
        await monitor.recheck_unhealthy()
        d.healthy = True
        await monitor.recheck_unhealthy()
        assert not w.health_ok  # a failure in between restarts the count
        await monitor.recheck_unhealthy()
        assert w.health_ok and w.breaker.state(0.0) == "closed"
