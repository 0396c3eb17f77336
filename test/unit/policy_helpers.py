"""Length-only request views and a counting KV admission for policy unit tests."""

from __future__ import annotations

from dataclasses import dataclass

from sglang_pd.scheduling.types import SchedReq


@dataclass(eq=False)
class FakeReq:
    rid: str
    arrival: float
    prompt_len: int
    prefilled_len: int = 0
    cached_len: int = 0
    n_generated: int = 0
    first_token_time: float | None = None
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    predicted_output_len: int | None = None

    @property
    def prefill_remaining(self) -> int:
        return self.prompt_len - self.prefilled_len

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.n_generated


class CountingKV:
    def __init__(self, free_tokens: int) -> None:
        self.free = free_tokens

    def can_admit(self, req: SchedReq, new_tokens: int) -> bool:
        return new_tokens <= self.free

    def admit(self, req: SchedReq, new_tokens: int) -> None:
        self.free -= new_tokens
