"""Kairos urgency-based prefill scheduling, as written (Kairos §3.1, Algorithms 1 and 2).

Alg. 2 (PredictPrefillFinishTime): simulate FCFS in arrival order from now; every request r'
that arrived at or before r (``<=``: requests arriving together count each other) takes
n_r'/mu, n = ``prefill_remaining`` (after prefix hits and done chunks) and mu the running
prefill throughput. All waiting requests have arrived, so the finish times are prefix sums
(``common.fcfs_finish``), O(n) for the whole queue.
Alg. 1: slack = SLO_ttft - (finish - arrival); u = (slack / SLO_ttft) / n; sort by u descending
(stable: ties keep arrival order), O(n log n); add whole requests while the step budget C
(``budget.token_budget``) allows, cut the first that does not fit to what is left of C and
stop (lines 13-18). Every grant goes through ``budget.grant`` (``common.walk``).
mu (line 22, UpdateThroughput): tokens over seconds of the last ``MU_WINDOW`` EXTEND steps
seen by ``observe``, starting from the cost model's prior throughput for one chunk.

Deviations, named:
- u divides by ``prefill_remaining`` where line 8 divides by input_len (issue 20 asks for the
  remaining tokens; equal for a fresh prompt without prefix hits, and in line with Alg. 2,
  which re-estimates with remaining tokens every step).
- Line 22 feeds mu the batch's seq_len; we feed it the tokens the step computed (what the
  time was spent on).
- Chunk cap: ``grant`` also caps one request at ``chunked_prefill_size`` (ours; Kairos has only
  the step's C). A request cut by that cap does not end the walk: C is not spent, the next
  requests in u order may still take the rest. A cut by C ends it, as in Alg. 1.
- A KV refusal ends the walk, no new request starts while ``prefill_max_partial`` are partly
  prefilled, requests without an SLO get the default deadline (``common.py``).

Behaviour to know (kept, since this is the policy as written; ``kairos+`` changes it):
- u grows with slack: a request close to its deadline scores near 0 and goes behind requests
  with more slack per token; a request late under FCFS scores < 0 and goes behind every
  on-time one; among late ones, dividing by length ranks late short requests behind late
  long ones (their u is closer to 0). With a long prompt that cannot meet its SLO at all
  (Kairos Figure 2: 128K at 8.8 s against 8 s) and an exact mu, the shorts arriving behind
  it are late under FCFS too, and wait behind it: all miss, as under FCFS.
- mu is one throughput for all lengths: attention grows with L^2, so mu measured on early
  chunks underestimates the rest of a long prompt. With the paper's times (8.8 s / 0.4 s)
  the 128K prompt then looks on time, and the shorts are served first by that error.
- Waiting is not bounded for late requests: while new arrivals keep positive slack, a request
  whose slack went negative waits behind all of them (§3.1's "without risking starvation"
  holds for requests that still have slack).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from sglang_pd.core.step import ForwardMode, StepProfile
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.cost_model import PrefillCostModel
from sglang_pd.scheduling.prefill.common import DeadlinePolicy, Order, Queue, fcfs_finish_array
from sglang_pd.scheduling.types import PrefillBudget, R

MU_WINDOW = 64  # EXTEND steps in the running throughput


class Throughput:
    """Running prefill throughput (tokens/s): tokens over seconds of the last ``window`` steps."""

    def __init__(self, prior_tps: float, window: int = MU_WINDOW) -> None:
        self.prior_tps = prior_tps
        self._steps: deque[tuple[int, float]] = deque(maxlen=window)
        self._tps = prior_tps

    @property
    def tps(self) -> float:
        return self._tps

    def add(self, tokens: int, seconds: float) -> None:
        if tokens > 0 and seconds > 0:
            self._steps.append((tokens, seconds))
            self._tps = sum(t for t, _ in self._steps) / sum(s for _, s in self._steps)


class KairosPrefillPolicy(DeadlinePolicy):
    name = "kairos"

    def __init__(self, cfg: PolicyConfig | None = None, cost_model: PrefillCostModel | None = None) -> None:
        super().__init__(cfg, cost_model)
        self.mu = Throughput(self.chunk / max(self.model.request_s(self.chunk), 1e-9))

    def observe(self, step: StepProfile, elapsed_s: float, now: float) -> None:
        super().observe(step, elapsed_s, now)
        if step.mode is ForwardMode.EXTEND:
            self.mu.add(step.new_tokens, elapsed_s)

    def urgency(self, q: Queue[R], now: float) -> np.ndarray:
        """u of every request (Alg. 1 lines 4-9), in the queue's (arrival) order."""
        return -self._minus_urgency(q, now)

    def _minus_urgency(self, q: Queue[R], now: float) -> np.ndarray:
        """-u, the key of the order (u descending), without a negation: -(x - y) = y - x and
        -(x / y) = (-x) / y exactly in floating point, so it is the negation of ``urgency``."""
        inv_mu = 1.0 / self.mu.tps
        fin = fcfs_finish_array(q.arrival, q.remf * inv_mu, now, q.distinct, scratch=True)  # (a new array)
        slos = q.slos_read(self.no_slo_s)  # (read only)
        fin -= q.arrival
        fin -= slos - self.margin_s if self.margin_s else slos  # (x - 0.0 == x: no copy)
        fin /= slos
        fin /= q.remf if q.n_empty == 0 else np.maximum(q.remf, 1.0)  # (all >= 1 without empty ones)
        return fin

    def schedule(self, waiting: Sequence[R], now: float, budget: PrefillBudget) -> list[tuple[R, int]]:
        q = Queue(waiting)
        return self.walk(q, Order(self._minus_urgency(q, now)), budget, now=now)
