"""The router's bounded admission: a request either gets a slot, waits in a bounded queue for
one, or is refused at once (503) rather than piling up."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class QueueFull(Exception):
    pass


class Admission:
    """At most ``max_active`` requests served at once, at most ``queue_size`` waiting (for at
    most ``timeout_s``); past either the router answers 503 at once rather than piling up."""

    def __init__(self, max_active: int, queue_size: int, timeout_s: float,
                 on_waiting: Callable[[int], None] = lambda n: None) -> None:
        self.slots = asyncio.Semaphore(max_active)
        self.queue_size = queue_size
        self.timeout_s = timeout_s
        self.waiting = 0
        self.on_waiting = on_waiting  # the queued-requests gauge

    async def acquire(self) -> None:
        if not self.slots.locked():
            await self.slots.acquire()
            return
        if self.waiting >= self.queue_size:
            raise QueueFull("the router's queue is full")
        self.waiting += 1
        self.on_waiting(self.waiting)
        try:
            await asyncio.wait_for(self.slots.acquire(), self.timeout_s)
        except asyncio.TimeoutError:
            raise QueueFull(f"no slot within {self.timeout_s:g}s") from None
        finally:
            self.waiting -= 1
            self.on_waiting(self.waiting)

    def release(self) -> None:
        self.slots.release()
