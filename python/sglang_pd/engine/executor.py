"""Running one scheduled step on the model: the forward, the scheduler's bookkeeping after it,
and sampling. It answers no client and knows nothing of PD: ``EngineCore`` acts on the result
(PD hooks for the chunks, stop checks and outputs for the sampled tokens)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import cast

import torch

from sglang_pd.core.scheduled_step import ScheduledStep
from sglang_pd.core.scheduler import Scheduler
from sglang_pd.core.step import ForwardMode
from sglang_pd.engine.forward_batch import ForwardBatch
from sglang_pd.engine.forward_timer import ForwardTimer
from sglang_pd.engine.model_runner import ModelRunner
from sglang_pd.engine.request import Req
from sglang_pd.engine.sampler import sample

logger = logging.getLogger(__name__)


@dataclass
class Sampled:
    """One request's new token; ``token_id`` None: its own sampling failed (its parameters)."""

    req: Req
    token_id: int | None
    logprob: float | None = None
    top: list | None = None
    first: bool = False  # the request's first output token (its prompt just completed)


@dataclass
class StepResult:
    chunked: list[Req]  # prefill chunks that ran with the prompt not yet complete
    sampled: list[Sampled]


class StepExecutor:
    def __init__(self, runner: ModelRunner, scheduler: Scheduler, eos_ids: list[int],
                 device: str) -> None:
        self.runner, self.scheduler, self.eos_ids = runner, scheduler, eos_ids
        self.timer = ForwardTimer(device)  # CUDA events on a GPU, host clock on CPU

    def run(self, step: ScheduledStep) -> StepResult:
        runner = self.runner
        if step.mode is ForwardMode.DECODE:
            reqs = cast(list[Req], step.reqs)  # the engine schedules only its own requests
            logits = self._forward(runner.build_decode(reqs))
            self.scheduler.after_decode(reqs)
            return StepResult([], self._sample(reqs, logits, num_first=0))
        # EXTEND, or MIXED: decodes ride along as one-token extends at the end of the plan
        logits = self._forward(runner.build_extend(cast(list[tuple[Req, int]], step.plan)))
        prefill = cast(list[tuple[Req, int]], step.prefill_plan)
        decodes = cast(list[Req], step.decode_reqs)
        done = cast(list[Req], self.scheduler.after_extend(prefill))
        self.scheduler.after_decode(decodes)
        done_set = set(done)
        chunked = [r for r, _ in prefill if r not in done_set]
        rows = [i for i, (r, _) in enumerate(prefill) if r in done_set]
        rows += range(len(prefill), len(step.plan))
        sampled = self._sample(done + decodes, logits[rows], num_first=len(done)) if rows else []
        return StepResult(chunked, sampled)

    def forward_s(self) -> float:
        """The last forward's time (read at the step's end, after sampling copied results back)."""
        return self.timer.seconds()

    def _forward(self, batch: ForwardBatch) -> torch.Tensor:
        self.timer.start()
        logits = self.runner.forward(batch)
        self.timer.stop()
        return logits

    def _sample(self, reqs: list[Req], logits: torch.Tensor, num_first: int) -> list[Sampled]:
        """One token per request (the first ``num_first`` get their first token). A request
        whose own sampling fails fails alone, never its batch."""
        try:
            out = sample(logits, reqs, self.eos_ids)
        except Exception:
            logger.exception("batched sampling failed; sampling the %d requests one by one", len(reqs))
            return [self._sample_one(req, logits[i:i + 1], i < num_first) for i, req in enumerate(reqs)]
        lps, tops = out.logprobs, out.top_logprobs
        return [Sampled(req, tok, lps[i] if lps is not None else None,
                        tops[i] if tops is not None else None, i < num_first)
                for i, (req, tok) in enumerate(zip(reqs, out.token_ids))]

    def _sample_one(self, req: Req, logits: torch.Tensor, first: bool) -> Sampled:
        try:
            out = sample(logits, [req], self.eos_ids)
        except Exception:
            logger.exception("sampling failed for request %s", req.rid)
            return Sampled(req, None, first=first)
        return Sampled(req, out.token_ids[0], out.logprobs[0] if out.logprobs is not None else None,
                       out.top_logprobs[0] if out.top_logprobs is not None else None, first)
