"""Per-request state on the frontend, filled in by the TokenizerManager's receive loop."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from sglang_pd.frontend.detokenizer import OutputText
from sglang_pd.protocol import GenerateReq, TokenLogprob


@dataclass
class ReqState:
    req: GenerateReq
    # Shared by all requests of one HTTP call, so a batch waits on a single event.
    notify: asyncio.Event
    text: OutputText | None = None  # None with --skip-tokenizer-init
    return_text_in_logprobs: bool = False
    output_ids: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    finish_reason: dict[str, str | int | None] | None = None
    error_status: int = 0
    output_token_logprobs: list[TokenLogprob] = field(default_factory=list)
    output_top_logprobs: list[list[TokenLogprob]] = field(default_factory=list)
    created: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    updated: bool = False  # set by the receive loop, cleared by the consumer
    finished: bool = False

    @property
    def rid(self) -> str:
        return self.req.rid

    @property
    def visible_text(self) -> str:
        return self.text.visible if self.text is not None else ""

    @property
    def e2e_latency(self) -> float:
        end = self.finished_time if self.finished_time is not None else time.perf_counter()
        return end - self.created

    @property
    def error_message(self) -> str:
        reason = self.finish_reason or {}
        return str(reason.get("message") or "request failed in the engine")

    def take_update(self) -> bool:
        """True once per batch of new output (consumer side)."""
        was = self.updated
        self.updated = False
        return was
