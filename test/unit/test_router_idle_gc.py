"""IdleCollector (router/sglang_pd_router/idle_gc.py): a young-generation collection runs once
the router is idle with enough allocated, never while a request is in flight, and the older
generations are still collected when their counts call for it."""

from __future__ import annotations

import asyncio
import gc

from sglang_pd_router.idle_gc import IDLE_GC_DELAY_S, IdleCollector


def _allocate(n: int) -> list[list[int]]:
    return [[i] for i in range(n)]  # tracked containers: each counts in generation 0


def _run(body) -> None:
    old = gc.get_threshold()
    gc.set_threshold(4_000, 5, 5)
    try:
        asyncio.run(body())
    finally:
        gc.set_threshold(*old)


def test_collects_when_idle_and_not_when_busy() -> None:
    busy = {"now": False}
    collector = IdleCollector(lambda: busy["now"])

    async def body() -> None:
        keep = _allocate(2_000)  # over a quarter of the 4,000 threshold
        assert gc.get_count()[0] >= 1_000
        busy["now"] = True
        collector.request_ended()  # another request is in flight: nothing scheduled
        await asyncio.sleep(IDLE_GC_DELAY_S * 20)
        assert collector.collections == 0
        busy["now"] = False
        collector.request_ended()
        collector.request_ended()  # one pending collection at most
        await asyncio.sleep(IDLE_GC_DELAY_S * 20)
        assert collector.collections == 1
        assert gc.get_count()[0] < 1_000  # generation 0 was collected
        del keep

    _run(body)


def test_busy_again_before_the_timer_skips_the_collection() -> None:
    busy = {"now": False}
    collector = IdleCollector(lambda: busy["now"])

    async def body() -> None:
        keep = _allocate(2_000)
        collector.request_ended()
        busy["now"] = True  # a request arrived before the timer fired
        await asyncio.sleep(IDLE_GC_DELAY_S * 20)
        assert collector.collections == 0
        del keep

    _run(body)


def test_older_generations_are_collected_when_due() -> None:
    collector = IdleCollector(lambda: False)
    seen: list[int] = []

    def note(phase: str, info: dict) -> None:
        if phase == "start":
            seen.append(info["generation"])

    async def body() -> None:
        gc.collect()
        keep = []
        gc.callbacks.append(note)
        try:
            for _ in range(40):  # more young passes than generation 1's threshold (5)
                keep.append(_allocate(1_500))
                collector.request_ended()
                await asyncio.sleep(IDLE_GC_DELAY_S * 5)
        finally:
            gc.callbacks.remove(note)
        assert collector.collections > 0
        assert 1 in seen or 2 in seen  # not generation 0 forever
        del keep

    _run(body)
