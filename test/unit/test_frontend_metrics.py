"""Prometheus names, labels, and the hook that exports new EngineStats fields."""

from __future__ import annotations

from sglang_pd.frontend.metrics import FrontendMetrics
from sglang_pd.protocol import EngineStats


class PdStats(EngineStats):
    """What a PD engine might add later."""

    num_prefill_inflight_queue_reqs: int = 0


def test_metric_names_and_labels() -> None:
    m = FrontendMetrics("my-model")
    m.ttft.observe(0.05)
    m.itl.observe(0.01)
    m.observe_finished(10, 5, 2, 1.5, aborted=False)
    m.update_engine_stats(EngineStats(num_running_reqs=3, num_queue_reqs=1, token_usage=0.25,
                                      gen_throughput=42.0, num_used_tokens=100,
                                      max_total_num_tokens=400))
    text = m.render().decode()
    for name in ("sglang:time_to_first_token_seconds_bucket",
                 "sglang:inter_token_latency_seconds_bucket",
                 "sglang:e2e_request_latency_seconds_bucket", "sglang:prompt_tokens_total",
                 "sglang:generation_tokens_total", "sglang:num_requests_total",
                 "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
                 "sglang:gen_throughput"):
        assert name in text, name
    assert 'sglang:num_running_reqs{model_name="my-model"} 3.0' in text
    assert 'sglang:prompt_tokens_total{model_name="my-model"} 10.0' in text


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
