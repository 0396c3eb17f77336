"""Every message that crosses a process boundary, as msgspec structs (never pickle).

Channels (ZMQ PUSH/PULL over ipc://):
  frontend -> engine: GenerateReq | AbortReq | one ControlReq subclass per control call
  engine -> frontend: BatchOut | ControlResp
Decoding uses the tagged unions ``ToEngine`` / ``FromEngine``.
"""

from __future__ import annotations

import math

import msgspec

from sglang_pd_router.slo_units import slo_ms_to_s

# input limits that SamplingParams.validate enforces (frontend/limits.py lists them all)
MAX_STOP_STRINGS = 32
MAX_STOP_STRING_CHARS = 256
MAX_STOP_TOKEN_IDS = 256
GREEDY_TEMPERATURE = 1e-5  # below these, temperature and top_p underflow in float32:
GREEDY_TOP_P = 1e-6  # such requests run greedy (the top token), as the limit means


class SamplingParams(msgspec.Struct, omit_defaults=True):
    """SGLang's sampling parameters (names and meaning as in SGLang's /generate)."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: no top-k
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    stop: list[str] = []
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    seed: int | None = None
    n: int = 1

    @property
    def is_greedy(self) -> bool:
        # temperatures and top_p this small underflow in float32 (and mean "the top token")
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1 or self.top_p < GREEDY_TOP_P

    def validate(self, vocab_size: int | None = None) -> str | None:
        """Return a message naming the first bad value (and what is allowed), or None."""
        checks: list[tuple[bool, str]] = [
            (self.max_new_tokens >= 0, f"max_new_tokens must be >= 0, got {self.max_new_tokens}"),
            (self.temperature >= 0.0, f"temperature must be >= 0, got {self.temperature}"),
            (0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}"),
            (self.top_k == -1 or self.top_k >= 1, f"top_k must be -1 (off) or >= 1, got {self.top_k}"),
            (0.0 <= self.min_p <= 1.0, f"min_p must be in [0, 1], got {self.min_p}"),
            (-2.0 <= self.frequency_penalty <= 2.0,
             f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}"),
            (-2.0 <= self.presence_penalty <= 2.0,
             f"presence_penalty must be in [-2, 2], got {self.presence_penalty}"),
            (0.0 < self.repetition_penalty <= 2.0,
             f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}"),
            (0 <= self.min_new_tokens <= max(self.max_new_tokens, 0),
             f"min_new_tokens must be in [0, max_new_tokens], got {self.min_new_tokens}"),
            (self.n == 1, f"n must be 1 (parallel sampling is not supported), got {self.n}"),
            (all(isinstance(s, str) and s for s in self.stop), "stop strings must be non-empty"),
            (len(self.stop) <= MAX_STOP_STRINGS,
             f"at most {MAX_STOP_STRINGS} stop strings, got {len(self.stop)}"),
            (all(len(s) <= MAX_STOP_STRING_CHARS for s in self.stop),
             f"stop strings must be at most {MAX_STOP_STRING_CHARS} characters"),
            (len(self.stop_token_ids) <= MAX_STOP_TOKEN_IDS,
             f"at most {MAX_STOP_TOKEN_IDS} stop_token_ids, got {len(self.stop_token_ids)}"),
            (all(math.isfinite(v) for v in (self.temperature, self.top_p, self.min_p, self.frequency_penalty,
                                            self.presence_penalty, self.repetition_penalty)),
             "sampling parameters must be finite numbers"),
        ]
        if vocab_size is not None:
            bad = [t for t in self.stop_token_ids if not 0 <= t < vocab_size]
            checks.append((not bad, f"stop_token_ids {bad} outside the vocabulary [0, {vocab_size})"))
        for ok, message in checks:
            if not ok:
                return message
        return None


class Slo(msgspec.Struct, frozen=True, omit_defaults=True):
    """A request's SLO in seconds, resolved once where the request enters (``request_params.
    parse_slo``: body, then headers, then the server's ``--slo-*-ms`` defaults); policies read it
    and never apply defaults. A field left None is "no SLO" (docs/scheduling.md, "SLOs")."""

    ttft_s: float | None = None
    tpot_s: float | None = None

    @classmethod
    def from_ms(cls, ttft_ms: float | None, tpot_ms: float | None) -> Slo | None:
        """A request's SLO from milliseconds (the wire's and the flags' unit)."""
        ttft_s, tpot_s = slo_ms_to_s(ttft_ms), slo_ms_to_s(tpot_ms)
        return None if ttft_s is None and tpot_s is None else cls(ttft_s, tpot_s)


