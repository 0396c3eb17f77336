"""What the scheduler hands the executor: ``ScheduledStep``, and what it needs of a request
(``SchedulerReq``, beyond the policies' ``SchedReq`` view). Torch-free (core/)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sglang_pd.core.step import ForwardMode, ReqState, StepProfile, StepShape
from sglang_pd.scheduling.types import SchedReq


class SchedulerReq(SchedReq, Protocol):
    """What the mechanism needs of a request beyond the policy view: its pages and KV length."""

    pages: list[int]
    kv_len: int
    state: ReqState
    num_retractions: int

    @property
    def prefill_target(self) -> int: ...  # tokens that need KV before the next decode step


@dataclass
class ScheduledStep:
    mode: ForwardMode
    plan: list[tuple[SchedulerReq, int]]  # (request, new tokens); decodes have n == 1, last
    shape: StepShape
    num_decode: int = 0  # the trailing decodes of a DECODE or MIXED step

    @property
    def reqs(self) -> list[SchedulerReq]:
        return [r for r, _ in self.plan]

    @property
    def prefill_plan(self) -> list[tuple[SchedulerReq, int]]:
        return self.plan[: len(self.plan) - self.num_decode]

    @property
    def decode_reqs(self) -> list[SchedulerReq]:
        return [r for r, _ in self.plan[len(self.plan) - self.num_decode:]]

    def profile(self, total_s: float = 0.0, forward_s: float = 0.0) -> StepProfile:
        """What the step held, KV lengths read before the step advanced them."""
        contexts = [r.kv_len for r, _ in self.plan]
        attn = sum(n * (n + 2 * h) for (_, n), h in zip(self.plan, contexts))
        return StepProfile(self.mode, len(self.plan), self.shape.num_tokens, sum(contexts),
                           max(contexts) if contexts else 0, self.shape, total_s, forward_s,
                           self.num_decode, attn)
