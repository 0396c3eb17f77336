"""What the slack-guided decode policies share: each request's TPOT pace and next deadline,
the KV context a decode step reads, and the step-time table (``DecodeCostModel``).

Definitions (docs/decode_scheduling.md):
- t_first_token is ``SchedReq.first_token_time``: the engine-clock time the first token was
  accepted *on this server*. Colocated: sampled after prefill. PD decode server
  (``DecodeSide._start_decoding``, unchanged): when the KV and the prefill-made first token
  arrived and decoding starts. That is when this server streams the first token, so it is
  where the client's TPOT clock starts (bench_serving's TPOT = (E2E - TTFT) / (n - 1)).
- ``n_generated`` counts that first token. We follow Alg. 3 line 5, with its n_gen = tokens
  made by decode steps = ``n_generated - 1``: the next token is due at
      t_first_token + T_slo * (n_gen + 1) = t_first_token + T_slo * n_generated,
  exactly the pace the TPOT metric asks for (token k, k = 1 the first, by t_first + (k-1) T).
  Eq. 2 instead counts from the prefill's finish with N generated tokens; with N counting the
  prefill-made token that is one T_slo looser than the metric, so we do not follow it.
- A request's context is its KV length before the step: ``seq_len - 1`` (the newest token's
  KV is written by the step itself), the figure ``StepProfile.context_tokens`` sums.
- T_slo: the request's TPOT SLO (body, header or server default, resolved at entry). A request
  without one follows the no-SLO rule (``scheduling/slo.py``): paced at
  ``PolicyConfig.decode_no_slo_tpot_ms`` so that skipping it stays bounded; when no running
  request has a TPOT SLO the policies decode every request (continuous batching).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence

from sglang_pd.core.step import StepProfile
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.decode_cost_model import DecodeCostModel
from sglang_pd.scheduling.slo import no_slo_tpot_s
from sglang_pd.scheduling.types import DecodePolicy, R, SchedReq


def decode_context(r: SchedReq) -> int:
    """KV tokens a decode step of ``r`` attends over (before the step writes its own)."""
    return max(r.seq_len - 1, 0)


def next_deadline(r: SchedReq, tpot_s: float, now: float) -> float:
    """When ``r``'s next token is due to stay on its TPOT pace (module docstring)."""
    t0 = r.first_token_time if r.first_token_time is not None else now
    return t0 + tpot_s * max(r.n_generated, 1)


class SlackDecodePolicy(DecodePolicy):
    """Base of ``slack`` and ``slack+``: pace, deadlines and the table that learns in observe."""

    def __init__(self, cfg: PolicyConfig | None = None,
                 model: DecodeCostModel | None = None) -> None:
        super().__init__(cfg)
        self.model = model if model is not None else DecodeCostModel.from_config(self.cfg)
        self.num_partial_steps = 0  # steps that decoded a strict subset of the running requests

    def tpot_s(self, r: SchedReq) -> float:
        if r.slo_tpot_s:
            return r.slo_tpot_s
        return no_slo_tpot_s(self.cfg)  # the no-SLO rule (scheduling/slo.py)

    def pace_view(self, running: Sequence[SchedReq], now: float
                  ) -> tuple[list[int], list[float], list[float]]:
        """Each running request's decode context, time to its next due (negative: late) and
        solo step time (the table's); a request is behind when due before its solo step ends.
        The one reading of the pace, for the policies and the engine's decode log."""
        ctx = [decode_context(r) for r in running]
        due = [next_deadline(r, self.tpot_s(r), now) - now for r in running]
        solo = [self.model.step_s(1, c, c) for c in ctx]
        return ctx, due, solo

    def use_cost_model(self, model: DecodeCostModel) -> None:
        self.model = model

    def any_slo(self, running: Sequence[SchedReq]) -> bool:
        return any(r.slo_tpot_s for r in running)  # none: the SLO-free mode (continuous)

    def observe(self, step: StepProfile, elapsed_s: float, now: float) -> None:
        self.model.observe(step, elapsed_s, now)

    def schedule(self, running: Sequence[R], now: float) -> list[R]:
        if len(running) <= 1 or not self.any_slo(running):
            return list(running)
        chosen = self.choose(running, now)
        if not chosen or len(chosen) == len(running):
            return list(running)
        self.num_partial_steps += 1
        keep = set(map(id, chosen))
        return [r for r in running if id(r) in keep]  # running order: deterministic batches

    @abstractmethod
    def choose(self, running: Sequence[R], now: float) -> list[R]:
        """This step's batch; empty means decode every request."""