# PD requests with this bootstrap_host run locally without a KV transfer (health checks)
FAKE_BOOTSTRAP_HOST = "2.2.2.2"


class BootstrapInfo(msgspec.Struct, omit_defaults=True):
    """SGLang's PD fields: where the prefill's bootstrap server is and the room id."""

    host: str
    port: int
    room: int


class GenerateReq(msgspec.Struct, tag="generate"):
    rid: str
    input_ids: list[int]
    sampling_params: SamplingParams
    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = 0
    arrival_time: float = 0.0  # time.time() at the frontend
    slo: Slo | None = None  # resolved (seconds): the engine applies no default
    # "short" | "long" as the frontend resolved it (sglang_pd_router.request_class.resolve_class:
    # the router's when its token count matched ours, else ours); "": unclassified
    request_class: str = ""
    bootstrap: BootstrapInfo | None = None


class AbortReq(msgspec.Struct, tag="abort"):
    rid: str  # "" aborts every request


class ControlReq(msgspec.Struct, kw_only=True):
    """A request/response call into the engine: one struct per call (below), each its own tag,
    so the engine dispatches on the type and a call's arguments are typed. The frontend sets
    ``call_id`` when it sends the call (0 until then) and the answer's ControlResp carries it."""

    call_id: int = 0

    @property
    def method(self) -> str:
        """The call's name on the wire (its tag): 'get_load', 'flush_cache', ..."""
        return str(self.__struct_config__.tag)


class GetLoad(ControlReq, tag="get_load", kw_only=True):
    """/get_load: the engine's load signals (EngineStats and SGLang's spellings)."""


class ServerInfo(ControlReq, tag="server_info", kw_only=True):
    """/server_info's internal state: pool sizes, retractions, throughput."""


class FlushCache(ControlReq, tag="flush_cache", kw_only=True):
    """/flush_cache: succeeds only while no request runs."""


class CheckIntegrity(ControlReq, tag="check_integrity", kw_only=True):
    """Check the KV pool's conservation invariant (tests and debugging)."""


class SetPrefillRole(ControlReq, tag="set_prefill_role", kw_only=True):
    """/set_prefill_role: the router's pool controller moves a prefill instance between pools."""

    role: str


class Shutdown(ControlReq, tag="shutdown", kw_only=True):
    """Abort everything and leave the engine loop (the frontend drains first)."""


CONTROL_CALLS: tuple[type[ControlReq], ...] = (GetLoad, ServerInfo, FlushCache, CheckIntegrity,
                                               SetPrefillRole, Shutdown)


class TokenLogprob(msgspec.Struct, array_like=True):
    logprob: float
    token_id: int


class ReqOutput(msgspec.Struct, omit_defaults=True):
    """New tokens of one request since the last BatchOut (incremental, never cumulative)."""

    rid: str
    new_token_ids: list[int]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    # None while running; else {"type": "stop"|"length"|"abort", "matched"/"length"/"message": ...}
    finish_reason: dict[str, str | int | None] | None = None
    # one entry per new token when return_logprob
    output_token_logprobs: list[TokenLogprob] | None = None
    output_top_logprobs: list[list[TokenLogprob]] | None = None
    error_status: int = 0  # HTTP status for engine-side rejections (400, 503 ...); 0 = none


class StepSamples(msgspec.Struct, array_like=True):
    """Per-step samples from ``EngineCore.step_profiles`` (same length lists)."""

    modes: list[str] = []  # extend | decode | mixed
    batch_sizes: list[int] = []
    seconds: list[float] = []  # StepProfile.total_s


