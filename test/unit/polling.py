"""Spin until a condition holds (ZMQ delivery needs milliseconds of real time)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def until(fn: Callable[[], T], what: str, timeout: float = 5.0) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = fn()
        if out:
            return out
        time.sleep(0.002)
    raise AssertionError(f"timed out waiting for {what}")
