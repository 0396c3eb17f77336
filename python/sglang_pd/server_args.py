"""All server settings in one dataclass; CLI flag names follow SGLang's."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import tempfile
import uuid
from dataclasses import dataclass, field
from typing import Any

from sglang_pd.core.step import BucketGrid
from sglang_pd.engine.attention import ATTENTION_BACKENDS
from sglang_pd.scheduling.config import DEFAULT_SHORT_PREFILL_THRESHOLD, PolicyConfig
from sglang_pd.scheduling.profile import load_profile
from sglang_pd.scheduling.registry import DECODE_POLICIES, PREFILL_POLICIES

DISAGG_MODES = ("colocated", "prefill", "decode")
POLICY_PLUGINS_ENV = "SGLANG_PD_POLICY_PLUGINS"


def load_policy_plugins() -> None:
    """Import the modules named (comma-separated) in $SGLANG_PD_POLICY_PLUGINS; each registers
    its policies with scheduling.registry. Runs at import, in the frontend and in the spawned
    engine process alike, so a plugin's names are valid CLI choices and resolvable everywhere."""
    for module in filter(None, (m.strip() for m in os.environ.get(POLICY_PLUGINS_ENV, "").split(","))):
        importlib.import_module(module)


load_policy_plugins()
# SGLang calls colocated mode "null"; accept it as an alias.
_MODE_ALIASES = {"null": "colocated", "none": "colocated"}


