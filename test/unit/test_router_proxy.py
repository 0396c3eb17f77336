"""The router's dual dispatch against scripted fake workers on loopback (no model): bootstrap
injection, decode streamed before prefill answers, retries with new rooms, circuit breaking,
timeouts, the bounded queue, client disconnects, worker admin and metrics."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import aiohttp
import orjson
import pytest
from aiohttp import web
from router_helpers import router_cluster

from sglang_pd_router.fake_worker import FakeBehaviour, FakeWorker
from sglang_pd_router.request_class import CLASS_HEADER, CLASS_TOKENS_HEADER

pytestmark = pytest.mark.timeout(60)

GEN = {"text": "hello there", "sampling_params": {"max_new_tokens": 3}}


@contextlib.asynccontextmanager
async def cluster(n_prefill: int = 1, n_decode: int = 1, **cfg_kw) -> AsyncIterator[tuple]:
    """router_helpers.router_cluster (the production runner), unpacked as these tests use it."""
    async with router_cluster(n_prefill, n_decode, **cfg_kw) as c:
        yield c.url, c.client, c.prefills, c.decodes, c.service


async def _events(resp: aiohttp.ClientResponse) -> list[dict]:
    text = (await resp.read()).decode()
    return [orjson.loads(line[5:]) for line in text.split("\n")
            if line.startswith("data:") and line[5:].strip() != "[DONE]"]


async def test_bootstrap_fields_and_keys_reach_both_workers() -> None:
    async with cluster(worker_api_key="sekret") as (url, client, (p,), (d,), _):
        rooms = []
        for _ in range(3):
            async with client.post(url + "/generate", json=GEN) as r:
                assert r.status == 200, await r.text()
                assert (await r.json())["meta_info"]["served_by"] == "decode"
        for pb, db in zip(p.bodies, d.bodies):
            assert pb == db  # the same body to both legs
            assert pb["bootstrap_host"] == "127.0.0.1" and pb["bootstrap_port"] == 9000
            assert 0 <= pb["bootstrap_room"] < 2**63 and pb["text"] == GEN["text"]
            rooms.append(pb["bootstrap_room"])
        assert len(set(rooms)) == 3
        assert all(h["Authorization"] == "Bearer sekret" for h in p.headers + d.headers)


async def test_stream_reaches_client_before_prefill_answers() -> None:
    async with cluster() as (url, client, (p,), (d,), _):
        p.behaviour = FakeBehaviour(delay_s=3.0)  # prefill answers late
        d.behaviour = FakeBehaviour(itl_s=0.01)
        async with client.post(url + "/generate", json={**GEN, "stream": True}) as r:
            assert r.status == 200
            first = await r.content.readline()
            # decode's first event is here while the prefill has not answered yet
            assert first.startswith(b"data: ") and p.answered == 0
            rest = await _events(r)
        assert rest[-1]["output_ids"] == [100, 101, 102]


async def test_non_stream_answers_without_waiting_for_prefill() -> None:
    async with cluster() as (url, client, (p,), (_d,), _):
        p.behaviour = FakeBehaviour(delay_s=3.0)
        async with client.post(url + "/generate", json=GEN) as r:
            assert r.status == 200 and p.answered == 0
            assert (await r.json())["output_ids"] == [100, 101, 102]


@pytest.mark.parametrize("failure", [FakeBehaviour(status=503),
                                     FakeBehaviour(drop_connection=True)])
async def test_failed_prefill_is_retried_on_the_other_with_a_new_room(failure) -> None:
    async with cluster(n_prefill=2, prefill_policy="round_robin") as (url, client, ps, (d,), svc):
        ps[0].behaviour = failure
        d.behaviour = FakeBehaviour(delay_s=0.2)  # a real decode waits for the KV
        for _ in range(4):
            async with client.post(url + "/generate", json=GEN) as r:
                assert r.status == 200, await r.text()
        # every try at the broken prefill was followed by one at the good one, new room each
        rooms = [b["bootstrap_room"] for b in d.bodies]
        assert len(set(rooms)) == len(rooms) and ps[1].answered == 4
        assert b"sglang_pd_router_retries_total" in svc.metrics.render()


async def test_decode_failures_are_retried_and_error_events_too() -> None:
    async with cluster(n_decode=2, decode_policy="round_robin") as (url, client, _, ds, _s):
        ds[0].behaviour = FakeBehaviour(stream_error_code=502)
        for _ in range(2):
            async with client.post(url + "/generate", json={**GEN, "stream": True}) as r:
                events = await _events(r)
                assert r.status == 200 and "error" not in events[0], events
        ds[0].behaviour = FakeBehaviour(drop_connection=True)
        async with client.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}) as r:
            assert r.status == 200, await r.text()


async def test_kv_failure_before_the_prefill_answers_is_not_decodes_fault() -> None:
    """Issue 32: a decode that fails its room (its stream's first event a KV-transfer error)
    while the prefill is still computing did nothing wrong: the request is retried with a new
    room and decode's circuit stays closed; once the prefill has answered (its KV sent), the
    same failure is decode's."""
    async with cluster(n_prefill=2, n_decode=2, prefill_policy="round_robin",
                       decode_policy="round_robin", cb_failure_threshold=1,
                       cb_timeout_s=3600) as (url, client, ps, ds, svc):
        for p in ps:
            p.behaviour = FakeBehaviour(delay_s=1.0)  # still prefilling when decode gives up
        ds[0].behaviour = FakeBehaviour(stream_error_code=502)
        async with client.post(url + "/generate", json={**GEN, "stream": True}) as r:
            events = await _events(r)
            assert r.status == 200 and "error" not in events[0], events
        assert len(ds[0].bodies) == 1 and len(ds[1].bodies) == 1
        assert ds[0].bodies[0]["bootstrap_room"] != ds[1].bodies[0]["bootstrap_room"]
        victim = svc.registry.find(ds[0].url)
        assert victim.breaker.failures == 0 and victim.routable(time.monotonic())
        for p in ps:
            p.behaviour = FakeBehaviour()  # answers at once: the KV is on its way
        ds[0].behaviour = FakeBehaviour(stream_error_code=502, delay_s=0.3)
        for _ in range(2):  # round robin: one of the two lands on decode 0
            async with client.post(url + "/generate", json={**GEN, "stream": True}) as r:
                assert r.status == 200 and "error" not in (await _events(r))[0]
        assert victim.breaker.failures == 1 and not victim.routable(time.monotonic())


async def test_prefill_4xx_is_the_clients_error_and_not_retried() -> None:
    async with cluster(n_prefill=2) as (url, client, ps, (d,), _):
        for p in ps:
            p.behaviour = FakeBehaviour(status=400)
        d.behaviour = FakeBehaviour(delay_s=5.0)  # decode would wait for KV that never comes
        async with client.post(url + "/generate", json=GEN) as r:
            assert r.status == 400
        assert len(ps[0].bodies) + len(ps[1].bodies) == 1


async def test_everything_down_answers_an_error_not_a_hang() -> None:
    async with cluster(max_retries=2) as (url, client, (p,), (d,), _):
        d.behaviour = FakeBehaviour(status=502)
        async with client.post(url + "/generate", json=GEN) as r:
            assert r.status == 502 and "fake decode failure" in await r.text()
        assert len(d.bodies) == 3  # one try and two retries
        await p.stop()
        d.behaviour = FakeBehaviour()
        async with client.post(url + "/generate", json=GEN) as r:
            assert r.status == 502 and "prefill" in (await r.json())["error"]["message"]


async def test_circuit_breaker_stops_sending_to_a_failing_worker() -> None:
    async with cluster(n_prefill=2, prefill_policy="round_robin", cb_failure_threshold=2,
                       cb_timeout_s=3600) as (url, client, ps, _, svc):
        ps[0].behaviour = FakeBehaviour(status=503)
        for _ in range(6):
            async with client.post(url + "/generate", json=GEN) as r:
                assert r.status == 200
        assert len(ps[0].bodies) == 2  # opened after two failures, then skipped
        bad = svc.registry.find(ps[0].url)
        assert bad is not None and bad.breaker.state(0.0 + 1e9) == "half_open"


async def test_request_timeout_gives_504() -> None:
    async with cluster(request_timeout_s=0.5) as (url, client, _, (d,), _s):
        d.behaviour = FakeBehaviour(delay_s=10.0)
        async with client.post(url + "/generate", json=GEN) as r:
            assert r.status == 504 and "timed out" in await r.text()
        for _ in range(100):  # the abandoned decode leg was closed, so the worker saw it go
            if d.cancelled:
                break
            await asyncio.sleep(0.02)
        assert d.cancelled == 1


async def test_full_queue_answers_503() -> None:
    async with cluster(max_concurrent_requests=1, queue_size=0) as (url, client, _, (d,), _s):
        d.behaviour = FakeBehaviour(delay_s=1.0)
        slow = asyncio.ensure_future(client.post(url + "/generate", json=GEN))
        while not d.bodies:
            await asyncio.sleep(0.01)
        async with client.post(url + "/generate", json=GEN) as r:
            assert r.status == 503 and r.headers.get("Retry-After") == "1"
        resp = await slow
        assert resp.status == 200
        resp.release()


async def test_client_disconnect_cancels_both_legs() -> None:
    async with cluster() as (url, client, (p,), (d,), svc):
        p.behaviour = FakeBehaviour(delay_s=30.0)
        d.behaviour = FakeBehaviour(itl_s=5.0)
        r = await client.post(url + "/generate", json={**GEN, "stream": True})
        await r.content.readline()
        r.close()  # the client goes away mid-stream
        for _ in range(200):
            if p.cancelled and d.cancelled:
                break
            await asyncio.sleep(0.02)
        assert (p.cancelled, d.cancelled) == (1, 1)
        worker = svc.registry.find(p.url)
        assert worker is not None and worker.in_flight == 0


async def test_length_aware_routes_by_class_and_adopts_workers_threshold() -> None:
    async with cluster(n_prefill=2) as (url, client, ps, (d,), svc):
        for p, role in zip(ps, ("short", "long")):
            p.server_info = {"prefill_role": role, "short_prefill_threshold": 8}
            await svc.monitor.discover(svc.registry.find(p.url))
        assert svc.threshold == 8
        short = {"input_ids": list(range(8)), "sampling_params": {"max_new_tokens": 1}}
        long_ = {"input_ids": list(range(9)), "sampling_params": {"max_new_tokens": 1}}
        for body in (short, long_, short, short, long_):
            async with client.post(url + "/generate", json=body) as r:
                assert r.status == 200
        assert [len(b["input_ids"]) for b in ps[0].bodies] == [8, 8, 8]
        assert [len(b["input_ids"]) for b in ps[1].bodies] == [9, 9]
        # both legs carry our class and the count it used (request_class.py), for the servers
        for p, cls, n in ((ps[0], "short", "8"), (ps[1], "long", "9")):
            assert {(h[CLASS_HEADER], h[CLASS_TOKENS_HEADER]) for h in p.headers} == {(cls, n)}
        assert {h[CLASS_HEADER] for h in d.headers} == {"short", "long"}
        text = svc.metrics.render().decode()
        assert 'sglang_pd_router_added_latency_seconds_count{request_class="short"} 3.0' in text
        assert 'sglang_pd_router_added_latency_seconds_count{request_class="long"} 2.0' in text


async def test_slo_defaults_per_class_only_when_client_sent_none() -> None:
    async with cluster(short_prefill_threshold=4,
                       slo_ttft_ms={"short": 100.0, "long": 2000.0}) as (url, client, (p,), _, _s):
        await client.post(url + "/generate", json={"input_ids": [1, 2], "sampling_params": {}})
        await client.post(url + "/generate", json={"input_ids": [1] * 9, "sampling_params": {}})
        await client.post(url + "/generate", json={"input_ids": [1], "slo": {"ttft_ms": 7}})
        assert [b.get("slo") for b in p.bodies] == [
            {"ttft_ms": 100.0}, {"ttft_ms": 2000.0}, {"ttft_ms": 7}]


async def test_batches_and_bad_bodies_are_refused_clearly() -> None:
    async with cluster() as (url, client, (p,), _, _s):
        async with client.post(url + "/generate", json={"text": ["a", "b"]}) as r:
            assert r.status == 400 and "one request per prompt" in await r.text()
        async with client.post(url + "/generate", data=b"{nope") as r:
            assert r.status == 400 and "not JSON" in await r.text()
        assert p.bodies == []


async def test_prompt_logprobs_merged_from_prefill() -> None:
    async with cluster() as (url, client, (p,), (_d,), svc):
        original = p._generate

        async def with_logprobs(request: web.Request) -> web.Response:
            resp = await original(request)
            body = orjson.loads(resp.body)
            body["meta_info"]["input_token_logprobs"] = [[None, 1, None], [-0.5, 2, None]]
            return web.json_response(body)

        p._generate = with_logprobs  # type: ignore[method-assign]
        # rebuild the fake's routes with the patched handler
        await p.stop()
        await p.start()
        svc.registry.by_kind["prefill"][0].url = p.url
        async with client.post(url + "/generate", json={**GEN, "return_logprob": True}) as r:
            meta = (await r.json())["meta_info"]
        assert meta["input_token_logprobs"][1] == [-0.5, 2, None]


async def test_workers_admin_needs_the_key_and_changes_routing() -> None:
    async with cluster(api_key="adm") as (url, client, (p,), (d,), _):
        async with client.get(url + "/workers") as r:
            assert r.status == 401
        auth = {"Authorization": "Bearer adm"}
        extra = FakeWorker("decode")
        await extra.start()
        try:
            async with client.post(url + "/workers", headers=auth,
                                   json={"url": extra.url, "kind": "decode"}) as r:
                assert r.status == 200, await r.text()
            async with client.post(url + "/workers", headers=auth,
                                   json={"url": extra.url, "kind": "decode"}) as r:
                assert r.status == 409
            async with client.delete(url + "/workers", headers=auth,
                                     params={"url": d.url}) as r:
                assert r.status == 200
            async with client.get(url + "/workers", headers=auth) as r:
                listed = [w["url"] for w in (await r.json())["workers"]]
            assert listed == [p.url, extra.url]
            async with client.post(url + "/generate", json=GEN, headers=auth) as r:
                assert r.status == 200
            assert len(extra.bodies) == 1 and d.bodies == []
        finally:
            await extra.stop()


async def test_health_models_and_metrics_routes() -> None:
    async with cluster() as (url, client, _, (d,), svc):
        async with client.get(url + "/health") as r:
            assert r.status == 200 and (await r.json())["healthy_workers"] == 2
        async with client.get(url + "/v1/models") as r:
            assert (await r.json())["data"][0]["id"] == "fake-model"
        d.healthy = False
        for _ in range(svc.cfg.health_failure_threshold):
            await svc.monitor.check_health()
        async with client.get(url + "/health") as r:
            assert r.status == 503
        async with client.post(url + "/generate", json=GEN) as r:
            assert r.status == 503 and "no healthy decode" in await r.text()
        async with client.get(url + "/metrics") as r:
            text = await r.text()
        assert 'sglang_pd_router_workers_healthy{kind="decode"} 0.0' in text


def test_circuit_breaker_states() -> None:
    from sglang_pd_router.workers import CircuitBreaker

    cb = CircuitBreaker(threshold=2, open_s=10.0)
    cb.on_failure(0.0)
    assert cb.state(0.0) == "closed" and cb.allows(0.0)
    cb.on_failure(1.0)
    assert cb.state(5.0) == "open" and not cb.allows(5.0)
    assert cb.state(11.0) == "half_open" and cb.allows(11.0)
    cb.on_pick(11.0)
    assert not cb.allows(12.0)  # one trial at a time
    assert cb.allows(22.0)  # a trial that never reported back expires
    cb.on_failure(23.0)
    assert cb.state(24.0) == "open"
    cb.on_success()
    assert cb.state(24.0) == "closed"
