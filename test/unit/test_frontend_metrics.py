"""Prometheus names, labels, and the hook that exports new EngineStats fields."""

from __future__ import annotations

import pytest

from sglang_pd.frontend.metrics import FrontendMetrics
from sglang_pd.protocol import EngineStats


class PdStats(EngineStats):
    """What a PD engine might add later."""

    num_prefill_inflight_queue_reqs: int = 0


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Prometheus text -> {(sample name, labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_metric_values_follow_what_was_observed() -> None:
    m = FrontendMetrics("my-model")
    model = frozenset({("model_name", "my-model")})
    before = samples(m.render().decode())
    m.ttft.observe(0.05)
    m.itl.observe(0.01)
    m.itl.observe(0.03)
    m.observe_finished(10, 5, 2, 1.5, aborted=False)
    m.observe_finished(4, 1, 0, 0.5, aborted=True)
    m.update_engine_stats(EngineStats(num_running_reqs=3, num_queue_reqs=1, token_usage=0.25,
                                      gen_throughput=42.0, num_used_tokens=100,
                                      max_total_num_tokens=400))
    after = samples(m.render().decode())

    def moved(name: str, labels: frozenset = model) -> float:
        return after[(name, labels)] - before.get((name, labels), 0.0)

    assert moved("sglang:time_to_first_token_seconds_count") == 1
    assert moved("sglang:time_to_first_token_seconds_sum") == pytest.approx(0.05)
    assert after[("sglang:time_to_first_token_seconds_bucket", model | {("le", "0.04")})] == 0
    assert after[("sglang:time_to_first_token_seconds_bucket", model | {("le", "0.06")})] == 1
    assert moved("sglang:inter_token_latency_seconds_count") == 2
    assert moved("sglang:inter_token_latency_seconds_sum") == pytest.approx(0.04)
    assert moved("sglang:e2e_request_latency_seconds_count") == 2
    assert moved("sglang:e2e_request_latency_seconds_sum") == pytest.approx(2.0)
    assert moved("sglang:prompt_tokens_total") == 14
    assert moved("sglang:generation_tokens_total") == 6
    assert moved("sglang:num_requests_total") == 2
    assert moved("sglang:num_aborted_requests_total") == 1
    assert after[("sglang:num_running_reqs", model)] == 3
    assert after[("sglang:num_queue_reqs", model)] == 1
    assert after[("sglang:token_usage", model)] == 0.25
    assert after[("sglang:gen_throughput", model)] == 42.0
    m.update_engine_stats(EngineStats(num_running_reqs=0, num_queue_reqs=0, token_usage=0.0,
                                      gen_throughput=0.0, num_used_tokens=0, max_total_num_tokens=400))
    assert samples(m.render().decode())[("sglang:num_running_reqs", model)] == 0  # gauges follow


def test_new_engine_stats_fields_are_exported() -> None:
    m = FrontendMetrics("pd")
    m.update_engine_stats(PdStats(num_running_reqs=0, num_queue_reqs=0, token_usage=0.0,
                                  gen_throughput=0.0, num_used_tokens=0,
                                  max_total_num_tokens=1, num_prefill_inflight_queue_reqs=7))
    assert 'sglang:num_prefill_inflight_queue_reqs{model_name="pd"} 7.0' in m.render().decode()


def test_registries_are_per_instance() -> None:
    FrontendMetrics("a")
    FrontendMetrics("a")  # a global registry would raise "Duplicated timeseries"


def test_step_samples_become_histograms_not_gauges() -> None:
    """Issue 21: per-step batch sizes and times (EngineStats.step_samples) are histograms by mode."""
    from sglang_pd.frontend.metrics import FrontendMetrics
    from sglang_pd.protocol import EngineStats, StepSamples
    m = FrontendMetrics("m")
    stats = EngineStats(1, 0, 0.1, 5.0, 10, 100,
                        step_samples=StepSamples(["decode", "decode", "extend"], [3, 40, 1], [0.004, 0.02, 0.3]))
    m.update_engine_stats(stats)
    m.update_engine_stats(EngineStats(1, 0, 0.1, 5.0, 10, 100))  # no samples: nothing observed
    text = m.render().decode()
    assert 'sglang:engine_step_batch_size_count{mode="decode",model_name="m"} 2.0' in text
    assert 'sglang:engine_step_batch_size_sum{mode="decode",model_name="m"} 43.0' in text
    assert 'sglang:engine_step_seconds_bucket{le="0.005",mode="decode",model_name="m"} 1.0' in text
    assert 'sglang:engine_step_seconds_count{mode="extend",model_name="m"} 1.0' in text
    assert "sglang:step_samples" not in text
