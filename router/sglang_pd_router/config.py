"""The router's settings as one dataclass (built by ``cli.config_from_args`` or by tests)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .controller import ControllerConfig
from .policies.conditional import ConditionalConfig

# SGLang's prefill servers listen for bootstrap on this port unless told otherwise.
DEFAULT_BOOTSTRAP_PORT = 8998


@dataclass
class PrefillSpec:
    url: str
    bootstrap_port: int | None = DEFAULT_BOOTSTRAP_PORT  # None: the worker needs none ("none")


@dataclass
class RouterConfig:
    prefills: list[PrefillSpec] = field(default_factory=list)
    decodes: list[str] = field(default_factory=list)
    host: str = "127.0.0.1"
    port: int = 30000
    prefill_policy: str = "length_aware"
    decode_policy: str = "power_of_two"
    seed: int | None = None
    api_key: str | None = None  # clients need it on every route but /health (and /workers)
    admin_api_key: str | None = None  # /workers needs it (or api_key); neither: admin API off
    metrics_api_key: str | None = None  # also opens /metrics (which api/admin keys open too)
    worker_api_key: str | None = None  # sent to workers as Bearer (defaults to api_key)
    tokenizer_path: str | None = None
    short_prefill_threshold: int | None = None  # None: the workers' (else request_class.SHORT_PREFILL_THRESHOLD)
    decode_reuse_slack: int = 2  # RoutingConfig.decode_reuse_slack (cache_aware decode picks)
    pool_controller: bool = True
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    drain_timeout_s: float = 60.0
    # conditional disaggregation (policies/conditional.py): None = off, every request takes a
    # prefill leg. Off by default: a local prefill costs the decode batch's TPOT while it runs
    conditional: ConditionalConfig | None = None
    slo_ttft_ms: dict[str, float] = field(default_factory=dict)  # request class -> default
    slo_tpot_ms: dict[str, float] = field(default_factory=dict)
    # reliability
    request_timeout_s: float = 600.0
    max_concurrent_requests: int = 512
    queue_size: int = 1024
    queue_timeout_s: float = 60.0
    queue_order: str = "fifo"  # fifo | edf: who of the waiting requests gets a freed slot
    max_retries: int = 3  # extra tries after the first, before any byte reached the client
    retry_initial_backoff_ms: float = 50.0
    retry_max_backoff_ms: float = 2000.0
    cb_failure_threshold: int = 5
    cb_timeout_s: float = 10.0
    health_check_interval_s: float = 5.0
    health_check_timeout_s: float = 5.0
    health_failure_threshold: int = 2
    health_success_threshold: int = 1
    load_poll_interval_s: float = 1.0
    connect_timeout_s: float = 5.0
    # hostile clients: a connection must deliver its request head within client_idle_timeout_s
    # (also the keep-alive idle limit), its body within body_timeout_s; at most max_connections
    client_idle_timeout_s: float = 15.0
    body_timeout_s: float = 30.0
    max_connections: int = 4096
    # liveness of the legs: the prefill must answer (its KV sent) within kv_deadline_s; after
    # it did, a streamed decode's first byte must come within first_byte_timeout_s
    kv_deadline_s: float = 30.0
    first_byte_timeout_s: float = 10.0
    # a streamed /generate (input_ids) whose decode breaks off resumes on a new pair this
    # many times at most (0: off; the stream then ends with an error event)
    max_migrations: int = 2
    log_level: str = "info"

    def __post_init__(self) -> None:
        positive = ("request_timeout_s", "queue_timeout_s", "cb_timeout_s",
                    "health_check_interval_s", "health_check_timeout_s", "load_poll_interval_s",
                    "connect_timeout_s", "drain_timeout_s", "client_idle_timeout_s",
                    "body_timeout_s", "kv_deadline_s", "first_byte_timeout_s")
        for name in positive:
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("max_concurrent_requests", "cb_failure_threshold", "max_connections",
                     "health_failure_threshold", "health_success_threshold"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("queue_size", "max_retries", "max_migrations", "decode_reuse_slack"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.queue_order not in ("fifo", "edf"):
            raise ValueError(f"queue_order must be fifo or edf, got {self.queue_order!r}")
        if not 0 <= self.retry_initial_backoff_ms <= self.retry_max_backoff_ms:
            raise ValueError("need 0 <= retry_initial_backoff_ms <= retry_max_backoff_ms")
        if self.short_prefill_threshold is not None and self.short_prefill_threshold < 1:
            raise ValueError(f"short_prefill_threshold must be >= 1, got "
                             f"{self.short_prefill_threshold}")
        for table in (self.slo_ttft_ms, self.slo_tpot_ms):
            for cls, value in table.items():
                if cls not in ("short", "long") or not value > 0:
                    raise ValueError(f"SLO defaults need short|long -> ms > 0, got {cls}={value}")

    @property
    def key_for_workers(self) -> str | None:
        return self.worker_api_key if self.worker_api_key is not None else self.api_key
