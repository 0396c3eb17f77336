"""The engine's counters (throughput window, step profiles, watchdog inputs, per-class load)
and the ``EngineStats`` snapshot built from them for /get_load and /metrics."""

from __future__ import annotations

import itertools
from collections import deque
from typing import TYPE_CHECKING, Any

from sglang_pd.core.load_signals import LoadTracker, class_queues
from sglang_pd.core.step import StepProfile
from sglang_pd.core.watchdog import LivelockDetector
from sglang_pd.protocol import EngineStats, StepSamples

if TYPE_CHECKING:
    from sglang_pd.core.scheduler import Scheduler
    from sglang_pd.engine.pd import PDHooks
    from sglang_pd.engine.request import Req

THROUGHPUT_WINDOW_S = 5.0
PROFILE_STEPS_KEPT = 4096


class EngineCounters:
    """What the step loop records; read only by ``snapshot`` (and the step-profile readers)."""

    def __init__(self) -> None:
        self.generated: deque[tuple[float, int]] = deque()  # (when, tokens sampled), last window
        self.step_profiles: deque[StepProfile] = deque(maxlen=PROFILE_STEPS_KEPT)
        self.steps_recorded = 0  # step profiles appended, ever
        self.steps_sampled = 0  # of them, handed out as stats samples (take_step_samples)
        self.loads = LoadTracker()
        self.stalled_since: float | None = None  # work queued, no progress since then (watchdog)
        self.livelock = LivelockDetector()  # prefill thrown away repeatedly, nothing completes
        self.num_completed = 0  # requests finished or ended with a reason (the detector's input)

    def sampled(self, now: float, n: int) -> None:
        self.generated.append((now, n))

    def first_token(self, req: Req, now: float, sched: Scheduler) -> None:
        self.loads.first_token(req, now, sched.prefill_policy.class_threshold(), req.request_class)

    def record_step(self, profile: StepProfile, total_s: float, forward_s: float, now: float) -> None:
        profile.total_s, profile.forward_s = total_s, forward_s
        self.step_profiles.append(profile)
        self.steps_recorded += 1
        self.loads.step(now, profile.total_s)

    def track_progress(self, now: float, sched: Scheduler, made_progress: bool) -> None:
        """Watchdog input: since when has queued work made no progress (a hold is not a stall),
        and whether steps only throw prefill work away (core/watchdog.py)."""
        self.livelock.update(now, sched.num_preempted_prefills, self.num_completed)
        if made_progress or not sched.has_work or sched.holding(now):
            self.stalled_since = None
        elif self.stalled_since is None:
            self.stalled_since = now

    def take_step_samples(self) -> StepSamples:
        """The steps recorded since the last call (at most the ``PROFILE_STEPS_KEPT`` newest),
        for the /metrics histograms (mode, batch size, seconds)."""
        n = min(self.steps_recorded - self.steps_sampled, len(self.step_profiles))
        self.steps_sampled = self.steps_recorded
        steps = list(itertools.islice(reversed(self.step_profiles), n))[::-1]
        return StepSamples([p.mode.value for p in steps], [p.batch_size for p in steps],
                           [p.total_s for p in steps])

    def gen_throughput(self, now: float) -> float:
        """Tokens sampled per second over the last ``THROUGHPUT_WINDOW_S``."""
        while self.generated and self.generated[0][0] < now - THROUGHPUT_WINDOW_S:
            self.generated.popleft()
        if not self.generated:
            return 0.0
        span = max(now - self.generated[0][0], 1e-3)
        return sum(n for _, n in self.generated) / span

    def snapshot(self, now: float, sched: Scheduler, max_total_num_tokens: int, pd: PDHooks,
                 step_samples: bool = False) -> EngineStats:
        """Load signals; ``step_samples``: also the steps since the last such call (only the
        engine loop's periodic stats message asks, so /get_load never consumes them)."""
        used = sched.num_used_tokens
        allocator, hits = sched.allocator, sched.hits
        return EngineStats(
            num_running_reqs=len(sched.running), num_queue_reqs=len(sched.waiting),
            token_usage=used / max_total_num_tokens, gen_throughput=self.gen_throughput(now),
            num_used_tokens=used, max_total_num_tokens=max_total_num_tokens,
            num_queue_prefill_tokens=sum(r.prefill_remaining for r in sched.waiting),
            num_running_decode_tokens=sum(r.kv_len for r in sched.running),
            num_free_pages=allocator.num_free, num_total_pages=allocator.num_usable,
            num_cached_pages=hits.cache.num_pages if hits else 0,  # prefix cache (core/prefix_hits.py)
            num_evictable_pages=hits.cache.evictable if hits else 0,
            cache_hit_rate=hits.hit_rate if hits else 0.0,
            num_retractions_total=sched.num_retractions,
            num_preempted_prefills_total=sched.num_preempted_prefills,
            engine_stall_s=now - self.stalled_since if self.stalled_since is not None else 0.0,
            engine_livelock_s=self.livelock.livelock_s(now),
            num_livelock_episodes_total=self.livelock.episodes,
            num_preempted_prefill_tokens_total=sched.num_preempted_prefill_tokens,
            role=pd.role,
            **pd.stats(),
            **self._class_stats(now, sched),
            step_samples=self.take_step_samples() if step_samples else None,
        )

    def _class_stats(self, now: float, sched: Scheduler) -> dict[str, Any]:
        """Per-class queues, SLO deviation, role and busy share (core/load_signals.py)."""
        loads = self.loads
        threshold = sched.prefill_policy.class_threshold()
        return dict(prefill_role=sched.prefill_role,
                    short_prefill_threshold=threshold, **class_queues(sched.waiting, threshold),
                    slo_ttft_deviation_short=loads.mean_deviation("short"),
                    slo_ttft_deviation_long=loads.mean_deviation("long"),
                    busy_fraction=loads.busy_fraction(now))
