"""Prometheus metrics with SGLang's names (``sglang:*``, label ``model_name``).

Every server gets its own CollectorRegistry so tests (and several servers in one process)
never collide on the global one.

Engine gauges come from ``EngineStats``: the known fields map to SGLang's names below, and
any other numeric field the engine adds later (e.g. ``num_prefill_inflight_queue_reqs`` in
PD mode) is exported automatically as ``sglang:<field>`` -- that is the hook for PD metrics.
Extra gauges can also be registered explicitly with ``add_engine_gauge``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST

from sglang_pd.protocol import EngineStats

CONTENT_TYPE = CONTENT_TYPE_LATEST

# From 1 ms (a fast decode step) up to many minutes (long generations behind a queue).
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                 2.5, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
_ITL_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
                0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0)
_E2E_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                50.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0)

# engine steps (issue 21): batch sizes, and step times from 1 ms to a long prefill
_STEP_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_STEP_SECONDS_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                         0.5, 1.0, 2.0, 5.0, 10.0, 30.0)

# EngineStats field -> (metric name, help). Other numeric fields get sglang:<field>.
_KNOWN_STATS: dict[str, tuple[str, str]] = {
    "num_running_reqs": ("sglang:num_running_reqs", "Number of running requests"),
    "num_queue_reqs": ("sglang:num_queue_reqs", "Number of requests waiting in the queue"),
    "token_usage": ("sglang:token_usage", "Fraction of KV cache tokens in use"),
    "gen_throughput": ("sglang:gen_throughput", "Generation throughput (tokens/s)"),
    "num_used_tokens": ("sglang:num_used_tokens", "Number of KV cache tokens in use"),
    "max_total_num_tokens": ("sglang:max_total_num_tokens", "KV cache capacity in tokens"),
}


# EngineStats totals exported as counters (not gauges)
_COUNTER_STATS = ("num_livelock_episodes_total",)


@dataclass
class FrontendMetrics:
    model_name: str
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    engine_gauges: dict[str, Gauge] = field(default_factory=dict)  # EngineStats field -> gauge

    def __post_init__(self) -> None:
        labels = ["model_name"]
        reg = self.registry
        self.ttft = Histogram("sglang:time_to_first_token_seconds",
                              "Time to first token in seconds", labels,
                              buckets=_TTFT_BUCKETS, registry=reg).labels(self.model_name)
        self.itl = Histogram("sglang:inter_token_latency_seconds",
                             "Latency between consecutive output tokens in seconds", labels,
                             buckets=_ITL_BUCKETS, registry=reg).labels(self.model_name)
        self.e2e = Histogram("sglang:e2e_request_latency_seconds",
                             "End-to-end request latency in seconds", labels,
                             buckets=_E2E_BUCKETS, registry=reg).labels(self.model_name)
        # prometheus_client appends _total to counter names itself.
        self.prompt_tokens = Counter("sglang:prompt_tokens", "Number of prefill tokens processed",
                                     labels, registry=reg).labels(self.model_name)
        self.generation_tokens = Counter("sglang:generation_tokens",
                                         "Number of generation tokens processed", labels,
                                         registry=reg).labels(self.model_name)
        self.cached_tokens = Counter("sglang:cached_tokens", "Number of prompt tokens served "
                                     "from the prefix cache", labels,
                                     registry=reg).labels(self.model_name)
        self.num_requests = Counter("sglang:num_requests", "Number of requests processed",
                                    labels, registry=reg).labels(self.model_name)
        self.num_aborted = Counter("sglang:num_aborted_requests", "Number of requests aborted",
                                   labels, registry=reg).labels(self.model_name)
        # the livelock watchdog (core/watchdog.py): runs of thrown-away prefill work with no
        # request completing; exported as sglang:engine_livelock_episodes_total
        self.livelock_episodes = Counter("sglang:engine_livelock_episodes",
                                         "Times the engine threw prefill work away repeatedly while no "
                                         "request completed", labels, registry=reg).labels(self.model_name)
        self._livelock_episodes = 0
        # SLO attainment per request class (ours, not SGLang's): met/missed TTFT and TPOT of
        # requests that carry an SLO (their own or the --slo-*-ms default)
        cls_labels = ["model_name", "request_class"]
        self.slo_counters = {
            (kind, outcome): Counter(f"sglang:slo_{kind}_{outcome}",
                                     f"Requests that {outcome} their {kind.upper()} SLO", cls_labels,
                                     registry=reg)
            for kind in ("ttft", "tpot") for outcome in ("met", "missed")}
        # the router's class headers (sglang_pd_router/request_class.py) carried a token count
        # other than ours: our own count classified the request
        self.class_mismatch = Counter("sglang:request_class_mismatch",
                                      "Requests whose router-sent token count differed from the server's",
                                      labels, registry=reg).labels(self.model_name)
        # per engine step, label mode (extend | decode | mixed): from EngineStats.step_samples
        self.step_batch_size = Histogram("sglang:engine_step_batch_size",
                                         "Requests in one engine step", labels + ["mode"],
                                         buckets=_STEP_BATCH_BUCKETS, registry=reg)
        self.step_seconds = Histogram("sglang:engine_step_seconds",
                                      "Wall time of one engine step (schedule, forward, sampling)",
                                      labels + ["mode"], buckets=_STEP_SECONDS_BUCKETS, registry=reg)
        for stat, (name, doc) in _KNOWN_STATS.items():
            self.add_engine_gauge(stat, name, doc)

    def add_engine_gauge(self, stat_field: str, metric_name: str | None = None,
                         doc: str | None = None) -> Gauge:
        """Export EngineStats.<stat_field> as a gauge (idempotent)."""
        if stat_field not in self.engine_gauges:
            gauge = Gauge(metric_name or f"sglang:{stat_field}",
                          doc or f"Engine statistic {stat_field}", ["model_name"],
                          registry=self.registry)
            self.engine_gauges[stat_field] = gauge.labels(self.model_name)
        return self.engine_gauges[stat_field]

    def update_engine_stats(self, stats: EngineStats) -> None:
        for name, value in msgspec.structs.asdict(stats).items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or name in _COUNTER_STATS:
                continue
            self.add_engine_gauge(name).set(value)
        # engine totals exported as counters: add what grew since the last stats message
        episodes = stats.num_livelock_episodes_total
        if episodes > self._livelock_episodes:
            self.livelock_episodes.inc(episodes - self._livelock_episodes)
        self._livelock_episodes = episodes
        samples = stats.step_samples
        if samples is not None:
            for mode, batch, seconds in zip(samples.modes, samples.batch_sizes, samples.seconds):
                self.step_batch_size.labels(self.model_name, mode).observe(batch)
                self.step_seconds.labels(self.model_name, mode).observe(seconds)

    def observe_finished(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int,
                         e2e_s: float, aborted: bool) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(completion_tokens)
        self.cached_tokens.inc(cached_tokens)
        self.num_requests.inc()
        self.e2e.observe(e2e_s)
        if aborted:
            self.num_aborted.inc()

    def observe_slo(self, request_class: str, kind: str, value_s: float | None, slo_s: float) -> None:
        """One finished request's TTFT or TPOT against its SLO (None: never reached = missed)."""
        outcome = "met" if value_s is not None and value_s <= slo_s else "missed"
        self.slo_counters[(kind, outcome)].labels(self.model_name, request_class).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
