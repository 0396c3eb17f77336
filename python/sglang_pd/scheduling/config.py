"""One pure configuration for every scheduling policy (DESIGN.md section 3).

``ServerArgs`` extends it (the server's settings are these plus its own) and narrows back to it
(``policy_config()``); the simulator builds it from the same generated flags. Later policies
add fields here, never a second config. Times in milliseconds where the CLI speaks
milliseconds, with seconds views for the policies (which work in seconds).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# re-exported: one definition, in the router's package (scheduling/ and core/ read it from here)
from sglang_pd_router.request_class import PREFILL_ROLES as PREFILL_ROLES
from sglang_pd_router.request_class import SHORT_PREFILL_THRESHOLD
from sglang_pd_router.slo_units import slo_ms_to_s

from sglang_pd.core.step import BucketGrid
from sglang_pd.utils.flags import flag

DEFAULT_SHORT_PREFILL_THRESHOLD = SHORT_PREFILL_THRESHOLD  # the flag's default (an alias)
SERVER_ROLES = ("colocated", "prefill", "decode")
PREFILL_QUEUES = ("single", "dual")
COLOCATED_DECODE = ("interleave", "prefill-first")  # scheduling/colocated.py


def parse_threshold(value: int | str | None) -> int | None:
    """--short-prefill-threshold: a token count, or "auto" (None: fitted from the cost model)."""
    if value is None or isinstance(value, int):
        return value
    text = str(value).strip().lower()
    if text == "auto":
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"--short-prefill-threshold must be a token count or 'auto', got {value!r}") from None


@dataclass(frozen=True, kw_only=True)
class PolicyConfig:
    """Every scheduling setting. A field with ``flag(...)`` is also a command-line flag of the
    server and of the simulator (utils/flags.py generates both); ``ServerArgs`` extends this
    class, so a new policy setting is one field here."""

    # SLO defaults for requests that carry none; None = no SLO
    slo_ttft_ms: float | None = flag(None, "--slo-ttft-ms", help="default TTFT SLO of requests without one")
    slo_tpot_ms: float | None = flag(None, "--slo-tpot-ms", help="default TPOT SLO of requests without one")
    # budgets (tokens / requests per step)
    max_prefill_tokens: int = flag(16384, "--max-prefill-tokens")
    chunked_prefill_size: int = flag(2048, "--chunked-prefill-size")
    max_running_requests: int = flag(256, "--max-running-requests")
    page_size: int = flag(16, "--page-size")
    # queues and batching
    prefill_queues: str = flag("single", "--prefill-queues", choices=PREFILL_QUEUES,
                               help="dual: short and long prefill queues, short batches by AWD")
    # new tokens <= this are short; None = auto (PLA-Serve §2.1's L_m from the cost model). The
    # flag's text ("N" or "auto") is read by __post_init__.
    short_prefill_threshold: int | None = flag(
        DEFAULT_SHORT_PREFILL_THRESHOLD, "--short-prefill-threshold", text=True,
        help="new tokens <= N are short; 'auto' = PLA-Serve's fitted compute/memory boundary")
    prefill_role: str = flag("both", "--prefill-role", choices=PREFILL_ROLES,  # switchable at runtime
                             help="the prefill class this instance serves first (others only when it has none)")
    buckets: BucketGrid = field(default_factory=BucketGrid)  # the server's --short-prefill-buckets
    enable_mixed_chunk: bool = flag(False, "--enable-mixed-chunk",
                                    help="run prefill chunks and decodes of running requests in one forward")
    # colocated servers: how prefill shares steps with running decodes (scheduling/colocated.py);
    # "prefill-first" runs every waiting prefill before any decode (decodes can starve: the
    # rule before issue 28, and Medha's paper's comparison point), for A/B runs only
    colocated_decode: str = flag("interleave", "--colocated-decode", choices=COLOCATED_DECODE,
                                 help="colocated: interleave prefill with running decodes by a time budget, "
                                      "or prefill-first (decodes may starve; for comparisons)")
    # this server's role in a PD cluster (the server's --disaggregation-mode)
    role: str = "colocated"
    # measured step times (docs/profile.md); None = learn online from a cold start
    cost_model_profile: str | None = flag(None, "--cost-model-profile",
                                          help="measured step times JSON (docs/profile.md)")
    # deadline-aware prefill policies (docs/prefill_scheduling.md)
    prefill_no_slo_ttft_ms: float = flag(30000.0, "--prefill-no-slo-ttft-ms",
                                         help="deadline-aware prefill policies: TTFT deadline of requests without an SLO")
    prefill_deadline_margin_ms: float = flag(0.0, "--prefill-deadline-margin-ms",
                                             help="taken off prefill deadlines (PD prefill: the KV transfer still to come)")
    prefill_max_partial: int = flag(2, "--prefill-max-partial",
                                    help="partly prefilled requests (each holding pages) at once")
    prefill_starve_factor: float = flag(4.0, "--prefill-starve-factor",
                                        help="kairos+: a request that waited this many times max(TTFT SLO, its whole prefill "
                                             "alone) is served first")
    long_prefill_token_threshold: int = flag(
        0, "--long-prefill-token-threshold",
        help="vllm-threshold: most tokens one request prefills per step (0: --short-prefill-threshold)")
    # slack-guided decode policies (docs/decode_scheduling.md): the TPOT pace assumed for a
    # request without a TPOT SLO, which bounds how long it may be skipped
    decode_no_slo_tpot_ms: float = 1000.0
    # slack+ skips a request only while its slack keeps in reserve this quantile of the decode
    # table's recent overruns (a step measured slower than the table predicted); 0: off, the
    # rule as first written (issue 34; decode/slack_plus.py "Reserve")
    decode_reserve_quantile: float = flag(0.0, "--decode-reserve-quantile",
                                          help="slack+: keep this quantile of the decode table's recent overruns "
                                               "in reserve when skipping a request (0: none)")
    # the engine's decode attention pads every request to the batch's longest context (the
    # torch backend's one SDPA call): a step then costs as if all had the longest context
    decode_attention_padded: bool = False
    # Medha App. A.2 adaptive chunking: target step time (ms); None = fixed chunks only
    prefill_time_budget_ms: float | None = flag(
        None, "--prefill-time-budget-ms",
        help="Medha adaptive chunking: largest chunks that fit this step time (ms); off by default")
    # dual queues: the long queue's head waits at most this long behind short batches
    prefill_long_max_wait_ms: float = flag(2000.0, "--prefill-long-max-wait-ms",
                                           help="dual queues: longest wait of the long queue's head behind short batches")
    # AWD (PLA-Serve Alg. 1, docs/prefill_scheduling.md): the paper gives no values for these
    awd_w_min_ms: float = flag(0.0, "--awd-w-min-ms", help="AWD window lower bound W_min")
    awd_w_max_ms: float = flag(20.0, "--awd-w-max-ms", help="AWD window upper bound W_max")
    awd_sigma_ms: float = flag(5.0, "--awd-sigma-ms", help="AWD: dispatch at once below this slack")
    awd_delta_ms: float = flag(2.0, "--awd-delta-ms", help="AWD: safety margin of the SLA window")
    awd_t_max_ms: float = flag(100.0, "--awd-t-max-ms", help="AWD: head-of-line wait bound")
    awd_rate_floor: float = flag(1.0, "--awd-rate-floor", help="AWD: arrival-rate floor eps (req/s)")
    awd_min_batch_tokens: int = flag(1024, "--awd-min-batch-tokens",
                                     help="AWD: deadline-free dispatch at this many tokens (M_s)")

    def __post_init__(self) -> None:
        object.__setattr__(self, "short_prefill_threshold", parse_threshold(self.short_prefill_threshold))
        if self.role not in SERVER_ROLES:
            raise ValueError(f"role must be one of {SERVER_ROLES}, got {self.role!r}")
        for name in ("slo_ttft_ms", "slo_tpot_ms"):
            value = getattr(self, name)
            if value is not None and not value > 0:  # also refuses NaN
                raise ValueError(f"{name} must be a positive number of milliseconds, got {value}")
        if not self.prefill_no_slo_ttft_ms > 0 or not self.prefill_deadline_margin_ms >= 0:
            raise ValueError(f"prefill_no_slo_ttft_ms must be > 0 and prefill_deadline_margin_ms >= 0, got "
                             f"{self.prefill_no_slo_ttft_ms} and {self.prefill_deadline_margin_ms}")
        if self.colocated_decode not in COLOCATED_DECODE:
            raise ValueError(f"colocated_decode must be one of {COLOCATED_DECODE}, got {self.colocated_decode!r}")
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
        if not 0 <= self.decode_reserve_quantile <= 1:
            raise ValueError(f"decode_reserve_quantile must be in [0, 1], got {self.decode_reserve_quantile}")

    @property
    def slo_ttft_s(self) -> float | None:
        return slo_ms_to_s(self.slo_ttft_ms)

    @property
    def dual_queues(self) -> bool:
        """Short/long classes in play: dual queues, or a role that prefers one class."""
        return self.prefill_queues == "dual" or self.prefill_role != "both"

    @property
    def slo_tpot_s(self) -> float | None:
        return slo_ms_to_s(self.slo_tpot_ms)
