"""Kairos slack-guided adaptive decode batching, as written (Kairos §3.2, Algorithm 3).

Per step, for every running request r (pace and deadlines: ``pacing.py``):
    s_r = T_slo * (n_gen + 1) - (now - t_first_token) - LUT[1, ctx_r]        (line 5)
with n_gen + 1 = ``n_generated`` (the prefill-made first token is not a decode token);
s_min = min_r s_r (line 7). Walk the requests by ascending seq_len (stable); add r when
    LUT[B + r] <= s_min  and  (B empty or (|B| + 1) / LUT[B + r] > |B| / LUT[B])   (line 13)
and otherwise delay r and go on with the next one (lines 15-16: a failure does not end the
walk). If nothing was added, decode every request (lines 19-21). The table learns from every
decode step in ``observe`` (lines 23-24; ``DecodeCostModel``).

Deviations, named:
- LUT[B + r] is read at the candidate batch's *total* context (``DecodeCostModel``: decode
  attention cost follows the sum of contexts), where line 12 reads it at r's seq_len (the
  batch's longest, since the walk ascends) and line 24 updates it at the max seq_len.
- T_slo is per request (its own TPOT SLO), not one server-wide value; requests without one are
  paced at ``decode_no_slo_tpot_ms``, and with no TPOT SLO anywhere every request decodes.
- The step time used and learned is ``StepProfile.total_s`` (what requests experience: batch
  building, forward, sampling), not the forward alone.

Behaviour to know (kept, since this is the policy as written; ``slack+`` changes it): s_min
reserves only the tightest request's *solo* step, but when it is finally decoded it runs in the
decode-all fallback, which takes longer; and a short-only step may run while the long request
has just enough slack for its solo step. A long request can so fall behind its pace by up to
(decode-all step - its solo step) per token, which test_decode_policies shows on the paper's
128K + three 8K case. No starvation: a skipped request's slack falls by every step's time
until s_min is below every candidate step, and then every request is decoded.
"""

from __future__ import annotations

from collections.abc import Sequence

from sglang_pd.scheduling.decode.pacing import SlackDecodePolicy, decode_context, next_deadline
from sglang_pd.scheduling.types import R


class KairosSlackDecodePolicy(SlackDecodePolicy):
    name = "slack"

    def choose(self, running: Sequence[R], now: float) -> list[R]:
        model = self.model
        ctx = [decode_context(r) for r in running]
        s_min = min(next_deadline(r, self.tpot_s(r), now) - now - model.step_s(1, c, c)
                    for r, c in zip(running, ctx))
        batch: list[R] = []
        total = longest = 0
        t_cur = 0.0
        for i in sorted(range(len(running)), key=lambda i: running[i].seq_len):
            c = ctx[i]
            t = model.step_s(len(batch) + 1, total + c, max(longest, c))
            if t <= s_min and (not batch or (len(batch) + 1) / t > len(batch) / t_cur):
                batch.append(running[i])
                total, longest, t_cur = total + c, max(longest, c), t
        return batch
