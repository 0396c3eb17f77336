"""A length-only request: what the real ``Scheduler`` needs (``SchedulerReq``), no token lists."""

from __future__ import annotations

from dataclasses import dataclass, field

from sglang_pd.core.step import ReqState


@dataclass(eq=False)  # hashed by identity, as the engine's Req
class SimReq:
    rid: str
    arrival: float
    prompt_len: int
    output_len: int  # tokens it will generate (known to the simulator, not to policies)
    n_generated: int = 0
    kv_len: int = 0
    pages: list[int] = field(default_factory=list)
    state: ReqState = ReqState.WAITING
    num_retractions: int = 0
    first_token_time: float | None = None
    finish_time: float | None = None
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    predicted_output_len: int | None = None
    cached_len: int = 0

    @property
    def prefilled_len(self) -> int:
        return self.kv_len

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.n_generated

    @property
    def prefill_target(self) -> int:
        return self.seq_len - 1 if self.n_generated else self.prompt_len

    @property
    def prefill_remaining(self) -> int:
        return max(self.prefill_target - self.kv_len, 0)

    @property
    def done(self) -> bool:
        return self.n_generated >= self.output_len
