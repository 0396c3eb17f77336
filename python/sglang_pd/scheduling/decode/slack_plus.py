"""``slack+`` (ours): slack-guided decode batching that keeps every request on its TPOT pace.

Built on Kairos §3.2 / Alg. 3 (``slack.py``), with the reservation changed. Kairos keeps, for
the tightest request, only its *solo* step time after the short-only step; but a request that is
skipped is next decoded in whatever step comes later, in the worst case the decode-all fallback,
which takes longer. So a long request can fall behind its pace (a 128K request 7.5 ms behind
in a model of the paper's own step times; 6.2 ms in test_decode_policies' table). ``slack+`` reserves that later step instead:

    d_r   = t_first_token + T_slo * n_generated      (r's next token is due; pacing.py)
    s_r   = d_r - now - t_all                        (t_all: this step with every request)

Skipping r in a step of length t keeps it on pace even if its next step is the decode-all one
iff t <= s_r. Hence, per step:
1. mandatory set M (run the min-slack set first): every r with s_r < 0 (it cannot wait for a
   decode-all step after any other step), then, to a fixed point, every r with s_r < LUT[M]
   (the step M forms would make it late);
2. packing, Kairos's walk: the others by ascending seq_len; add r when LUT[M + B + r] <= the
   smallest s of the requests still skipped and the batch's tokens/s rises (Alg. 3 line 13);
3. a partial step runs only if its tokens/s are at least the decode-all step's (Alg. 3's gain
   test compares only within B: without this, a long request alone, ahead of pace, would spend
   every short request's lead at 1 token per long step), or if it *rescues* a token: some chosen
   request r, not behind, is due between the two steps (t_B <= d_r - now < t_all) and its pace
   is one decode-all steps can hold (t_all <= r's T_slo), and the step skips no request that
   is already behind (its next token is late anyway; the skip makes it a whole step later, for
   a rescue of a fraction of a step: seen on the engine, issue 34); otherwise decode all.
A partial step pays (the rule of 3): a skipped request loses a whole step, and what the chosen
ones gain is t_all - t_B. Where step time barely depends on the batch (a CPU with short
contexts, a GPU at small batch) that gain is nothing, so a throughput-losing subset step is
taken only to keep a token on pace that decode-all would make late, for a request that can
stay on pace afterwards. When the SLO is infeasible for everyone (t_all > every T_slo) or no
subset saves a deadline, slack+ decodes all, as continuous batching does: skipping cannot
shorten anyone's TPOT there, only lengthen the skipped ones'. Before this rule, mandatory
steps (new requests due under t_all, recovering ones) skipped the best-effort requests for
nothing: on a flat table under overload TPOT p50 up to 1.16x continuous's
(test_slack_plus_flat_table_properties.py); on an exactly flat table slack+ is now continuous.
So no step has fewer tokens/s than continuous batching's unless it rescues a token.
Invariant: every skipped request q has s_q >= this step's time, so after this step a
decode-all step still delivers its token by d_q: whenever the SLO is feasible at all (t_all
<= every T_slo, the table right), every request's k-th token arrives by t_first + (k-1) T_slo,
the cumulative pace, not only on average. That holds for the requests present: a request that
joins (its KV arrived) lengthens the decode-all step a skipped one reserved, by D say, and can
leave it up to D late (test_slack_plus_pace_properties.py: a 164K join, D = 19.4 ms, one token
10.3 ms late; no token more than the largest D in its random runs, none late without a join).

A step slower than the table (a hiccup of e seconds) can leave requests late. A late
request is *behind*: it misses its next deadline even decoded alone now. When its pace is
feasible (t_all <= its T_slo) and its next token, decoded alone now, would be at most T_slo / 2
late (a hiccup's lateness), a behind request *recovers*: it is mandatory, decoding in every step
until it is back on pace, and since each of those steps takes at most t_all <= T_slo, its
lateness never grows and shrinks by T_slo - step per token. Bound (exact table apart from the
hiccups): after an overrun e with e + solo step <= 1.5 T_slo (the paper case's 128K request:
e up to 34 ms), a token is at most e late and the request is back on pace within
ceil(e / (T_slo - t_all)) steps (any step when t_all < T_slo). A request later than that
fell behind with load the table did not plan for, often with many others (the Kairos scenario,
1P+1D, QPS 2: up to 15 at once); making all of those mandatory fixes each step's membership,
so slack+ cannot pace the rest and more fall behind (E2E attainment 67.4 -> 60.5% in window 3).
They are best effort like an infeasible one (next paragraph); 0.5 measured: docs/scheduling.md.

When the pace is not feasible (t_all > T_slo: a long request among many short ones), pace
cannot be held for everyone, and keeping the requests that are already behind in every step
would drag everyone behind (Alg. 3 does that: a negative s_min means decode all, every step).
Such a behind request does not constrain the step (its slack counts as infinite), and instead
none of them waits two steps in a row: after a step that left one out, the next step decodes
every request. So the others keep (or regain) their pace with steps of their own, and a
behind request still gets at least every other step.

Packing never delays a request already in the batch past its next deadline: a candidate is
added only if the step stays within every chosen request's deadline that the step without it
meets (a mandatory request close to its deadline is not made late by an optional one).

Reserve (issue 34; off by default): the rules above let a request wait until its slack is
spent, so its tokens land on its pace deadlines exactly, and a step slower than the table (a
neighbour on a shared core) carries them past. With ``decode_reserve_quantile`` Q > 0 a request
counts as skippable only while s_r >= t + reserve, the reserve being the Q-quantile of the
table's recent overruns (``DecodeCostModel.overrun_s``: measured step minus the table's
prediction): a later step slower than the table by as much still meets the pace. Where the
table is exact the reserve is 0 and the rule is the one above; where steps jitter slack+ skips
less, towards continuous batching. Feasibility (t_all <= T_slo), rescue and recovery still read
the table alone. Off by default: on the simulator's Kairos scenario it cost 2.5 points of E2E
attainment (docs/decode_scheduling.md "The reserve").

No starvation: a skipped request's s falls by each step's time, so within a bounded number of
steps it is negative and mandatory, or it is behind and waits at most one step. The table,
pace and deviations are Kairos's as in ``slack.py`` (total-context key, per-request T_slo,
``StepProfile.total_s``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from sglang_pd.scheduling.decode.pacing import SlackDecodePolicy
from sglang_pd.scheduling.types import R

# a behind request recovers only while its lateness is under this share of its T_slo (docstring)
RECOVER_LATENESS = 0.5


class SlackPlusDecodePolicy(SlackDecodePolicy):
    name = "slack+"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._behind_skipped: set[str] = set()  # behind-pace requests left out of the last step

    def choose(self, running: Sequence[R], now: float) -> list[R]:
        model = self.model
        n = len(running)
        ctx, due, solo = self.pace_view(running, now)
        t_all = model.batch_s(ctx)
        # behind its pace: misses its next deadline even decoded alone now; best effort
        behind = [d < s for d, s in zip(due, solo)]
        # a behind request whose pace is feasible and that is under half a token period late
        # (what a hiccup leaves) catches up by decoding every step; any other is best effort
        recover = [b and t_all <= self.tpot_s(r) and c - d <= RECOVER_LATENESS * self.tpot_s(r)
                   for b, r, c, d in zip(behind, running, solo, due)]
        best_effort = [b and not rc for b, rc in zip(behind, recover)]
        if any(b and r.rid in self._behind_skipped for b, r in zip(best_effort, running)):
            self._behind_skipped.clear()  # a best-effort request never waits two steps in a row
            return []
        # a request on pace may be skipped only while its slack beyond the decode-all step keeps
        # the table's recent overrun in reserve: a later step that much slower than the table
        # still delivers its token on pace (docstring, "Reserve")
        q = self.cfg.decode_reserve_quantile
        reserve = model.overrun_s(q) if q > 0 else 0.0
        slack = [-math.inf if rc else math.inf if b else d - t_all - reserve
                 for b, rc, d in zip(best_effort, recover, due)]
        chosen = [False] * n
        total = longest = count = 0

        def add(i: int) -> None:
            nonlocal total, longest, count
            chosen[i] = True
            total, longest, count = total + ctx[i], max(longest, ctx[i]), count + 1

        # 1. the mandatory set, to a fixed point (each pass only grows it)
        t_cur = 0.0
        while True:
            late = [i for i in range(n) if not chosen[i] and slack[i] < t_cur]
            if not late:
                break
            for i in late:
                add(i)
            t_cur = model.step_s(count, total, longest)
        if count == n:
            self._behind_skipped.clear()
            return list(running)
        kept = min((due[i] for i in range(n) if chosen[i] and due[i] >= t_cur), default=math.inf)
        # 2. packing by ascending seq_len within the slack of the requests still skipped
        free = [i for i in range(n) if not chosen[i]]
        by_slack = sorted(free, key=lambda i: slack[i])
        head = 0  # by_slack[:head] are all chosen (chosen only grows)

        def rest_min(exclude: int) -> float:
            """Smallest slack of the skipped requests other than ``exclude``."""
            nonlocal head
            while head < len(by_slack) and chosen[by_slack[head]]:
                head += 1
            k = head
            while k < len(by_slack) and (chosen[by_slack[k]] or by_slack[k] == exclude):
                k += 1
            return slack[by_slack[k]] if k < len(by_slack) else math.inf

        for i in sorted(free, key=lambda i: running[i].seq_len):
            rest = rest_min(i)
            t = model.step_s(count + 1, total + ctx[i], max(longest, ctx[i]))
            if t <= min(rest, kept) and (count == 0 or (count + 1) / t > count / t_cur):
                add(i)
                t_cur = t
                if due[i] >= t and not best_effort[i]:
                    kept = min(kept, due[i])
        # 3. a partial step that costs throughput (tokens/s under the decode-all step's) must
        # keep on pace a token the decode-all step would make late, of a request whose pace
        # decode-all steps can hold, without skipping a request already behind (that one's next
        # token is late anyway and the skip makes it a whole step later: docstring, "rescue");
        # else it only spends the skipped requests' steps (on a flat table each skip costs a
        # whole step and saves none: docstring, "A partial step pays")
        if not count or (count / t_cur < n / t_all
                         and (any(behind[i] and not chosen[i] for i in range(n))
                              or not any(chosen[i] and not behind[i] and t_cur <= due[i] < t_all
                                         and t_all <= self.tpot_s(running[i]) for i in range(n)))):
            self._behind_skipped.clear()
            return []
        self._behind_skipped = {r.rid for r, c, b in zip(running, chosen, best_effort) if b and not c}
        return [r for r, c in zip(running, chosen) if c]
