"""The router's security model (docs/router.md): admin routes off unless an admin key is set,
--api-key on every client route but /health, /metrics keyable, worker URLs validated and
probed before they get traffic, and the router refusing itself as a worker (issue 35)."""

from __future__ import annotations

import pytest

from router_helpers import GEN, router_cluster
from sglang_pd_router.fake_worker import FakeWorker
from sglang_pd_router.guard import HOP_HEADER

pytestmark = pytest.mark.timeout(60)
ADMIN = {"Authorization": "Bearer adm"}


@pytest.mark.parametrize("cfg", [{}, {"worker_api_key": "wk"}])
async def test_admin_api_is_off_without_an_admin_key(cfg: dict) -> None:
    async with router_cluster(**cfg) as c:
        extra = FakeWorker("decode")
        await extra.start()
        try:
            async with c.client.get(c.url + "/workers") as r:
                assert r.status == 403 and "admin API is off" in (await r.json())["error"]["message"]
            async with c.client.post(c.url + "/workers",
                                     json={"url": extra.url, "kind": "decode"}) as r:
                assert r.status == 403
            assert len(c.service.registry.by_kind["decode"]) == 1 and extra.headers == []
        finally:
            await extra.stop()


async def test_api_key_guards_every_client_route_but_health() -> None:
    async with router_cluster(api_key="k", metrics_api_key="scrape") as c:
        for method, path in (("POST", "/generate"), ("POST", "/v1/completions"),
                             ("POST", "/v1/chat/completions"), ("GET", "/v1/models"),
                             ("GET", "/get_model_info"), ("GET", "/metrics"),
                             ("GET", "/workers")):
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                async with c.client.request(method, c.url + path, json=GEN,
                                            headers=headers) as r:
                    assert r.status == 401, (method, path, headers)
        async with c.client.get(c.url + "/health") as r:
            assert r.status == 200
        ok = {"Authorization": "Bearer k"}
        async with c.client.post(c.url + "/generate", json=GEN, headers=ok) as r:
            assert r.status == 200
        async with c.client.get(c.url + "/v1/models", headers=ok) as r:
            assert r.status == 200
        async with c.client.get(c.url + "/metrics",
                                headers={"Authorization": "Bearer scrape"}) as r:
            assert r.status == 200
        async with c.client.get(c.url + "/workers", headers=ok) as r:
            assert r.status == 200  # --api-key is the admin key when no --admin-api-key
        assert c.decodes[0].bodies and all(h["Authorization"] == "Bearer k"
                                           for h in c.decodes[0].headers)


async def test_a_separate_admin_key_and_open_generation() -> None:
    async with router_cluster(admin_api_key="adm") as c:
        async with c.client.post(c.url + "/generate", json=GEN) as r:
            assert r.status == 200  # no --api-key: generation is open
        async with c.client.get(c.url + "/workers") as r:
            assert r.status == 401
        async with c.client.get(c.url + "/metrics") as r:
            assert r.status == 401  # a configured key closes /metrics
        async with c.client.get(c.url + "/workers", headers=ADMIN) as r:
            assert r.status == 200


@pytest.mark.parametrize("url", ["http://", "http://127.0.0.1:99999", "http://127.0.0.1:abc",
                                 "http://a b:80", "http://[::1", "ftp://127.0.0.1:80",
                                 "http://127.0.0.1:80/path", 5, None])
async def test_malformed_worker_urls_are_400(url: object) -> None:
    async with router_cluster(admin_api_key="adm") as c:
        async with c.client.post(c.url + "/workers", headers=ADMIN,
                                 json={"url": url, "kind": "decode"}) as r:
            assert r.status == 400, await r.text()
        assert len(c.service.registry.by_kind["decode"]) == 1


async def test_a_worker_is_probed_before_it_gets_traffic() -> None:
    async with router_cluster(admin_api_key="adm") as c:
        dead = FakeWorker("decode")
        await dead.start()
        dead_url = dead.url
        await dead.stop()  # nothing listens there now
        async with c.client.post(c.url + "/workers", headers=ADMIN,
                                 json={"url": dead_url, "kind": "decode"}) as r:
            assert r.status == 502 and "not registered" in (await r.json())["error"]["message"]
        wrong_role = FakeWorker("decode", server_info={"disaggregation_mode": "prefill"})
        wrong_port = FakeWorker("prefill", server_info={"disaggregation_mode": "prefill",
                                                        "disaggregation_bootstrap_port": 8998})
        for w in (wrong_role, wrong_port):
            await w.start()
        try:
            async with c.client.post(c.url + "/workers", headers=ADMIN,
                                     json={"url": wrong_role.url, "kind": "decode"}) as r:
                assert r.status == 400 and "prefill server" in await r.text()
            async with c.client.post(c.url + "/workers", headers=ADMIN,
                                     json={"url": wrong_port.url, "kind": "prefill",
                                           "bootstrap_port": 9999}) as r:
                assert r.status == 400 and "bootstrap port is 8998" in await r.text()
            for _ in range(4):
                async with c.client.post(c.url + "/generate", json=GEN) as r:
                    assert r.status == 200
            assert wrong_role.bodies == [] and wrong_port.bodies == []
        finally:
            for w in (wrong_role, wrong_port):
                await w.stop()


async def test_misconfigured_startup_worker_is_never_routed_to() -> None:
    async with router_cluster(n_decode=2) as c:
        bad = c.decodes[1]
        bad.server_info = {"disaggregation_mode": "prefill"}
        worker = c.service.registry.find(bad.url)
        await c.service.monitor.discover(worker)
        assert worker.misconfigured and not worker.describe(0)["routable"]
        for _ in range(6):
            async with c.client.post(c.url + "/generate", json=GEN) as r:
                assert r.status == 200
        assert bad.bodies == []


async def test_the_router_refuses_itself() -> None:
    async with router_cluster(admin_api_key="adm") as c:
        async with c.client.post(c.url + "/workers", headers=ADMIN,
                                 json={"url": c.url, "kind": "decode"}) as r:
            assert r.status == 400 and "this router itself" in await r.text()
        own = {HOP_HEADER: c.service.guard.router_id}
        async with c.client.post(c.url + "/generate", json=GEN, headers=own) as r:
            assert r.status == 508
        # registered anyway (e.g. on the command line): its own legs come back as 508
        c.service.registry.add(c.url, "decode")
        for w in c.service.registry.by_kind["decode"][:1]:
            c.service.registry.remove(w.url)
        async with c.client.post(c.url + "/generate", json=GEN) as r:
            assert r.status in (502, 508, 503)
        assert c.decodes[0].bodies == []
