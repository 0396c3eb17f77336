"""The collector's young-generation passes moved to the router's idle moments.

With the start-up heap frozen and a first generation of 20,000 objects (server.py), an
automatic collection runs every few dozen requests and takes ~0.1 ms (wave 3 session 7's
measure), inside whichever request allocated past the threshold: at low load, on the first
byte's path of about one request in fifty, which is the p99. When the last request in flight
ends with a quarter of the threshold allocated, ``IdleCollector`` collects soon after (a
timer, so the answer's last write goes first), if the router is still idle then: the
request path then rarely meets the threshold. Under load (never idle) the automatic
collections run as before. The generation collected is the one the automatic pass would take
(the oldest whose count is over its threshold), so older generations are still collected and
garbage in cycles is freed as before."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable

IDLE_GC_FRACTION = 0.25  # of the first generation's threshold: below it, nothing to gain
IDLE_GC_DELAY_S = 0.001  # after the last request ended: its answer's writes go first


class IdleCollector:
    def __init__(self, busy: Callable[[], bool]) -> None:
        self.busy = busy  # requests in flight or queued
        self._pending: asyncio.TimerHandle | None = None
        self.collections = 0

    def request_ended(self) -> None:
        """Called as each request ends; cheap when there is nothing to do."""
        if self._pending is not None or self.busy():
            return
        threshold = gc.get_threshold()[0]
        if threshold <= 0 or gc.get_count()[0] < threshold * IDLE_GC_FRACTION:
            return  # also: automatic collection off (threshold 0), nothing of ours to do
        self._pending = asyncio.get_running_loop().call_later(IDLE_GC_DELAY_S, self._collect)

    def _collect(self) -> None:
        self._pending = None
        if self.busy() or not gc.isenabled():
            return
        counts, thresholds = gc.get_count(), gc.get_threshold()
        # the oldest generation over its threshold, as CPython's automatic pass picks it
        # (without its rule that defers a full pass while few long-lived objects are new: a
        # full pass here runs while nothing waits on it)
        generation = next((g for g in (2, 1) if counts[g] > thresholds[g]), 0)
        gc.collect(generation)
        self.collections += 1

    def close(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
