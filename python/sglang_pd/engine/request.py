"""Engine-side request state: a few counters, everything else derived.

Token stream of a request: prompt_ids + output_ids. ``kv_len`` tokens have KV in the pool
(pages in ``pages``). Prefill covers every token but the newest sampled one: after it, the
next decode step feeds output_ids[-1]. A request retracted to free memory drops its KV
(kv_len = 0) and is re-prefilled over prompt + output[:-1] without sampling again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sglang_pd.core.step import ReqState  # the one definition (torch-free)
from sglang_pd.protocol import GenerateReq, SamplingParams

# a frontend arrival older than this is a clock problem, not a queue: cap what it may claim
MAX_FRONTEND_AGE_S = 3600.0


@dataclass(eq=False)
class Req:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    arrival: float  # engine clock (time.monotonic) at the frontend's arrival
    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = 0
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    request_class: str = ""  # the frontend's (GenerateReq.request_class)
    predicted_output_len: int | None = None
    output_ids: list[int] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)
    kv_len: int = 0
    # prefix-cache hit (whole pages): looked up while waiting, locked at admission (core/prefix_hits.py)
    cached_len: int = 0
    state: ReqState = ReqState.WAITING
    first_token_time: float | None = None
    first_run_time: float | None = None  # the first step that ran it here (engine/request_log.py)
    finish_reason: dict | None = None
    sent_len: int = 0  # output tokens already handed to the frontend
    num_retractions: int = 0
    # PD disaggregation (prefill and decode servers)
    bootstrap_room: int = -1
    bootstrap_addr: tuple[str, int] = ("", 0)
    # per-token logprobs not yet sent: (logprob, token_id) and top-k lists
    pending_logprobs: list[tuple[float, int]] = field(default_factory=list)
    pending_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)

    @classmethod
    def from_msg(cls, msg: GenerateReq, now: float, wall_now: float | None = None) -> Req:
        """``now``: the engine clock; ``wall_now``: time.time() at the same instant. The request's
        clock starts at the frontend's arrival (``msg.arrival_time``, wall time), converted once
        into the engine clock, so queueing before the engine counts against its deadline. SLO:
        as the entry point resolved it (``request_params.parse_slo``); no default is applied here."""
        age = 0.0
        if msg.arrival_time > 0:
            wall = time.time() if wall_now is None else wall_now
            age = min(max(wall - msg.arrival_time, 0.0), MAX_FRONTEND_AGE_S)
        slo = msg.slo
        return cls(
            rid=msg.rid,
            prompt_ids=list(msg.input_ids),
            params=msg.sampling_params,
            arrival=now - age,
            stream=msg.stream,
            return_logprob=msg.return_logprob,
            top_logprobs_num=msg.top_logprobs_num,
            slo_ttft_s=slo.ttft_s if slo is not None else None,
            slo_tpot_s=slo.tpot_s if slo is not None else None,
            request_class=msg.request_class,
        )

    # ---- SchedReq view (scheduling/types.py)
    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def prefilled_len(self) -> int:
        return self.kv_len

    @property
    def n_generated(self) -> int:
        return len(self.output_ids)

    @property
    def seq_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def prefill_target(self) -> int:
        """Tokens that must have KV before the next decode step (all but the newest)."""
        return self.seq_len - 1 if self.output_ids else self.prompt_len

    @property
    def prefill_remaining(self) -> int:
        return max(self.prefill_target - self.kv_len, 0)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def token_ids(self, start: int, end: int) -> list[int]:
        """Tokens [start, end) of prompt + output without building the concatenation."""
        p = len(self.prompt_ids)
        if end <= p:
            return self.prompt_ids[start:end]
        if start >= p:
            return self.output_ids[start - p : end - p]
        return self.prompt_ids[start:] + self.output_ids[: end - p]