class EngineStats(msgspec.Struct):
    num_running_reqs: int
    num_queue_reqs: int
    token_usage: float  # used KV tokens / pool tokens
    gen_throughput: float  # generated tokens/s over the last stats window
    num_used_tokens: int
    max_total_num_tokens: int
    # load signals for routers and autoscalers (docs/api.md lists every name). Per-class values
    # (short/long prefill queues) use the suffix scheme <name>_short / <name>_long.
    num_queue_prefill_tokens: int = 0  # prompt tokens still to prefill, all waiting requests
    num_running_decode_tokens: int = 0  # KV tokens of the running (decoding) requests
    num_free_pages: int = 0
    num_total_pages: int = 0
    # prefix cache (core/radix_cache.py): pages it holds (free pages exclude them), of them not
    # used by any request, cached prompt tokens / prompt tokens of admitted requests (cumulative)
    num_cached_pages: int = 0
    num_evictable_pages: int = 0
    cache_hit_rate: float = 0.0
    num_retractions_total: int = 0
    num_preempted_prefills_total: int = 0
    engine_stall_s: float = 0.0  # seconds queued work has made no progress (the watchdog's input)
    # livelock (core/watchdog.py): seconds prefill work has been thrown away repeatedly with no
    # request completing, and how many such runs there were (sglang:engine_livelock_episodes_total)
    engine_livelock_s: float = 0.0
    num_livelock_episodes_total: int = 0
    num_preempted_prefill_tokens_total: int = 0  # prefill tokens thrown away (recomputed later)
    role: str = "colocated"  # colocated | prefill | decode (not a gauge: a label-like string)
    # PD disaggregation (0 in colocated mode); names as SGLang's metrics
    num_prefill_bootstrap_queue_reqs: int = 0  # waiting for their decode to register pages
    num_prefill_inflight_queue_reqs: int = 0
    num_decode_prealloc_queue_reqs: int = 0
    num_decode_transfer_queue_reqs: int = 0
    num_bootstrap_failed_reqs_total: int = 0
    num_transfer_failed_reqs_total: int = 0
    kv_transfer_speed_gb_s: float = 0.0
    kv_transfer_latency_ms: float = 0.0
    # decode-side prefix reuse (disaggregation/decode_reuse.py): prefill's pages (bytes) written
    # to decodes and prompt pages (bytes) not sent since the decode held them; decode's prompt
    # tokens reused from its own cache and pages it registered for prefill to write
    kv_transfer_pages_total: int = 0
    kv_transfer_bytes_total: int = 0
    kv_transfer_skipped_pages_total: int = 0
    kv_transfer_skipped_bytes_total: int = 0
    num_decode_reused_tokens_total: int = 0
    num_decode_registered_pages_total: int = 0
    # dual prefill queues and the router's pool controller (core/load_signals.py)
    prefill_role: str = "both"  # both | short | long (a label-like string, not a gauge)
    short_prefill_threshold: int = 0  # new tokens <= this are short (the fitted value under auto)
    num_queue_reqs_short: int = 0
    num_queue_reqs_long: int = 0
    num_queue_prefill_tokens_short: int = 0
    num_queue_prefill_tokens_long: int = 0
    slo_ttft_deviation_short: float = 0.0  # mean (TTFT - SLO) / SLO over recent first tokens
    slo_ttft_deviation_long: float = 0.0
    busy_fraction: float = 0.0  # share of the last 10 s the engine spent stepping
    # the engine steps since the previous stats message, for /metrics histograms (issue 21);
    # None where no samples are taken (/get_load): one entry per step in each list
    step_samples: StepSamples | None = None


class BatchOut(msgspec.Struct, tag="batch_out"):
    outputs: list[ReqOutput]
    stats: EngineStats | None = None


class ControlResp(msgspec.Struct, tag="control_resp"):
    call_id: int
    ok: bool
    result: dict[str, str | int | float | bool | None] = {}
    error: str = ""


class EngineReady(msgspec.Struct):
    """Sent once by the engine process over its startup pipe (error set when it failed)."""

    ok: bool
    error: str = ""
    model_path: str = ""
    served_model_name: str = ""
    architecture: str = ""
    context_length: int = 0
    vocab_size: int = 0
    eos_token_ids: list[int] = []
    max_total_num_tokens: int = 0
    max_running_requests: int = 0
    page_size: int = 0
    num_pages: int = 0
    disaggregation_mode: str = "colocated"


ToEngine = (GenerateReq | AbortReq | GetLoad | ServerInfo | FlushCache | CheckIntegrity | SetPrefillRole
            | Shutdown)
FromEngine = BatchOut | ControlResp

_encoder = msgspec.msgpack.Encoder()
_to_engine = msgspec.msgpack.Decoder(ToEngine)
_from_engine = msgspec.msgpack.Decoder(FromEngine)


def encode(msg: msgspec.Struct) -> bytes:
    return _encoder.encode(msg)


def decode_engine_ready(data: bytes) -> EngineReady:
    return msgspec.msgpack.decode(data, type=EngineReady)


def decode_to_engine(data: bytes) -> GenerateReq | AbortReq | ControlReq:
    return _to_engine.decode(data)


def decode_from_engine(data: bytes) -> BatchOut | ControlResp:
    return _from_engine.decode(data)
