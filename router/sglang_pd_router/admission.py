"""The router's bounded admission: a request either gets a slot, waits in a bounded queue for
one, or is refused at once (503) rather than piling up. Waiters are served in the order of
their keys (``policies/queue_order.py``: arrival, or TTFT deadline)."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from typing import Any


class QueueFull(Exception):
    pass


class Admission:
    """At most ``max_active`` requests served at once, at most ``queue_size`` waiting (for at
    most ``timeout_s``); past either the router answers 503 at once rather than piling up.
    A freed slot goes straight to the waiter with the smallest key (no free-slot race)."""

    def __init__(self, max_active: int, queue_size: int, timeout_s: float,
                 on_waiting: Callable[[int], None] = lambda n: None) -> None:
        self.max_active = max_active
        self.active = 0
        self.queue_size = queue_size
        self.timeout_s = timeout_s
        self.waiting = 0
        self.on_waiting = on_waiting  # the queued-requests gauge
        self._heap: list[tuple[Any, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    async def acquire(self, key: Any = None) -> None:
        """A slot now, or after the waiters with smaller keys (``None``: arrival order)."""
        seq = next(self._seq)
        if self.active < self.max_active and not self.waiting:
            self.active += 1
            return
        if self.waiting >= self.queue_size:
            raise QueueFull("the router's queue is full")
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._heap, (seq if key is None else key, seq, fut))
        self.waiting += 1
        self.on_waiting(self.waiting)
        try:
            await asyncio.wait_for(asyncio.shield(fut), self.timeout_s)
        except asyncio.TimeoutError:
            if fut.done() and not fut.cancelled():
                return  # handed a slot just as the wait ran out: keep it
            fut.cancel()  # release() skips it
            raise QueueFull(f"no slot within {self.timeout_s:g}s") from None
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # the client left after its slot was handed over
            fut.cancel()
            raise
        finally:
            self.waiting -= 1
            self.on_waiting(self.waiting)

    def release(self) -> None:
        """Hand the slot to the first live waiter, else free it."""
        while self._heap:
            _, _, fut = heapq.heappop(self._heap)
            if not fut.done():
                fut.set_result(None)
                return
        self.active -= 1
