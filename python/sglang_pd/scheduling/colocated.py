"""How a colocated server interleaves prefill with the decodes it is running (issue 28, item 2).

Without a rule the engine ran every waiting prefill before any decode: under a steady stream of
prompts (a long-tail mix with 3K-token ones) decoding starved outright (p50 TPOT of 15-19 s on
the SmolLM2 shape), and the decode policies' reservations (``slack+``'s pace) meant nothing.

The rule (a time budget per decode step, after Medha's time-budget chunking and Sarathi's
stall-free batching), applied only while decodes are running (with none, prefill runs as before):
- B, the prefill time one decode step may wait for: ``--prefill-time-budget-ms`` or else
  ``--slo-tpot-ms`` (Medha's target step time) minus the decode step's own time, at least
  ``MIN_BUDGET_S``; with neither, ``PREFILL_SHARE`` (1.5) times the decode step's time (prefill
  takes at most 60% of the time while decodes run; decode keeps at least 40% of its throughput),
  but at least ``NO_SLO_TARGET_S`` (50 ms) less the decode step: a step target no one asked to
  be faster (20 tokens/s, faster than anyone reads). Where decode steps are fast (a GPU: 2.4 ms
  for Llama-3-8B on 8 H100s) 1.5 of them buys less than one prefill launch (3.9 ms there), so
  prefill ran in floor-sized steps at half its throughput while decodes ran, and the Medha
  scenario went from loaded to overloaded (short p90 TTFT 1.2 -> 66 s); where they are slow
  (the CPU engine: ~100 ms) the share rule is the larger and applies as before.
  The decode step's time is what this server measured (a moving average of its pure decode
  steps; before the first one, ``COLD_DECODE_S``).
- each request's chunk is sized by the prefill time left in the step at that request's own
  context (``StepAllowance``, handed to the policy as ``PrefillBudget.step_time``; the walk and
  ``PrefillBudget.grant`` ask it request by request): a chunk over a long context costs more
  per token, so a long partly prefilled request gets a small chunk while short prompts beside
  it get chunks sized for theirs (a cap computed at the longest partial's context held every
  step, short prompts included, to what fits at 300-800K tokens of context: issue 28, the
  Medha scenario). Times are the prefill cost model's, times the measured/predicted ratio of
  recent pure prefill steps (the model starts from a prior that can be far off, e.g. a GPU
  prior on a CPU, and needs a window of samples to move: the ratio is right from the first
  prefill step). The step's token budget is capped at what fits at context 0 (no request can
  take more). The first request of a step always gets at least ``floor_tokens``:
  ``MIN_TOKENS`` (prefill always progresses), or more where a step's launch costs as much as
  that many tokens once the model has learnt (smaller chunks would cost prefill over half
  its throughput for little gain to the decodes);
- without mixed steps, a prefill step is followed by a decode step whenever decodes run; with
  ``--enable-mixed-chunk`` the decodes ride along every prefill step.
Bound: between two decode steps of a running request, prefill adds at most one step of
max(B, the floor's step) (as predicted by the cost model, which learns from every pure prefill
step, plus one per-request overhead per extra request in the step), so TPOT <= decode step +
B (the TPOT SLO when one is set, else the larger of 2.5x the decode step time and 50 ms)
wherever a floor-sized step fits in B.
Pure: no torch, no I/O, time passed in; the Scheduler calls it from ``schedule`` and ``observe``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sglang_pd.core.step import ForwardMode, StepProfile
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.cost_model import PrefillCostModel
from sglang_pd.scheduling.prefill.chunking import largest_chunk
from sglang_pd.scheduling.types import SchedReq

PREFILL_SHARE = 1.5  # without a TPOT target: B = this x the decode step time ...
NO_SLO_TARGET_S = 0.05  # ... or this less the decode step, whichever is larger
MIN_BUDGET_S = 2e-3  # an SLO tighter than the decode step itself still lets prefill move
MIN_TOKENS = 32  # prefill tokens a step may always take (progress whatever the model says)
COLD_DECODE_S = 0.02  # the decode step time assumed before one was measured
EMA = 0.2  # weight of the newest decode step in the moving average


class StepAllowance:
    """One step's prefill time (``types.StepTime``): ``seconds`` of predicted prefill time (the
    cost model's times ``scale``), spent request by request at each one's own context; the
    first grant of the step gets at least ``floor`` tokens. ``keep``: time held back, while one
    request is sized, for the requests planned after it (``keep_for``)."""

    def __init__(self, model: PrefillCostModel, seconds: float, scale: float, floor: int,
                 share: float = 1.0) -> None:
        self.model, self.left, self.scale, self.floor = model, seconds, scale, floor
        self.first = True
        self.keep = 0.0
        self.others_s = max(0.0, 1.0 - share) * seconds  # most one request leaves to the others

    def fit(self, req: SchedReq, want: int) -> int:
        n = largest_chunk(self.model, (self.left - self.keep) / self.scale, req.prefilled_len, want)
        if not self.first or (self.keep and n):
            return n  # (with requests behind it the step is worth its launch without the floor)
        return max(n, min(want, self.floor))

    def keep_for(self, reqs: Sequence[SchedReq], ns: Sequence[int]) -> list[float]:
        """For each request of a planned step (in grant order, ``ns`` tokens each): the time to
        hold back for the ones after it over a shorter context, their predicted time but at
        most ``1 - share`` of the step. The token rule's per-request cap in time: with tokens,
        a request's chunk (``--chunked-prefill-size``) is a ``share`` of the step
        (``--max-prefill-tokens``) and the rest goes to the requests behind it; with a time
        allowance a long context's chunk (few tokens, each dear) could spend the whole step, so
        a prompt ranked behind a long partly prefilled one waited until that one was done
        (issue 28: the Medha scenario's short p90 TTFT 1.2 -> 45 s). A request over a shorter
        context than those behind it keeps the time it is ranked for."""
        out = [0.0] * len(ns)
        cost = [self.scale * self.model.marginal_s(n, r.prefilled_len) for r, n in zip(reqs, ns)]
        ctx = [r.prefilled_len for r in reqs]
        for j in range(len(ns) - 1):
            if ctx[j] > 0:  # only a started request's context can be longer than another's
                behind = sum(c for c, h in zip(cost[j + 1:], ctx[j + 1:]) if h < ctx[j])
                out[j] = min(behind, self.others_s)
        return out

    def spend(self, req: SchedReq, n: int) -> None:
        self.left -= self.scale * self.model.marginal_s(n, req.prefilled_len)
        self.first = False

    def spent(self) -> bool:
        return not self.first and self.left < self.scale * self.model.marginal_s(1, 0)


class ColocatedInterleave:
    def __init__(self, cfg: PolicyConfig, model: PrefillCostModel | None = None) -> None:
        self.cfg = cfg
        self.model = model if model is not None else PrefillCostModel.from_config(cfg)
        target_ms = cfg.prefill_time_budget_ms or cfg.slo_tpot_ms
        self.target_s = target_ms / 1e3 if target_ms else None
        self.mixed = cfg.enable_mixed_chunk
        # one request's share of a step's time while others are planned behind it: the share
        # of the step's tokens one request's chunk may take (``StepAllowance.keep_for``)
        self.share = min(1.0, cfg.chunked_prefill_size / max(cfg.max_prefill_tokens, 1))
        self.decode_s = COLD_DECODE_S
        self._seen_decode = False
        self.scale: float | None = None  # measured / predicted prefill step time (moving average)
        self._learnt = self._model_learnt()

    def budget_s(self) -> float:
        """B: prefill time a decode step may wait for (module docstring)."""
        if self.target_s is not None:
            return max(self.target_s - self.decode_s, MIN_BUDGET_S)
        return max(PREFILL_SHARE * self.decode_s, NO_SLO_TARGET_S - self.decode_s)

    def allowance(self) -> StepAllowance:
        """This step's prefill time, for ``PrefillBudget.step_time``."""
        scale = self.scale or 1.0
        b = self.budget_s()
        if not self.mixed:
            b -= scale * self.model.coeffs.launch_s  # a pure prefill step pays its own launch
        return StepAllowance(self.model, b, scale, self.floor_tokens(), self.share)

    def prefill_tokens(self, context: int, cap: int) -> int:
        """The most prefill tokens (<= cap) the first request of a step may take over
        ``context`` tokens of its own KV (context 0: the step's token cap)."""
        a = self.allowance()
        n = largest_chunk(self.model, a.left / a.scale, context, cap)
        return max(n, min(a.floor, cap))

    def floor_tokens(self) -> int:
        """The smallest prefill step worth its launch: where the step's fixed cost equals its
        token work (smaller steps cost prefill more throughput than they save the decodes)."""
        m = self.model
        if not self._model_learnt():
            return MIN_TOKENS  # the prior's launch/token split says nothing about this machine
        k = m.coeffs.b + m.coeffs.g_w
        return max(MIN_TOKENS, math.ceil(m.coeffs.launch_s / k) if k > 0 else MIN_TOKENS)

    def _model_learnt(self) -> bool:
        m = self.model
        return not m.learn or m.num_samples >= m.min_samples

    def decode_turn(self, last_was_prefill: bool) -> bool:
        """Whether this step must decode first: after a prefill step that left decodes waiting."""
        return last_was_prefill and not self.mixed

    def observe(self, step: StepProfile, elapsed_s: float) -> None:
        if step.mode is ForwardMode.EXTEND and step.new_tokens > 0 and elapsed_s > 0:
            predicted = self._predicted_s(step)  # before the model learns from this step
            if predicted > 0:
                ratio = elapsed_s / predicted
                self.scale = ratio if self.scale is None else self.scale + EMA * (ratio - self.scale)
        self.model.observe(step, elapsed_s, 0.0)
        if not self._learnt and self._model_learnt():
            self._learnt, self.scale = True, None  # fitted to this machine now: the old ratio is stale
        if step.mode is ForwardMode.DECODE and elapsed_s > 0:
            if not self._seen_decode:
                self.decode_s, self._seen_decode = elapsed_s, True
            else:
                self.decode_s += EMA * (elapsed_s - self.decode_s)

    def _predicted_s(self, step: StepProfile) -> float:
        """The cost model's time for a finished pure prefill step (``PrefillPoint``'s terms)."""
        c, b = self.model.coeffs, max(step.batch_size, 1)
        l, h = step.new_tokens, step.context_tokens
        attn = step.attn_tokens2 if step.attn_tokens2 is not None else (l * l + 2 * l * h) / b
        return c.launch_s + c.per_req_s * b + c.a * attn + (c.b + c.g_w) * l + c.g_r * h
