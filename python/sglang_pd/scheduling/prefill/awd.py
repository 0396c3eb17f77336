"""Adaptive Wait-Depth batching of short prefills (PLA-Serve §3.1-3.2, Alg. 1).

Short prompts gain most from running many at once (one launch, one pass over the weights, and
on GPUs one captured CUDA graph per padded (L, B) shape), so AWD waits a little to fill a
batch, but never past what a request's TTFT deadline allows. State: a waiting window W and a
target depth D, adapted after every dispatch.

Per decision (time t, short queue Q_s in arrival order), as PLA-Serve states it:
- the candidate batch: the most urgent request's length bucket first ("bucket-first"), then
  smaller buckets (padded up), arrival order inside; at most D_max requests, where D_max is the
  largest grid batch whose padded shape fits the step's token budget M;
- S_hat: the predicted time of that batch (the fitted ``PrefillCostModel``);
- W_SLA = max(0, min_i (DDL_i - t - S_hat) - delta), W_GR = max(0, D - depth) / max(r_s, eps);
- dispatch now when depth >= D, when any slack min_i (DDL_i - t - S_hat) <= sigma (the batch is
  built around that request, so it is in the batch it triggers), when the head-of-line wait
  exceeds T_max, or when the window has run out; otherwise hold (``budget.hold_until``) until the
  earliest of those moments. Deadline-free mode (no request in Q_s has a TTFT SLO): dispatch at
  tok(B) >= M_s (token-max), with T_max as the bound.
- after a dispatch of depth d reached in time tau: d >= D -> W = clip(tau, [W_min, W_max]);
  otherwise D = d.

Choices the paper leaves open (ours, named):
- Window arithmetic: W_SLA and W_GR are times from t; the round's window (since the round
  started: the later of the last dispatch and the oldest short arrival) is clipped to
  [W_min, W_state], W_state being Alg. 1's adapted W. So dispatch at
  t_go = clip(t + min(W_SLA, W_GR), [round + W_min, round + W_state]).
- Growth (the paper only ever shrinks): a dispatch that reached D grows D one grid step (up to
  D_max), and a window that expired before reaching D relaxes W_state halfway back to W_max.
  Without these one quiet spell would pin D at 1 and W at its minimum for good.
- A backlog deeper than D is dispatched up to D_max at once: D sets how long to wait, not how
  many may go (waiting requests gain nothing from being split over steps).
- r_s: arrivals over the last ``RATE_WINDOW`` short requests seen (each request is in the queue
  for at least one decision, so none is missed).
Defaults of sigma, delta, eps, T_max, W_min, W_max, M_s: ``PolicyConfig.awd_*`` (the paper gives
none; docs/prefill_scheduling.md says why each default).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Sequence

from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.cost_model import PrefillCostModel
from sglang_pd.scheduling.step import BucketGrid
from sglang_pd.scheduling.types import R

RATE_WINDOW = 32


@dataclass
class AwdDecision:
    batch: list  # the requests to dispatch now (empty: hold or nothing to do)
    hold_until: float | None = None  # when not dispatching: the next moment worth deciding again
    reason: str = ""  # why it dispatched (depth, slack, hol, window, tokens) or held
    round_start: float = 0.0  # when this batching round began (for ``dispatched``)


class AwdBatcher:
    def __init__(self, cfg: PolicyConfig, model: PrefillCostModel) -> None:
        self.cfg = cfg
        self.model = model
        self.grid: BucketGrid = cfg.buckets
        self.w_min = cfg.awd_w_min_ms / 1e3
        self.w_max = cfg.awd_w_max_ms / 1e3
        self.sigma = cfg.awd_sigma_ms / 1e3
        self.delta = cfg.awd_delta_ms / 1e3
        self.t_max = cfg.awd_t_max_ms / 1e3
        self.eps = cfg.awd_rate_floor
        self.min_tokens = cfg.awd_min_batch_tokens
        self.default_slo = cfg.slo_ttft_s  # requests without an SLO and no default: deadline-free
        self.margin = cfg.prefill_deadline_margin_ms / 1e3
        self.window = self.w_max  # W_state
        self.depth = self.grid.max_batch  # D
        self.last_dispatch = float("-inf")
        self._arrivals: deque[float] = deque(maxlen=RATE_WINDOW)
        self._newest_seen = float("-inf")

    # ------------------------------------------------------------------ estimates
    def _note_arrivals(self, short: Sequence[R]) -> None:
        fresh = []
        for r in reversed(short):  # arrival order: new ones are at the end
            if r.arrival <= self._newest_seen:
                break
            fresh.append(r.arrival)
        if fresh:
            self._arrivals.extend(reversed(fresh))
            self._newest_seen = fresh[0]

    @property
    def rate(self) -> float:
        """Short arrivals per second over the recent window (0 until two were seen)."""
        if len(self._arrivals) < 2:
            return 0.0
        span = self._arrivals[-1] - self._arrivals[0]
        return (len(self._arrivals) - 1) / span if span > 0 else float("inf")

    def max_depth(self, tokens_per_req: int, token_budget: int) -> int:
        """D_max: the largest grid batch whose padded shape fits the token budget."""
        fits = [b for b in self.grid.batch if b * tokens_per_req <= token_budget]
        return fits[-1] if fits else 1

    def deadline(self, req: R) -> float | None:
        slo = req.slo_ttft_s or self.default_slo
        return None if slo is None else req.arrival + slo - self.margin

    # ------------------------------------------------------------------ the decision
    def decide(self, short: Sequence[R], now: float, token_budget: int, slots: int) -> AwdDecision:
        """What to do with the short queue now. ``short``: short requests in arrival order."""
        if not short:
            return AwdDecision([])
        self._note_arrivals(short)
        deadlines = [self.deadline(r) for r in short]
        timed = [i for i, d in enumerate(deadlines) if d is not None]
        anchor = min(timed, key=deadlines.__getitem__) if timed else 0
        lengths = [r.prefill_remaining for r in short]
        pad = self.grid.bucket(lengths[anchor], 1)
        pad_len = pad[0] if pad is not None else lengths[anchor]
        d_max = max(1, min(self.max_depth(pad_len, token_budget), slots))
        self.depth = min(self.depth, d_max)
        batch_idx = self._candidate(lengths, anchor, pad_len, d_max)
        batch = [short[i] for i in batch_idx]
        s_hat = self.model.step_s((lengths[i], short[i].prefilled_len) for i in batch_idx)
        round_start = max(self.last_dispatch, short[0].arrival)
        hol_end = short[0].arrival + self.t_max
        if len(batch) >= self.depth:
            return self._dispatch(batch, now, round_start, "depth")
        if now >= hol_end:
            return self._dispatch(batch, now, round_start, "hol")
        if not timed:  # deadline-free: token-max
            if sum(lengths[i] for i in batch_idx) >= self.min_tokens:
                return self._dispatch(batch, now, round_start, "tokens")
            return AwdDecision([], hol_end, "tokens")
        min_slack = min(deadlines[i] - now - s_hat for i in timed)
        if min_slack <= self.sigma:
            return self._dispatch(batch, now, round_start, "slack")
        w_sla = max(0.0, min_slack - self.delta)
        w_gr = max(0, self.depth - len(batch)) / max(self.rate, self.eps)
        t_go = min(max(now + min(w_sla, w_gr), round_start + self.w_min), round_start + self.window)
        if now >= t_go:
            return self._dispatch(batch, now, round_start, "window")
        # the slack rule may fire before t_go: wake when it does
        return AwdDecision([], min(t_go, hol_end, now + min_slack - self.sigma), "window")

    def _candidate(self, lengths: Sequence[int], anchor: int, pad_len: int, d_max: int) -> list[int]:
        """Bucket-first: the anchor, then requests of its padded length bucket, then shorter
        ones (padded up), arrival order inside each; longer ones wait for their own batch."""
        same, shorter = [], []
        lower = max((t for t in self.grid.tokens if t < pad_len), default=0)
        for i, n in enumerate(lengths):
            if i == anchor or n > pad_len:
                continue
            (same if n > lower else shorter).append(i)
        return ([anchor] + same + shorter)[:d_max]

    @staticmethod
    def _dispatch(batch: list, now: float, round_start: float, reason: str) -> AwdDecision:
        return AwdDecision(batch, None, reason, round_start)

    def dispatched(self, depth: int, now: float, round_start: float) -> None:
        """Alg. 1 lines 12-15 (and our growth rules) after a batch of ``depth`` really went."""
        tau = max(0.0, now - round_start)
        if depth >= self.depth:
            self.window = min(max(tau, self.w_min), self.w_max)
            bigger = [b for b in self.grid.batch if b > self.depth]
            self.depth = bigger[0] if bigger else self.depth
        else:
            self.depth = max(1, depth)
            self.window += (self.w_max - self.window) / 2
        self.last_dispatch = now
