"""One pure configuration for every scheduling policy (DESIGN.md section 3).

The engine builds it from ``ServerArgs`` (``EngineCore``), the simulator from its own flags.
Later policies add fields here, never a second config. Times in milliseconds where the CLI
speaks milliseconds, with seconds views for the policies (which work in seconds).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sglang_pd.core.step import BucketGrid

SERVER_ROLES = ("colocated", "prefill", "decode")
PREFILL_ROLES = ("both", "short", "long")  # which prefill class an instance serves first
PREFILL_QUEUES = ("single", "dual")
DEFAULT_SHORT_PREFILL_THRESHOLD = 256  # PLA-Serve's short regime: prompts under 256 tokens


@dataclass
class PolicyConfig:
    # SLO defaults for requests that carry none (--slo-ttft-ms / --slo-tpot-ms); None = no SLO
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    # budgets (tokens / requests per step)
    max_prefill_tokens: int = 16384
    chunked_prefill_size: int = 2048
    max_running_requests: int = 256
    page_size: int = 16
    # queues and batching
    prefill_queues: str = "single"  # single | dual (short/long)
    # new tokens <= this are short; None = auto (PLA-Serve §2.1's L_m from the cost model)
    short_prefill_threshold: int | None = DEFAULT_SHORT_PREFILL_THRESHOLD
    prefill_role: str = "both"  # both | short | long (--prefill-role; switchable at runtime)
    buckets: BucketGrid = field(default_factory=BucketGrid)
    enable_mixed_chunk: bool = False
    # this server's role in a PD cluster
    role: str = "colocated"
    # measured step times (docs/profile.md); None = learn online from a cold start
    cost_model_profile: str | None = None
    # deadline-aware prefill policies (docs/prefill_scheduling.md)
    prefill_no_slo_ttft_ms: float = 30000.0  # deadline of a request with no TTFT SLO at all
    prefill_deadline_margin_ms: float = 0.0  # after prefill, before the first token (KV transfer)
    prefill_max_partial: int = 2  # partly prefilled requests (holding pages) at once
    prefill_starve_factor: float = 4.0  # kairos+: waited this many TTFT SLOs -> served first
    # vllm-threshold: most tokens one request prefills per step (0: the short-prefill threshold)
    long_prefill_token_threshold: int = 0
    # slack-guided decode policies (docs/decode_scheduling.md): the TPOT pace assumed for a
    # request without a TPOT SLO, which bounds how long it may be skipped
    decode_no_slo_tpot_ms: float = 1000.0
    # the engine's decode attention pads every request to the batch's longest context (the
    # torch backend's one SDPA call): a step then costs as if all had the longest context
    decode_attention_padded: bool = False
    # Medha App. A.2 adaptive chunking: target step time (ms); None = fixed chunks only
    prefill_time_budget_ms: float | None = None
    # dual queues: the long queue's head waits at most this long behind short batches
    prefill_long_max_wait_ms: float = 2000.0
    # AWD (PLA-Serve Alg. 1, docs/prefill_scheduling.md): the paper gives no values for these
    awd_w_min_ms: float = 0.0  # window bounds [W_min, W_max]
    awd_w_max_ms: float = 20.0
    awd_sigma_ms: float = 5.0  # dispatch at once when a request's slack after S_hat is <= sigma
    awd_delta_ms: float = 2.0  # safety margin of the SLA window
    awd_t_max_ms: float = 100.0  # head-of-line wait bound
    awd_rate_floor: float = 1.0  # eps: arrival-rate floor (requests/s) of the graph window
    awd_min_batch_tokens: int = 1024  # M_s: deadline-free batches dispatch at this many tokens

    def __post_init__(self) -> None:
        if self.role not in SERVER_ROLES:
            raise ValueError(f"role must be one of {SERVER_ROLES}, got {self.role!r}")
        for name in ("slo_ttft_ms", "slo_tpot_ms"):
            value = getattr(self, name)
            if value is not None and not value > 0:  # also refuses NaN
                raise ValueError(f"{name} must be a positive number of milliseconds, got {value}")
        if not self.prefill_no_slo_ttft_ms > 0 or not self.prefill_deadline_margin_ms >= 0:
            raise ValueError(f"prefill_no_slo_ttft_ms must be > 0 and prefill_deadline_margin_ms >= 0, got "
                             f"{self.prefill_no_slo_ttft_ms} and {self.prefill_deadline_margin_ms}")
        if self.prefill_queues not in PREFILL_QUEUES:
            raise ValueError(f"prefill_queues must be one of {PREFILL_QUEUES}, got {self.prefill_queues!r}")
        if self.prefill_role not in PREFILL_ROLES:
            raise ValueError(f"prefill_role must be one of {PREFILL_ROLES}, got {self.prefill_role!r}")
        if self.long_prefill_token_threshold < 0:
            raise ValueError(f"long_prefill_token_threshold must be >= 0, got {self.long_prefill_token_threshold}")
        if self.short_prefill_threshold is not None and self.short_prefill_threshold < 1:
            raise ValueError(f"short_prefill_threshold must be >= 1 (or auto), got {self.short_prefill_threshold}")
        if self.prefill_time_budget_ms is not None and not self.prefill_time_budget_ms > 0:
            raise ValueError(f"prefill_time_budget_ms must be > 0, got {self.prefill_time_budget_ms}")
        if not 0 <= self.awd_w_min_ms <= self.awd_w_max_ms:
            raise ValueError(f"need 0 <= awd_w_min_ms <= awd_w_max_ms, got {self.awd_w_min_ms}, {self.awd_w_max_ms}")
        for name in ("awd_sigma_ms", "awd_delta_ms", "awd_t_max_ms", "prefill_long_max_wait_ms"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not self.awd_rate_floor > 0 or self.awd_min_batch_tokens < 1:
            raise ValueError(f"awd_rate_floor must be > 0 and awd_min_batch_tokens >= 1, got "
                             f"{self.awd_rate_floor}, {self.awd_min_batch_tokens}")
        if self.prefill_max_partial < 1 or not self.prefill_starve_factor > 0:
            raise ValueError(f"prefill_max_partial must be >= 1 and prefill_starve_factor > 0, got "
                             f"{self.prefill_max_partial} and {self.prefill_starve_factor}")
        if not self.decode_no_slo_tpot_ms > 0:
            raise ValueError(f"decode_no_slo_tpot_ms must be > 0, got {self.decode_no_slo_tpot_ms}")

    @property
    def slo_ttft_s(self) -> float | None:
        return self.slo_ttft_ms / 1e3 if self.slo_ttft_ms else None

    @property
    def dual_queues(self) -> bool:
        """Short/long classes in play: dual queues, or a role that prefers one class."""
        return self.prefill_queues == "dual" or self.prefill_role != "both"

    @property
    def slo_tpot_s(self) -> float | None:
        return self.slo_tpot_ms / 1e3 if self.slo_tpot_ms else None
