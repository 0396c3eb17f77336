"""The pool controller on real servers (issue 17, controller bar): 2 short-role and 1 long-role
prefill + 1 decode behind our router. A burst of long prompts moves one instance from the short
pool to the long pool (drained, then switched with the server's POST /set_prefill_role); once
the burst is over, short traffic missing its TTFT SLO moves one back."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from pd_utils import (ROUTER_ADMIN_HEADERS, async_client, load, start_mixed, start_pd_router,
                      stop_all)

pytestmark = pytest.mark.timeout(300)

THRESHOLD = 32
SAMPLING = {"max_new_tokens": 2, "temperature": 0, "ignore_eos": True}
LONG = {"input_ids": [3 + (j * 7919) % 6000 for j in range(1000)], "sampling_params": SAMPLING}
SHORT = {"input_ids": [3 + (j * 31) % 500 for j in range(12)], "sampling_params": SAMPLING}


def _pools(router_url: str) -> dict[str, int]:
    return httpx.get(router_url + "/workers", timeout=10, headers=ROUTER_ADMIN_HEADERS).json()["pools"]


async def _until_pools(client: httpx.AsyncClient, router_url: str, want: dict[str, int],
                       body: dict, concurrency: int, limit_s: float) -> int:
    """Keep ``concurrency`` requests of ``body`` in flight until the router's pools are
    ``want``; answers how many were sent. Fails after ``limit_s``."""
    deadline = time.monotonic() + limit_s
    sent = 0

    async def worker() -> None:
        nonlocal sent
        while time.monotonic() < deadline and _pools(router_url) != want:
            sent += 1
            r = await client.post(router_url + "/generate", json=body)
            assert r.status_code == 200, r.text

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    assert _pools(router_url) == want, (_pools(router_url), sent)
    return sent


def test_long_burst_moves_a_short_instance_and_it_comes_back(tiny_model_dir, tmp_path) -> None:
    role = ("--short-prefill-threshold", str(THRESHOLD), "--prefill-role")
    prefills, decodes = start_mixed(tiny_model_dir, tmp_path,
                                    [(*role, "short"), (*role, "short"), (*role, "long")], 1)
    router = None
    try:
        # short prompts carry a 1 ms TTFT SLO (always missed: short pressure once they flow),
        # long ones 10 minutes (never missed): the queue moves the first instance, SLO misses
        # move one back
        router = start_pd_router(
            prefills, decodes, tmp_path, "--controller-period-s", "0.5",
            "--controller-cooldown-s", "3", "--controller-queue-ref-s", "0.5", "0.5",
            "--load-poll-interval-secs", "0.25", "--slo-ttft-ms", "1", "600000",
            "--drain-timeout-s", "30")
        url = router.base_url
        assert _pools(url) == {"short": 2, "long": 1, "both": 0}

        async def run() -> tuple[int, int]:
            async with async_client(timeout=120) as client:
                burst = await _until_pools(client, url, {"short": 1, "long": 2, "both": 0},
                                           LONG, 12, 90)
                after = await _until_pools(client, url, {"short": 2, "long": 1, "both": 0},
                                           SHORT, 4, 90)
                return burst, after

        burst, after = asyncio.run(run())
        print(f"moved to long after {burst} long requests, back after {after} short ones")
        roles = [load(p.base_url)["prefill_role"] for p in prefills]
        assert sorted(roles) == ["long", "short", "short"], roles  # the servers switched too
        metrics = httpx.get(url + "/metrics", timeout=10, headers=ROUTER_ADMIN_HEADERS).text
        assert 'from_role="short",outcome="switched",to_role="long"' in metrics
        assert 'from_role="long",outcome="switched",to_role="short"' in metrics
    finally:
        if router is not None:
            router.stop()
        stop_all(prefills, decodes)
