"""One pure configuration for every scheduling policy (DESIGN.md section 3).

The engine builds it from ``ServerArgs`` (``EngineCore``), the simulator from its own flags.
Later policies add fields here, never a second config. Times in milliseconds where the CLI
speaks milliseconds, with seconds views for the policies (which work in seconds).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sglang_pd.scheduling.step import BucketGrid

SERVER_ROLES = ("colocated", "prefill", "decode")


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
    short_prefill_threshold: int | None = None  # tokens; None = the policy's own choice
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
        if self.prefill_max_partial < 1 or not self.prefill_starve_factor > 0:
            raise ValueError(f"prefill_max_partial must be >= 1 and prefill_starve_factor > 0, got "
                             f"{self.prefill_max_partial} and {self.prefill_starve_factor}")

    @property
    def slo_ttft_s(self) -> float | None:
        return self.slo_ttft_ms / 1e3 if self.slo_ttft_ms else None

    @property
    def slo_tpot_s(self) -> float | None:
        return self.slo_tpot_ms / 1e3 if self.slo_tpot_ms else None
