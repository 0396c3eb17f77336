"""The livelock detector behind /health (core/watchdog.py) and the frontend's use of it."""

from __future__ import annotations

from types import SimpleNamespace

from sglang_pd.core.watchdog import LivelockDetector


def test_repeated_throwaways_without_a_completion_are_a_livelock() -> None:
    d = LivelockDetector(min_preemptions=3)
    d.update(0.0, 0, 0)
    d.update(1.0, 1, 0)  # first throwaway at t=1
    d.update(2.0, 2, 0)
    assert d.livelock_s(2.0) == 0.0 and d.episodes == 0  # two are not yet "repeatedly"
    d.update(3.0, 3, 0)
    assert d.livelock_s(10.0) == 9.0 and d.episodes == 1
    d.update(11.0, 9, 0)
    assert d.episodes == 1  # one run counts once


def test_a_completion_ends_it_and_steady_work_is_healthy() -> None:
    d = LivelockDetector(min_preemptions=3)
    for i in range(1, 6):
        d.update(float(i), i, 0)
    assert d.livelock_s(6.0) > 0
    d.update(7.0, 6, 1)  # a request completed: progress
    assert d.livelock_s(8.0) == 0.0
    for i in range(20):  # a throwaway now and then, with completions in between: healthy
        d.update(10.0 + i, 6 + i, 2 + i)
    assert d.livelock_s(40.0) == 0.0 and d.episodes == 1


def test_health_fails_on_a_livelock_longer_than_the_watchdog_timeout() -> None:
    from sglang_pd.frontend.tokenizer_manager import TokenizerManager

    stats = SimpleNamespace(engine_stall_s=0.0, engine_livelock_s=12.0, num_preempted_prefills_total=40)
    tm = SimpleNamespace(server_args=SimpleNamespace(watchdog_timeout=10.0), states={}, last_engine_msg=1e18,
                         last_stats=stats)
    why = TokenizerManager.stall_reason(tm)  # type: ignore[arg-type]
    assert why is not None and "threw away" in why and "12 s" in why
    stats.engine_livelock_s = 5.0
    assert TokenizerManager.stall_reason(tm) is None  # type: ignore[arg-type]


def test_livelock_episodes_are_a_prometheus_counter() -> None:
    from sglang_pd.frontend.metrics import FrontendMetrics
    from sglang_pd.protocol import EngineStats

    m = FrontendMetrics("m")
    base = dict(num_running_reqs=0, num_queue_reqs=2, token_usage=0.9, gen_throughput=0.0, num_used_tokens=1,
                max_total_num_tokens=2)
    m.update_engine_stats(EngineStats(**base, num_livelock_episodes_total=2, engine_livelock_s=31.0))
    m.update_engine_stats(EngineStats(**base, num_livelock_episodes_total=3))
    text = m.render().decode()
    assert 'sglang:engine_livelock_episodes_total{model_name="m"} 3.0' in text
    assert "sglang:num_livelock_episodes_total" not in text  # a counter, not also a gauge
    assert 'sglang:engine_livelock_s{model_name="m"} 0.0' in text
