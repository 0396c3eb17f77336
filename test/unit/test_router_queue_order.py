"""The router's pending queue (admission.py) served by ``--queue-order``: fifo keeps arrival
order, edf (Dynamo-style) hands a freed slot to the earliest TTFT deadline; bounds and
timeouts hold for both."""

from __future__ import annotations

import asyncio

import pytest
from sglang_pd_router.admission import Admission, QueueFull
from sglang_pd_router.cli import build_parser, config_from_args
from sglang_pd_router.policies.queue_order import create_queue_order


def test_edf_key_is_arrival_plus_slo_and_no_slo_ranks_last() -> None:
    edf = create_queue_order("edf", no_slo_s=30.0)
    assert edf.key(10.0, 0.5, 3) == (10.5, 3)
    assert edf.key(10.0, None, 4) == (40.0, 4)
    assert edf.key(10.0, float("nan"), 5) == (40.0, 5)
    assert create_queue_order("fifo").key(10.0, 0.5, 3) == (10.0, 3)
    with pytest.raises(ValueError, match="unknown queue order"):
        create_queue_order("lifo")


async def _served_order(order: str, reqs: list[tuple[str, float, float | None]]) -> list[str]:
    """One slot held; ``reqs`` (name, arrival, slo) queue behind it; the slot is then passed
    on one request at a time. Returns the names in the order they got it."""
    adm = Admission(1, 16, 5.0)
    q = create_queue_order(order)
    await adm.acquire()
    served: list[str] = []

    async def client(i: int, name: str, arrival: float, slo: float | None) -> None:
        await adm.acquire(q.key(arrival, slo, i))
        served.append(name)
        await asyncio.sleep(0)
        adm.release()

    tasks = [asyncio.create_task(client(i, *r)) for i, r in enumerate(reqs)]
    await asyncio.sleep(0.01)  # all queued
    assert adm.waiting == len(reqs)
    adm.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert adm.active == 0 and adm.waiting == 0
    return served


REQS = [("long", 0.0, 10.0), ("nosla", 0.1, None), ("short", 0.2, 0.5), ("short2", 0.3, 0.5)]


def test_fifo_serves_in_arrival_order() -> None:
    assert asyncio.run(_served_order("fifo", REQS)) == ["long", "nosla", "short", "short2"]


def test_edf_serves_the_earliest_deadline_first() -> None:
    assert asyncio.run(_served_order("edf", REQS)) == ["short", "short2", "long", "nosla"]


def test_bounds_and_timeouts_still_hold() -> None:
    async def run() -> None:
        adm = Admission(1, 1, 0.05)
        await adm.acquire()
        waiter = asyncio.create_task(adm.acquire((1.0, 0)))
        await asyncio.sleep(0.01)
        with pytest.raises(QueueFull, match="queue is full"):
            await adm.acquire((0.0, 1))
        with pytest.raises(QueueFull, match="no slot within"):
            await waiter
        adm.release()  # the timed-out waiter is skipped: the slot is free again
        assert adm.active == 0
        await asyncio.wait_for(adm.acquire(), 1)  # at once
        assert adm.active == 1

    asyncio.run(run())


def test_cli_queue_order_flag() -> None:
    base = ["--prefill", "http://127.0.0.1:1", "--decode", "http://127.0.0.1:2"]
    assert config_from_args(build_parser().parse_args(base)).queue_order == "fifo"
    cfg = config_from_args(build_parser().parse_args([*base, "--queue-order", "edf"]))
    assert cfg.queue_order == "edf"
