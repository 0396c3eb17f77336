"""``timeout``: ``asyncio.timeout`` (a cancel scope, no extra task) where Python has it (3.11+),
and the same scope built from ``call_later`` on 3.10, which the router still supports (mypy
found the 3.11-only call: on 3.10 every proxied request failed with AttributeError)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager


@asynccontextmanager
async def call_later_timeout(delay: float | None) -> AsyncIterator[None]:
    """The 3.10 scope: cancel the current task after ``delay`` seconds and turn that cancel
    (ours, not a caller's) into ``TimeoutError``."""
    task = asyncio.current_task()
    if delay is None or task is None:
        yield
        return
    fired = False

    def expire() -> None:
        nonlocal fired
        fired = True
        task.cancel()

    handle = asyncio.get_running_loop().call_later(delay, expire)
    try:
        yield
    except asyncio.CancelledError:
        if fired:
            raise TimeoutError from None
        raise
    finally:
        handle.cancel()


def timeout(delay: float | None) -> AbstractAsyncContextManager[object]:
    if sys.version_info >= (3, 11):
        return asyncio.timeout(delay)
    return call_later_timeout(delay)  # pragma: no cover - Python 3.10
