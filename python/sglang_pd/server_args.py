"""All server settings in one dataclass; CLI flag names follow SGLang's."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import tempfile
import uuid
from dataclasses import dataclass, field
from typing import cast

from sglang_pd.core.step import BucketGrid
from sglang_pd.engine.attention import ATTENTION_BACKENDS
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.profile import load_profile
from sglang_pd.scheduling.registry import DECODE_POLICIES, PREFILL_POLICIES
from sglang_pd.utils.flags import add_flags, flag, from_flags

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


@dataclass(frozen=True, kw_only=True)
class ServerArgs(PolicyConfig):
    """The server's settings: every scheduling setting (``PolicyConfig``, inherited with its
    flags) plus the server's own below. Each field with ``flag(...)`` is a CLI flag; a new
    setting is one line (utils/flags.py)."""

    model_path: str = flag(dataclasses.MISSING, "--model-path", "--model")
    tokenizer_path: str | None = flag(None, "--tokenizer-path")
    load_format: str = flag("auto", "--load-format", choices=("auto", "safetensors", "dummy"))
    skip_tokenizer_init: bool = flag(False, "--skip-tokenizer-init")
    # auto (config's dtype; float32 on CPU) | float32 | bfloat16 | float16 (half: its alias)
    dtype: str = flag("auto", "--dtype", choices=("auto", "float32", "bfloat16", "float16", "half"))
    device: str = flag("cpu", "--device")
    served_model_name: str | None = flag(None, "--served-model-name")
    context_length: int | None = flag(None, "--context-length")
    # accepted for compatibility; nothing remote is ever run
    trust_remote_code: bool = flag(False, "--trust-remote-code")
    # HTTP
    host: str = flag("127.0.0.1", "--host")
    port: int = flag(30000, "--port")
    api_key: str | None = flag(None, "--api-key")
    # /metrics is always served; flag kept for SGLang compatibility
    enable_metrics: bool = flag(True, "--enable-metrics")
    log_level: str = flag("info", "--log-level")
    log_requests: bool = flag(False, "--log-requests")
    # memory and batching (the per-step budgets are PolicyConfig's)
    max_total_tokens: int | None = flag(None, "--max-total-tokens")
    mem_fraction_static: float | None = flag(None, "--mem-fraction-static")
    max_queued_requests: int = flag(
        4096, "--max-queued-requests",
        help="requests the server holds at once (waiting + running); beyond it 503 + Retry-After")
    schedule_policy: str = flag("fcfs", "--schedule-policy", "--prefill-policy",
                                choices=lambda: sorted(PREFILL_POLICIES), help="prefill scheduling policy")
    decode_policy: str = flag("continuous", "--decode-policy", choices=lambda: sorted(DECODE_POLICIES))
    attention_backend: str = flag("torch", "--attention-backend", choices=lambda: sorted(ATTENTION_BACKENDS),
                                  help="auto: flashinfer on CUDA if importable, else triton; torch on CPU")
    cuda_graph_max_bs: int = flag(160, "--cuda-graph-max-bs",  # engine/cuda_graph.py
                                  help="largest decode batch captured in a CUDA graph (CUDA only)")
    # CUDA graphs run only on --device cuda with triton attention
    disable_cuda_graph: bool = flag(False, "--disable-cuda-graph", help="run every step eagerly on CUDA")
    disable_radix_cache: bool = flag(
        False, "--disable-radix-cache",
        help="no prefix cache (core/radix_cache.py): every prompt is computed from its first token")
    short_prefill_buckets: str = flag(
        str(BucketGrid()), "--short-prefill-buckets",
        help="padded (tokens x batch) shapes of short-prefill steps, e.g. 64,128,256x1,2,4,8")
    # release streamed tokens ahead of the TPOT SLO at its pace (frontend/token_pacing.py)
    token_pacing: bool = flag(
        False, "--token-pacing",
        help="stream tokens that run ahead of a request's TPOT SLO at the SLO pace (off: as made)")
    watchdog_timeout: float = flag(300.0, "--watchdog-timeout",
                                   help="seconds without engine progress, with work pending, before /health fails")
    random_seed: int = flag(0, "--random-seed")
    tp_size: int = flag(1, "--tp-size", "--tensor-parallel-size")
    # disaggregation ("null"/"none": SGLang's names of colocated)
    disaggregation_mode: str = flag("colocated", "--disaggregation-mode", "--mode",
                                    choices=DISAGG_MODES + tuple(_MODE_ALIASES))
    disaggregation_transfer_backend: str = flag("nixl", "--disaggregation-transfer-backend", choices=("nixl",))
    disaggregation_bootstrap_port: int = flag(8998, "--disaggregation-bootstrap-port")
    # accepted; UCX picks devices from UCX_NET_DEVICES
    disaggregation_ib_device: str | None = flag(None, "--disaggregation-ib-device")
    num_reserved_decode_tokens: int = flag(512, "--num-reserved-decode-tokens")
    disaggregation_prefill_handoff_wait_ms: float = flag(
        50.0, "--disaggregation-prefill-handoff-wait-ms",
        help="prefill: after a step that finished prompts, poll their KV hand-off this long at most "
             "before the next forward, and answer at once (a router that awaits the prefill's answer, "
             "as SGLang's does, is not held for that forward); 0: answer between forwards only, as "
             "SGLang's prefill does (engine/engine_core.py)")
    disaggregation_decode_enable_radix_cache: bool = flag(
        False, "--disaggregation-decode-enable-radix-cache",
        help="decode keeps finished requests' KV in a prefix cache; a follow-up prompt's cached "
             "pages are reused and prefill sends only the rest (disaggregation/decode_reuse.py)")
    # where the frontend and engine processes meet (derived per server if unset)
    ipc_dir: str = ""
    # PolicyConfig's, derived here from --disaggregation-mode and --short-prefill-buckets
    role: str = field(default="colocated", init=False)
    buckets: BucketGrid = field(default_factory=BucketGrid, init=False)

    def __post_init__(self) -> None:
        mode = _MODE_ALIASES.get(self.disaggregation_mode, self.disaggregation_mode)
        object.__setattr__(self, "disaggregation_mode", mode)
        object.__setattr__(self, "role", mode)
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
            object.__setattr__(self, "buckets", BucketGrid.parse(self.short_prefill_buckets))
        except ValueError as exc:
            problems.append(str(exc))
        for name, value, names in (("--schedule-policy", self.schedule_policy, PREFILL_POLICIES),
                                   ("--decode-policy", self.decode_policy, DECODE_POLICIES),
                                   ("--attention-backend", self.attention_backend, ATTENTION_BACKENDS)):
            if value not in names:
                problems.append(f"{name} must be one of {sorted(names)}, got {value!r}")
        if not problems:
            try:
                super().__post_init__()  # PolicyConfig's own checks (policy parameters)
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
            object.__setattr__(self, "ipc_dir", os.path.join(
                tempfile.gettempdir(), f"sglang_pd_ipc_{os.getpid()}_{uuid.uuid4().hex[:8]}"))

    def ensure_ipc_dir(self) -> str:
        os.makedirs(self.ipc_dir, exist_ok=True)
        return self.ipc_dir

    @property
    def bucket_grid(self) -> BucketGrid:
        return self.buckets

    def policy_config(self) -> PolicyConfig:
        """The one scheduling configuration (DESIGN.md section 3): these settings narrowed to
        PolicyConfig's fields."""
        return PolicyConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(PolicyConfig)})

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
        add_flags(parser, ServerArgs)  # one argument per flag field, PolicyConfig's included

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> ServerArgs:
        dtype = "float16" if args.dtype == "half" else args.dtype  # SGLang's alias
        return cast(ServerArgs, from_flags(cls, args, dtype=dtype))


def parse_server_args(argv: list[str] | None = None) -> ServerArgs:
    parser = argparse.ArgumentParser(prog="python -m sglang_pd.launch_server")
    ServerArgs.add_cli_args(parser)
    return ServerArgs.from_cli_args(parser.parse_args(argv))
