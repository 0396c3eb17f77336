"""How a colocated server interleaves prefill with the decodes it is running (issue 28, item 2).

Without a rule the engine ran every waiting prefill before any decode: under a steady stream of
prompts (a long-tail mix with 3K-token ones) decoding starved outright (p50 TPOT of 15-19 s on
the SmolLM2 shape), and the decode policies' reservations (``slack+``'s pace) meant nothing.

The rule (a time budget per decode step, after Medha's time-budget chunking and Sarathi's
stall-free batching), applied only while decodes are running (with none, prefill runs as before):
- B, the prefill time one decode step may wait for: ``--prefill-time-budget-ms`` or else
  ``--slo-tpot-ms`` (Medha's target step time) minus the decode step's own time, at least
  ``MIN_BUDGET_S``; with neither, ``PREFILL_SHARE`` (1.5) times the decode step's time (prefill
  takes at most 60% of the time while decodes run; decode keeps at least 40% of its throughput).
  The decode step's time is what this server measured (a moving average of its pure decode
  steps; before the first one, ``COLD_DECODE_S``).
- a step's prefill tokens are capped to what the prefill cost model predicts fits in B, at the
  context of the longest partly prefilled request (a chunk over a long context costs more),
  and to B over the measured seconds per token of recent pure prefill steps (the cost model
  starts from a prior that can be far off, e.g. a GPU prior on a CPU, and needs a window of
  samples to move: the measured rate is right from the first prefill step); never below
  ``floor_tokens``: ``MIN_TOKENS`` (prefill always progresses), or more where a step's launch
  costs as much as that many tokens once the model has learnt (smaller chunks would cost
  prefill over half its throughput for little gain to the decodes);
- without mixed steps, a prefill step is followed by a decode step whenever decodes run; with
  ``--enable-mixed-chunk`` the decodes ride along every prefill step.
Bound: between two decode steps of a running request, prefill adds at most one step of
max(B, the floor's step) (as predicted by the cost model, which learns from every pure prefill
step), so TPOT <= decode step + B (the TPOT SLO when one is set, else 2.5x the decode step
time) wherever a floor-sized step fits in B.
Pure: no torch, no I/O, time passed in; the Scheduler calls it from ``schedule`` and ``observe``.
"""

from __future__ import annotations

import math

from sglang_pd.core.step import ForwardMode, StepProfile
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.cost_model import PrefillCostModel
from sglang_pd.scheduling.prefill.chunking import largest_chunk

PREFILL_SHARE = 1.5  # without a TPOT target: B = this x the decode step time
MIN_BUDGET_S = 2e-3  # an SLO tighter than the decode step itself still lets prefill move
MIN_TOKENS = 32  # prefill tokens a step may always take (progress whatever the model says)
COLD_DECODE_S = 0.02  # the decode step time assumed before one was measured
EMA = 0.2  # weight of the newest decode step in the moving average


class ColocatedInterleave:
    def __init__(self, cfg: PolicyConfig, model: PrefillCostModel | None = None) -> None:
        self.cfg = cfg
        self.model = model if model is not None else PrefillCostModel.from_config(cfg)
        target_ms = cfg.prefill_time_budget_ms or cfg.slo_tpot_ms
        self.target_s = target_ms / 1e3 if target_ms else None
        self.mixed = cfg.enable_mixed_chunk
        self.decode_s = COLD_DECODE_S
        self._seen_decode = False
        self.token_s: float | None = None  # measured seconds per prefill token (moving average)

    def budget_s(self) -> float:
        """B: prefill time a decode step may wait for (module docstring)."""
        if self.target_s is not None:
            return max(self.target_s - self.decode_s, MIN_BUDGET_S)
        return PREFILL_SHARE * self.decode_s

    def prefill_tokens(self, context: int, cap: int) -> int:
        """The most prefill tokens (<= cap) one step may take next to running decodes;
        ``context``: the longest partly prefilled request's KV length."""
        b = self.budget_s()
        if not self.mixed:
            b -= self.model.coeffs.launch_s  # a pure prefill step pays its own launch
        n = largest_chunk(self.model, b, context, cap)
        if self.token_s:
            n = min(n, int(max(b, 0.0) / self.token_s))
        return max(n, min(self.floor_tokens(), cap))

    def floor_tokens(self) -> int:
        """The smallest prefill step worth its launch: where the step's fixed cost equals its
        token work (smaller steps cost prefill more throughput than they save the decodes)."""
        m = self.model
        if m.learn and m.num_samples < m.min_samples:
            return MIN_TOKENS  # the prior's launch/token split says nothing about this machine
        k = m.coeffs.b + m.coeffs.g_w
        return max(MIN_TOKENS, math.ceil(m.coeffs.launch_s / k) if k > 0 else MIN_TOKENS)

    def decode_turn(self, last_was_prefill: bool) -> bool:
        """Whether this step must decode first: after a prefill step that left decodes waiting."""
        return last_was_prefill and not self.mixed

    def observe(self, step: StepProfile, elapsed_s: float) -> None:
        self.model.observe(step, elapsed_s, 0.0)
        if step.mode is ForwardMode.EXTEND and step.new_tokens > 0 and elapsed_s > 0:
            per = elapsed_s / step.new_tokens  # launch included: errs on the small side
            self.token_s = per if self.token_s is None else self.token_s + EMA * (per - self.token_s)
        if step.mode is ForwardMode.DECODE and elapsed_s > 0:
            if not self._seen_decode:
                self.decode_s, self._seen_decode = elapsed_s, True
            else:
                self.decode_s += EMA * (elapsed_s - self.decode_s)
