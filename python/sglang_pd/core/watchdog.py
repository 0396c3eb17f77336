"""Livelock detection for the engine's watchdog (issue 28 item 5), pure: counts and times in.

The stall watchdog (``engine_stall_s``) sees an engine that schedules nothing. A livelock looks
busy: steps run, but prefill work is thrown away (partial prefills preempted, recomputed)
again and again while no request completes. The detector reads two running totals after each
engine step, thrown-away partial prefills and completed requests (finished or ended with a
reason), and reports for how long the engine has been livelocked: since the first throwaway of
a run of at least ``min_preemptions`` with no completion in between. The frontend turns
``/health`` unhealthy once that exceeds ``--watchdog-timeout``; each run counts once in
``episodes`` (the ``sglang:engine_livelock_episodes_total`` counter).

The progress rule (core/progress.py) bounds throwaways per request, so on a healthy engine
a run of them without any completion stays short; the detector is the guard for what the rule
does not cover (a policy or mechanism bug).
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_PREEMPTIONS = 8  # throwaways without a completion before the engine counts as livelocked


@dataclass
class LivelockDetector:
    min_preemptions: int = MIN_PREEMPTIONS
    episodes: int = 0  # runs that reached ``min_preemptions``
    _completed: int = 0  # completions seen so far
    _base: int = 0  # thrown-away total at the last completion
    _since: float | None = None  # first throwaway after the last completion
    _in_episode: bool = False

    def update(self, now: float, preempted_total: int, completed_total: int) -> None:
        """Feed the running totals (never decreasing) after a step."""
        if completed_total != self._completed:  # progress: start over
            self._completed, self._base = completed_total, preempted_total
            self._since, self._in_episode = None, False
            return
        thrown = preempted_total - self._base
        if thrown > 0 and self._since is None:
            self._since = now
        if thrown >= self.min_preemptions and not self._in_episode:
            self._in_episode = True
            self.episodes += 1

    def livelock_s(self, now: float) -> float:
        """Seconds the engine has been livelocked (0 when it is not)."""
        if not self._in_episode or self._since is None:
            return 0.0
        return now - self._since