@dataclass
class ServerArgs:
    model_path: str
    tokenizer_path: str | None = None
    load_format: str = "auto"  # auto | dummy
    skip_tokenizer_init: bool = False
    dtype: str = "auto"  # auto (config's dtype; float32 on CPU) | float32 | bfloat16 | float16
    device: str = "cpu"
    served_model_name: str | None = None
    context_length: int | None = None
    trust_remote_code: bool = False  # accepted for compatibility; nothing remote is ever run
    # HTTP
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None
    enable_metrics: bool = True  # /metrics is always served; flag kept for SGLang compatibility
    log_level: str = "info"
    log_requests: bool = False
    # memory and batching
    page_size: int = 16
    max_total_tokens: int | None = None
    mem_fraction_static: float | None = None
    chunked_prefill_size: int = 2048
    max_prefill_tokens: int = 16384
    max_running_requests: int = 256
    # requests the frontend holds (queued + running); more get 503 + Retry-After
    max_queued_requests: int = 4096
    schedule_policy: str = "fcfs"  # the prefill policy (--prefill-policy is an alias)
    decode_policy: str = "continuous"
    attention_backend: str = "torch"  # torch | triton | flashinfer | auto (engine/attention)
    cuda_graph_max_bs: int = 160  # decode CUDA graphs for batches up to this (engine/cuda_graph.py)
    disable_cuda_graph: bool = False  # CUDA graphs run only on --device cuda with triton attention
    enable_mixed_chunk: bool = False  # prefill chunks and decodes in one forward
    short_prefill_buckets: str = str(BucketGrid())  # "T1,T2,...xB1,B2,..." padded step shapes
    # SLO defaults for requests that carry none (bench_serving's flag names)
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    cost_model_profile: str | None = None  # measured step times (docs/profile.md)
    # deadline-aware prefill policies (docs/prefill_scheduling.md)
    prefill_no_slo_ttft_ms: float = 30000.0
    prefill_deadline_margin_ms: float = 0.0
    prefill_max_partial: int = 2
    prefill_starve_factor: float = 4.0
    prefill_time_budget_ms: float | None = None  # Medha adaptive chunking (None: fixed chunks)
    # dual short/long prefill queues with AWD batching (docs/prefill_scheduling.md)
    prefill_queues: str = "single"
    short_prefill_threshold: str = str(DEFAULT_SHORT_PREFILL_THRESHOLD)  # N tokens or "auto"
    prefill_role: str = "both"
    prefill_long_max_wait_ms: float = 2000.0
    awd_w_min_ms: float = 0.0
    awd_w_max_ms: float = 20.0
    awd_sigma_ms: float = 5.0
    awd_delta_ms: float = 2.0
    awd_t_max_ms: float = 100.0
    awd_rate_floor: float = 1.0
    awd_min_batch_tokens: int = 1024
    # release streamed tokens ahead of the TPOT SLO at its pace (frontend/token_pacing.py)
    token_pacing: bool = False
    # /health turns 503 when the engine made no progress with work pending this long (seconds)
    watchdog_timeout: float = 300.0
    random_seed: int = 0
    tp_size: int = 1
    # disaggregation
    disaggregation_mode: str = "colocated"
    disaggregation_transfer_backend: str = "nixl"
    disaggregation_bootstrap_port: int = 8998
    disaggregation_ib_device: str | None = None  # accepted; UCX picks devices from UCX_NET_DEVICES
    num_reserved_decode_tokens: int = 512
    # where the frontend and engine processes meet (derived per server if unset)
    ipc_dir: str = field(default="")

    def __post_init__(self) -> None:
        self.disaggregation_mode = _MODE_ALIASES.get(self.disaggregation_mode, self.disaggregation_mode)
        problems = []
        if self.disaggregation_mode not in DISAGG_MODES:
            problems.append(f"--mode must be one of {DISAGG_MODES}, got {self.disaggregation_mode!r}")
        if self.page_size < 1:
            problems.append(f"--page-size must be >= 1, got {self.page_size}")
        if self.chunked_prefill_size < 1:
            problems.append(f"--chunked-prefill-size must be >= 1, got {self.chunked_prefill_size}")
        if self.max_running_requests < 1:
            problems.append(f"--max-running-requests must be >= 1, got {self.max_running_requests}")
        if self.max_queued_requests < 1:
            problems.append(f"--max-queued-requests must be >= 1, got {self.max_queued_requests}")
        if self.tp_size < 1:
            problems.append(f"--tp-size must be >= 1, got {self.tp_size}")
        elif self.tp_size > 1 and self.disaggregation_mode != "colocated":
            problems.append(f"--tp-size {self.tp_size} runs colocated only for now (PD with TP: issue 31)")
        if self.load_format not in ("auto", "dummy", "safetensors"):
            problems.append(f"--load-format must be auto, safetensors or dummy, got {self.load_format!r}")
        if self.mem_fraction_static is not None and not 0 < self.mem_fraction_static < 1:
            problems.append(f"--mem-fraction-static must be in (0, 1), got {self.mem_fraction_static}")
        for name in ("slo_ttft_ms", "slo_tpot_ms"):
            value = getattr(self, name)
            if value is not None and not value > 0:  # NaN fails too
                problems.append(f"--{name.replace('_', '-')} must be a positive number of ms, got {value}")
        if self.cuda_graph_max_bs < 1:
            problems.append(f"--cuda-graph-max-bs must be >= 1, got {self.cuda_graph_max_bs}")
        if not self.watchdog_timeout > 0:
            problems.append(f"--watchdog-timeout must be > 0 seconds, got {self.watchdog_timeout}")
        try:
            BucketGrid.parse(self.short_prefill_buckets)
        except ValueError as exc:
            problems.append(str(exc))
        for flag, value, names in (("--schedule-policy", self.schedule_policy, PREFILL_POLICIES),
                                   ("--decode-policy", self.decode_policy, DECODE_POLICIES),
                                   ("--attention-backend", self.attention_backend, ATTENTION_BACKENDS)):
            if value not in names:
                problems.append(f"{flag} must be one of {sorted(names)}, got {value!r}")
        if not problems:
            try:
                self.policy_config()  # its own checks (policy parameters)
            except ValueError as exc:
                problems.append(str(exc))
        if not problems and self.cost_model_profile:
            try:  # fail at start-up, not inside the engine process or never (fcfs)
                load_profile(self.cost_model_profile)
            except ValueError as exc:
                problems.append(f"--cost-model-profile: {exc}")
        if problems:
            raise ValueError("; ".join(problems))
        if not self.ipc_dir:
            # a unique path only; the process that binds the sockets creates it (ensure_ipc_dir)
            self.ipc_dir = os.path.join(tempfile.gettempdir(), f"sglang_pd_ipc_{os.getpid()}_{uuid.uuid4().hex[:8]}")

    def ensure_ipc_dir(self) -> str:
        os.makedirs(self.ipc_dir, exist_ok=True)
        return self.ipc_dir

    @property
    def bucket_grid(self) -> BucketGrid:
        return BucketGrid.parse(self.short_prefill_buckets)

    def policy_config(self) -> PolicyConfig:
        """The one scheduling configuration (DESIGN.md section 3), built from these flags."""
        return PolicyConfig(
            slo_ttft_ms=self.slo_ttft_ms, slo_tpot_ms=self.slo_tpot_ms,
            max_prefill_tokens=self.max_prefill_tokens, chunked_prefill_size=self.chunked_prefill_size,
            max_running_requests=self.max_running_requests, page_size=self.page_size,
            buckets=self.bucket_grid, enable_mixed_chunk=self.enable_mixed_chunk,
            role=self.disaggregation_mode, cost_model_profile=self.cost_model_profile,
            prefill_no_slo_ttft_ms=self.prefill_no_slo_ttft_ms,
            prefill_deadline_margin_ms=self.prefill_deadline_margin_ms,
            prefill_max_partial=self.prefill_max_partial, prefill_starve_factor=self.prefill_starve_factor,
            prefill_time_budget_ms=self.prefill_time_budget_ms, prefill_queues=self.prefill_queues,
            short_prefill_threshold=self._short_threshold(), prefill_role=self.prefill_role,
            prefill_long_max_wait_ms=self.prefill_long_max_wait_ms, awd_w_min_ms=self.awd_w_min_ms,
            awd_w_max_ms=self.awd_w_max_ms, awd_sigma_ms=self.awd_sigma_ms, awd_delta_ms=self.awd_delta_ms,
            awd_t_max_ms=self.awd_t_max_ms, awd_rate_floor=self.awd_rate_floor,
            awd_min_batch_tokens=self.awd_min_batch_tokens,
        )

    def _short_threshold(self) -> int | None:
        text = str(self.short_prefill_threshold).strip().lower()
        if text == "auto":
            return None
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"--short-prefill-threshold must be a token count or 'auto', got "
                             f"{self.short_prefill_threshold!r}") from None

    @property
    def tokenizer_dir(self) -> str:
        return self.tokenizer_path or self.model_path

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model_path

    @property
    def frontend_to_engine_addr(self) -> str:
        return f"ipc://{os.path.join(self.ipc_dir, 'to_engine')}"

    @property
    def engine_to_frontend_addr(self) -> str:
        return f"ipc://{os.path.join(self.ipc_dir, 'to_frontend')}"

    # ----------------------------------------------------------------- CLI
    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        d = ServerArgs  # defaults come from the dataclass, once
        p = parser.add_argument
        p("--model-path", "--model", dest="model_path", required=True)
        p("--tokenizer-path", default=None)
        p("--load-format", default=d.load_format, choices=["auto", "safetensors", "dummy"])
        p("--skip-tokenizer-init", action="store_true")
        p("--dtype", default=d.dtype, choices=["auto", "float32", "bfloat16", "float16", "half"])
        p("--device", default=d.device)
        p("--served-model-name", default=None)
        p("--context-length", type=int, default=None)
        p("--trust-remote-code", action="store_true")
        p("--host", default=d.host)
        p("--port", type=int, default=d.port)
        p("--api-key", default=None)
        p("--enable-metrics", action="store_true", default=True)
        p("--log-level", default=d.log_level)
        p("--log-requests", action="store_true")
        p("--page-size", type=int, default=d.page_size)
        p("--max-total-tokens", type=int, default=None)
        p("--mem-fraction-static", type=float, default=None)
        p("--chunked-prefill-size", type=int, default=d.chunked_prefill_size)
        p("--max-prefill-tokens", type=int, default=d.max_prefill_tokens)
        p("--max-running-requests", type=int, default=d.max_running_requests)
        p("--max-queued-requests", type=int, default=d.max_queued_requests,
          help="requests the server holds at once (waiting + running); beyond it 503 + Retry-After")
        p("--schedule-policy", "--prefill-policy", dest="schedule_policy", default=d.schedule_policy,
          choices=sorted(PREFILL_POLICIES), help="prefill scheduling policy")
        p("--decode-policy", default=d.decode_policy, choices=sorted(DECODE_POLICIES))
        p("--attention-backend", default=d.attention_backend, choices=sorted(ATTENTION_BACKENDS),
          help="auto: flashinfer on CUDA if importable, else triton; torch on CPU")
        p("--cuda-graph-max-bs", type=int, default=d.cuda_graph_max_bs,
          help="largest decode batch captured in a CUDA graph (CUDA only)")
        p("--disable-cuda-graph", action="store_true", help="run every step eagerly on CUDA")
        p("--enable-mixed-chunk", action="store_true",
          help="run prefill chunks and decodes of running requests in one forward")
        p("--short-prefill-buckets", default=d.short_prefill_buckets,
          help="padded (tokens x batch) shapes of short-prefill steps, e.g. 64,128,256x1,2,4,8")
        p("--slo-ttft-ms", type=float, default=None, help="default TTFT SLO of requests without one")
        p("--slo-tpot-ms", type=float, default=None, help="default TPOT SLO of requests without one")
        p("--cost-model-profile", default=None, help="measured step times JSON (docs/profile.md)")
        p("--prefill-no-slo-ttft-ms", type=float, default=d.prefill_no_slo_ttft_ms,
          help="deadline-aware prefill policies: TTFT deadline of requests without an SLO")
        p("--prefill-deadline-margin-ms", type=float, default=d.prefill_deadline_margin_ms,
          help="taken off prefill deadlines (PD prefill: the KV transfer still to come)")
        p("--prefill-max-partial", type=int, default=d.prefill_max_partial,
          help="partly prefilled requests (each holding pages) at once")
        p("--prefill-starve-factor", type=float, default=d.prefill_starve_factor,
          help="kairos+: a request that waited this many TTFT SLOs is served first")
        p("--prefill-time-budget-ms", type=float, default=None,
          help="Medha adaptive chunking: largest chunks that fit this step time (ms); off by default")
        p("--prefill-queues", default=d.prefill_queues, choices=["single", "dual"],
          help="dual: short and long prefill queues, short batches by AWD")
        p("--short-prefill-threshold", default=d.short_prefill_threshold,
          help="new tokens <= N are short; 'auto' = PLA-Serve's fitted compute/memory boundary")
        p("--prefill-role", default=d.prefill_role, choices=["both", "short", "long"],
          help="the prefill class this instance serves first (others only when it has none)")
        p("--prefill-long-max-wait-ms", type=float, default=d.prefill_long_max_wait_ms,
          help="dual queues: longest wait of the long queue's head behind short batches")
        for name, kind, help_text in (
                ("awd-w-min-ms", float, "AWD window lower bound W_min"),
                ("awd-w-max-ms", float, "AWD window upper bound W_max"),
                ("awd-sigma-ms", float, "AWD: dispatch at once below this slack"),
                ("awd-delta-ms", float, "AWD: safety margin of the SLA window"),
                ("awd-t-max-ms", float, "AWD: head-of-line wait bound"),
                ("awd-rate-floor", float, "AWD: arrival-rate floor eps (req/s)"),
                ("awd-min-batch-tokens", int, "AWD: deadline-free dispatch at this many tokens (M_s)")):
            p(f"--{name}", type=kind, default=getattr(d, name.replace("-", "_")), help=help_text)
        p("--token-pacing", action="store_true",
          help="stream tokens that run ahead of a request's TPOT SLO at the SLO pace (off: as made)")
        p("--watchdog-timeout", type=float, default=d.watchdog_timeout,
          help="seconds without engine progress, with work pending, before /health fails")
        p("--random-seed", type=int, default=d.random_seed)
        p("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=d.tp_size)
        p("--disaggregation-mode", "--mode", dest="disaggregation_mode", default=d.disaggregation_mode,
          choices=list(DISAGG_MODES) + list(_MODE_ALIASES))
        p("--disaggregation-transfer-backend", default=d.disaggregation_transfer_backend,
          choices=["nixl"])
        p("--disaggregation-bootstrap-port", type=int, default=d.disaggregation_bootstrap_port)
        p("--disaggregation-ib-device", default=None)
        p("--num-reserved-decode-tokens", type=int, default=d.num_reserved_decode_tokens)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "ServerArgs":
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {k: v for k, v in vars(args).items() if k in names}
        if kwargs.get("dtype") == "half":
            kwargs["dtype"] = "float16"
        return cls(**kwargs)


def parse_server_args(argv: list[str] | None = None) -> ServerArgs:
    parser = argparse.ArgumentParser(prog="python -m sglang_pd.launch_server")
    ServerArgs.add_cli_args(parser)
    return ServerArgs.from_cli_args(parser.parse_args(argv))
