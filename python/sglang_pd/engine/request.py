"""Engine-side request state: a few counters, everything else derived.

Token stream of a request: prompt_ids + output_ids. ``kv_len`` tokens have KV in the pool
(pages in ``pages``). Prefill covers every token but the newest sampled one: after it, the
next decode step feeds output_ids[-1]. A request retracted to free memory drops its KV
(kv_len = 0) and is re-prefilled over prompt + output[:-1] without sampling again.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from sglang_pd.protocol import GenerateReq, SamplingParams


class ReqState(enum.Enum):
    WAITING = "waiting"  # queued for (more) prefill
    RUNNING = "running"  # decoding
    FINISHED = "finished"


@dataclass(eq=False)
class Req:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    arrival: float  # engine clock (time.monotonic) at admission to the queue
    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = 0
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    predicted_output_len: int | None = None
    output_ids: list[int] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)
    kv_len: int = 0
    state: ReqState = ReqState.WAITING
    first_token_time: float | None = None
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
    def from_msg(cls, msg: GenerateReq, now: float) -> "Req":
        slo = msg.slo
        return cls(
            rid=msg.rid,
            prompt_ids=list(msg.input_ids),
            params=msg.sampling_params,
            arrival=now,
            stream=msg.stream,
            return_logprob=msg.return_logprob,
            top_logprobs_num=msg.top_logprobs_num,
            slo_ttft_s=slo.ttft_ms / 1e3 if slo and slo.ttft_ms else None,
            slo_tpot_s=slo.tpot_ms / 1e3 if slo and slo.tpot_ms else None,
        )

    # ---- SchedReq view (scheduling/types.py)
    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def cached_len(self) -> int:
        return 0

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
