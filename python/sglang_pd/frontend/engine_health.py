"""Why /health should fail: the frontend's view of a stuck engine (--watchdog-timeout)."""

from __future__ import annotations

from sglang_pd.protocol import EngineStats


def stall_reason(num_pending: int, silent: float, stats: EngineStats | None, limit: float) -> str | None:
    """The engine loop sent nothing for ``silent`` seconds while ``num_pending`` requests wait on
    it, it reports queued work making no progress, or it livelocks (throws prefill work away
    again and again while nothing completes); None while healthy."""
    if num_pending and silent > limit:
        return (f"the engine sent nothing for {silent:.0f} s with {num_pending} requests "
                f"pending (--watchdog-timeout {limit:g} s)")
    stall = stats.engine_stall_s if stats is not None else 0.0
    if stall > limit:
        return (f"the engine made no progress for {stall:.0f} s with work queued "
                f"(--watchdog-timeout {limit:g} s)")
    livelock = stats.engine_livelock_s if stats is not None else 0.0
    if livelock > limit:  # busy but going nowhere (core/watchdog.py)
        return (f"the engine threw away partial prefills over and over for {livelock:.0f} s while no "
                f"request completed ({stats.num_preempted_prefills_total} so far; "  # type: ignore[union-attr]
                f"--watchdog-timeout {limit:g} s)")
    return None
