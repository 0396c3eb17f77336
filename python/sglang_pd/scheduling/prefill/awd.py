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
- D_max (free request slots, the token budget) caps a decision's depth, min(D, D_max), but is
  not learnt: a dispatch that the cap (or a KV refusal) cut short adapts neither D nor W.
  Clamping D itself let one decision with a single free slot pin D at 1 for good (each quick
  dispatch then set W to ~0, the next lone request went at once, and D fell back to 1).
- r_s: arrivals over the last ``RATE_WINDOW`` short requests seen (each request is in the queue
  for at least one decision, so none is missed).
Defaults of sigma, delta, eps, T_max, W_min, W_max, M_s: ``PolicyConfig.awd_*`` (the paper gives
none; docs/prefill_scheduling.md says why each default).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any
from collections.abc import Sequence

import numpy as np

from sglang_pd.core.step import BucketGrid
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.cost_model import PrefillCostModel
from sglang_pd.scheduling.prefill.common import Queue
from sglang_pd.scheduling.slo import no_slo_ttft_s
from sglang_pd.scheduling.types import R

RATE_WINDOW = 32


@dataclass
class AwdDecision:
    batch: list[Any]  # the requests to dispatch now (empty: hold or nothing to do)
    hold_until: float | None = None  # when not dispatching: the next moment worth deciding again
    reason: str = ""  # why it dispatched (depth, slack, hol, window, tokens) or held
    round_start: float = 0.0  # when this batching round began (for ``dispatched``)
    # the batch as positions in the short queue's ``Queue`` (its numbers, for the grants)
    queue: Queue[Any] | None = None
    positions: np.ndarray | None = None
    capped: bool = False  # D_max (slots, tokens) was below D: not a signal about the wait


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
        self.no_slo_s = no_slo_ttft_s(cfg)  # the no-SLO rule (scheduling/slo.py)
        self.margin = cfg.prefill_deadline_margin_ms / 1e3
        self.window = self.w_max  # W_state
        self.depth = self.grid.max_batch  # D
        self.last_dispatch = float("-inf")
        self._arrivals: deque[float] = deque(maxlen=RATE_WINDOW)
        self._newest_seen = float("-inf")

    # ------------------------------------------------------------------ estimates
    def _note_arrivals(self, arrivals: np.ndarray) -> None:
        fresh = []
        for k in range(len(arrivals) - 1, -1, -1):  # arrival order: new ones are at the end
            a = float(arrivals[k])
            if a <= self._newest_seen:
                break
            fresh.append(a)
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

    def deadline(self, req: R) -> float:
        return req.arrival + (req.slo_ttft_s or self.no_slo_s) - self.margin

    # ------------------------------------------------------------------ the decision
    def decide(self, short: Sequence[R] | Queue[R], now: float, token_budget: int, slots: int) -> AwdDecision:
        """What to do with the short queue now. ``short``: short requests in arrival order (a
        ``Queue`` of them, or any sequence: read into one here). Computed on the queue's
        columns (issue 20: decision time); the batch is picked by position."""
        q = short if isinstance(short, Queue) else Queue(short)
        n = len(q)
        if not n:
            return AwdDecision([])
        self._note_arrivals(q.arrival)
        arrival, rem = q.arrival, q.rem
        # the no-SLO rule: a request without an SLO has the far deadline; none with one at
        # all is the SLO-free mode (token-max, below)
        deadlines = arrival + q.slos(self.no_slo_s) - self.margin
        anchor = int(np.argmin(deadlines)) if not np.isnan(q.slo).all() else -1  # the first of the earliest
        first = anchor if anchor >= 0 else 0
        rem_anchor = int(rem[first])
        pad = self.grid.bucket(rem_anchor, 1)
        pad_len = pad[0] if pad is not None else rem_anchor
        d_max = max(1, min(self.max_depth(pad_len, token_budget), slots))
        target = min(self.depth, d_max)  # this decision's depth; D itself is not clamped
        batch_idx = self._candidate(rem, first, pad_len, d_max)
        batch = q.pick(batch_idx)
        head_arrival = float(arrival[0])
        round_start = max(self.last_dispatch, head_arrival)
        hol_end = head_arrival + self.t_max
        capped = d_max < self.depth and len(batch) >= d_max  # the cap, not the wait, sized it
        go = AwdDecision(batch, None, "", round_start, q, batch_idx, capped)
        if len(batch) >= target:
            return self._dispatch(go, "depth")
        if now >= hol_end:
            return self._dispatch(go, "hol")
        if anchor < 0:  # deadline-free: token-max
            if int(rem[batch_idx].sum()) >= self.min_tokens:
                return self._dispatch(go, "tokens")
            return AwdDecision([], hol_end, "tokens")
        # min over the requests of (deadline - now - S_hat): the earliest deadline's (the
        # subtraction keeps the order of its operands, so the minimum is the same number)
        # S_hat, the batch's step time: only the rules from here on read it (issue 28:
        # decision time; a batch dispatched above never pays for it)
        s_hat = self.model.step_s(zip(rem[batch_idx].tolist(), q.pre[batch_idx].tolist()))
        min_slack = float(deadlines[anchor]) - now - s_hat
        if min_slack <= self.sigma:
            return self._dispatch(go, "slack")
        w_sla = max(0.0, min_slack - self.delta)
        w_gr = max(0, target - len(batch)) / max(self.rate, self.eps)
        t_go = min(max(now + min(w_sla, w_gr), round_start + self.w_min), round_start + self.window)
        if now >= t_go:
            return self._dispatch(go, "window")
        # the slack rule may fire before t_go: wake when it does
        return AwdDecision([], min(t_go, hol_end, now + min_slack - self.sigma), "window")

    def _candidate(self, lengths: np.ndarray, anchor: int, pad_len: int, d_max: int) -> np.ndarray:
        """Bucket-first: the anchor, then requests of its padded length bucket, then shorter
        ones (padded up), arrival order inside each; longer ones wait for their own batch."""
        lower = max((t for t in self.grid.tokens if t < pad_len), default=0)
        fits = lengths <= pad_len
        fits[anchor] = False
        shorter = lengths <= lower
        same = np.flatnonzero(fits & ~shorter)
        if len(same) + 1 < d_max:
            rest = np.flatnonzero(fits & shorter)[: d_max - 1 - len(same)]
            return np.concatenate(([anchor], same, rest)).astype(np.intp)
        return np.concatenate(([anchor], same[: d_max - 1])).astype(np.intp)

    @staticmethod
    def _dispatch(go: AwdDecision, reason: str) -> AwdDecision:
        go.reason = reason
        return go

    def dispatched(self, depth: int, now: float, round_start: float, capped: bool = False) -> None:
        """Alg. 1 lines 12-15 (and our growth rules) after a batch of ``depth`` really went;
        ``capped``: its size was set by free slots, the token budget or KV, not by waiting."""
        tau = max(0.0, now - round_start)
        if capped:
            pass  # says nothing about how long to wait: D and W stay
        elif depth >= self.depth:
            self.window = min(max(tau, self.w_min), self.w_max)
            bigger = [b for b in self.grid.batch if b > self.depth]
            self.depth = bigger[0] if bigger else self.depth
        else:
            self.depth = max(1, depth)
            self.window += (self.w_max - self.window) / 2
        self.last_dispatch = now
