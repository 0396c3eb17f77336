"""A hung decode on a real PD cluster (issue 35 bar): SIGSTOP one of two decodes; every request
ends (answered by the other decode) within the KV deadline plus a retry, the stopped decode's
circuit opens and the prefill's does not; after SIGCONT the first good probe clears it."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import pytest

from pd_utils import ROUTER_ADMIN_HEADERS, _descendants, async_client, routed_cluster, wait_until

pytestmark = pytest.mark.timeout(300)

DEADLINE_S = 5.0
BOUND_S = DEADLINE_S + 7.0  # the deadline, a 2 s probe, a retry's prefill and decode
SAMPLING = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}


@pytest.fixture
def cluster(tiny_model_dir, tmp_path):
    flags = ("--decode-policy", "round_robin", "--pool-controller", "off",
             "--kv-deadline-secs", str(DEADLINE_S), "--first-byte-timeout-secs", str(DEADLINE_S),
             "--health-check-interval-secs", "1", "--health-check-timeout-secs", "1",
             "--health-failure-threshold", "2")
    with routed_cluster(tiny_model_dir, tmp_path, [()], 2, flags) as (router, prefills, decodes):
        try:
            yield router, prefills, decodes
        finally:  # a stopped decode must run again to drain
            for d in decodes:
                _signal_tree(d.proc.pid, signal.SIGCONT)


def _signal_tree(pid: int, sig: int) -> None:
    for p in _descendants(pid) + [pid]:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


def _workers(router) -> dict[str, dict]:
    r = httpx.get(router.base_url + "/workers", headers=ROUTER_ADMIN_HEADERS, timeout=10)
    return {w["url"]: w for w in r.json()["workers"]}


def test_a_stopped_decode_costs_a_deadline_and_a_retry(cluster) -> None:
    router, (prefill,), (victim, _survivor) = cluster
    _signal_tree(victim.proc.pid, signal.SIGSTOP)
    bodies = [{"input_ids": [3 + (j * (7 + i)) % 500 for j in range(20)],
               "sampling_params": SAMPLING, "stream": i % 2 == 1} for i in range(8)]

    async def one(client, body):
        t0 = time.monotonic()
        r = await client.post(router.base_url + "/generate", json=body)
        return r.status_code, time.monotonic() - t0

    async def run():
        async with async_client(timeout=120) as client:
            return await asyncio.gather(*(one(client, b) for b in bodies))

    results = asyncio.run(run())
    print("status, seconds:", [(s, round(t, 1)) for s, t in results])
    assert all(status == 200 for status, _ in results)
    assert max(t for _, t in results) < BOUND_S
    workers = _workers(router)
    assert workers[victim.base_url]["circuit"] == "open"
    assert workers[prefill.base_url]["circuit"] == "closed"
    _signal_tree(victim.proc.pid, signal.SIGCONT)
    t0 = time.monotonic()
    wait_until(lambda: _workers(router)[victim.base_url]["routable"], 10,
               "the resumed decode to be routable again")
    print(f"routable again {time.monotonic() - t0:.1f} s after SIGCONT")
