"""kairos+ (ours): Kairos §3.1's urgency order, with fitted finish times and rescue rules.

Built on ``kairos`` (Kairos §3.1, Alg. 1-2; see kairos.py for the rule as written). Changes, each
for a way the rule as written loses requests:
1. Work and finish times from the fitted ``PrefillCostModel`` (PLA-Serve §2.1): seconds for the
   remaining tokens over the context already in the pool, chunk by chunk, so the quadratic
   attention of long prompts and the context of re-prefills count (one throughput mu cannot).
   Alg. 2's FCFS simulation runs on these works (prefix sums, ``<=`` ties).
2. u = (slack / SLO) / work seconds (not tokens), for requests on time under FCFS.
3. Requests late under FCFS are not simply sorted last by u. With laxity
   = deadline - now - work (how long a request may still wait if served alone from then on):
   those with laxity >= 0 can still meet their SLO if served first (salvageable), the others
   cannot (lost).
The order, by group, then within it:
  0 rescuing: urgent requests (group 2) already served as urgent in an earlier step, least
    laxity first: once rescue starts it runs to the end (no flapping when the model or the
    queue shifts). At most ``prefill_max_partial`` of them are partly prefilled at a time, so
    they delay group 1 by a bounded amount of work.
  1 starving: waited >= ``prefill_starve_factor`` x its TTFT SLO: oldest first. With group 0
    bounded this bounds every wait: kairos+ never starves a request (a lost long prompt
    included). Under sustained overload this trades a new rescue for a bounded wait.
  2 urgent: salvageable with laxity <= one step (a full budget's time) + ``SAFETY`` x its work:
    it must run now to meet its SLO. Least laxity first. While it is in the step, other
    requests join only as long as their time fits in its laxity beyond the safety margin
    (they delay it); the first that does not fit ends the step.
  3 on time under FCFS: u descending, as Kairos.
  4 salvageable but late under FCFS, not yet urgent: least remaining work first (they become
    urgent in time, group 2, if still unserved).
  5 lost: least remaining work first (shortest remaining processing: the fewest further
    misses and the least total lateness among requests that miss anyway).
So short prompts pass a long one while it can still make its deadline (groups 3-4 by u and
work), the long one is run just in time when it has to (groups 2 then 0), and a long one that
cannot make it no longer blocks short ones that can (group 5 after 2-4).

Speed (issue 20): the rule "others join only as long as their time fits in the urgent one's
laxity" is applied to the walk's whole plan at once (``cut`` in ``schedule``: the running
subtraction as ``np.subtract.accumulate``, exact); with a step-time budget, whose chunker sizes
chunks request by request, it is asked per request (``fits``), as first written.

Parameters: ``SAFETY`` (0.1, ours: margin against cost-model error, in the request's own work),
``prefill_starve_factor`` (PolicyConfig, 4), and the shared ones in ``common.py``. Every grant
goes through ``budget.grant`` (``common.walk``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.cost_model import PrefillCostModel
from sglang_pd.scheduling.prefill.chunking import time_budget_s
from sglang_pd.scheduling.prefill.common import DeadlinePolicy, Order, Queue, fcfs_finish_array
from sglang_pd.scheduling.waiting import WaitingQueue
from sglang_pd.scheduling.types import PrefillBudget, R

RESCUING, STARVING, URGENT, ON_TIME, SALVAGEABLE, LOST = range(6)
GROUPS = ("rescuing", "starving", "urgent", "on_time", "salvageable", "lost")


class KairosPlusPrefillPolicy(DeadlinePolicy):
    name = "kairos+"
    SAFETY = 0.1  # of a request's own work, kept as margin against model error

    def __init__(self, cfg: PolicyConfig | None = None, cost_model: PrefillCostModel | None = None) -> None:
        super().__init__(cfg, cost_model)
        self.starve_factor = self.cfg.prefill_starve_factor
        self._urgent: set = set()  # requests served as urgent: stay so until their prefill ends

    def _served_urgent(self, q: Queue) -> np.ndarray:
        """Which requests of the queue are in ``self._urgent`` (a few: found by position)."""
        mask = np.zeros(len(q), dtype=bool)
        urgent = self._urgent
        if not urgent:
            return mask
        if isinstance(q.reqs, WaitingQueue):
            for r in urgent:
                try:
                    mask[q.reqs.position(r)] = True
                except ValueError:
                    pass  # no longer waiting
        else:
            mask[:] = [r in urgent for r in q.reqs]
        return mask

    def classify(self, q: Queue, now: float,
                 step_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Every request's group, its key in the group (the order: by group, then key, ties in
        arrival order), laxity and work."""
        work = self.works(q)
        a = q.arrival
        fin = fcfs_finish_array(a, work, now)
        slos = q.slos(self.default_slo_s)
        d = a + slos
        d -= self.margin_s
        lax = d - now
        lax -= work
        tight = lax <= step_s + self.SAFETY * work
        # the groups by precedence, lowest written last (as np.select's first true condition)
        on_time = fin <= d
        group = SALVAGEABLE - on_time  # ON_TIME = SALVAGEABLE - 1
        group[tight] = URGENT  # tight ones with laxity >= 0; the lost ones (all tight) next
        group[lax < 0] = LOST
        if len(a) and now - a.min() >= self.starve_factor * slos.min():  # else none waited so long
            group[now - a >= self.starve_factor * slos] = STARVING
        if self._urgent:
            group[tight & self._served_urgent(q)] = RESCUING
        # ON_TIME: u descending (-(d - fin) = fin - d exactly); RESCUING, URGENT: laxity;
        # STARVING: arrival; others: work
        fin -= d
        fin /= slos
        fin /= np.maximum(work, 1e-12)
        key = np.where(group == ON_TIME, fin, work)
        rush = group <= URGENT
        if rush.any():
            key[rush] = lax[rush]
            starving = group == STARVING
            key[starving] = a[starving]
        return group, key, lax, work

    def schedule(self, waiting: Sequence[R], now: float, budget: PrefillBudget) -> list[tuple[R, int]]:
        q = Queue(waiting)
        model = self.model
        step_s = model.request_s(budget.token_budget)  # the next decision comes after one step
        group, key, laxity, work = self.classify(q, now, step_s)
        safety = self.SAFETY

        def room_at(pos: np.ndarray) -> np.ndarray:
            """Seconds the urgent requests at ``pos`` can give away: laxity beyond the margin."""
            return np.maximum(laxity[pos] - safety * work[pos], 0.0)

        seen: list[np.ndarray] = []  # the plan's positions, as ``cut`` last saw them

        def cut(pos: np.ndarray, ns: np.ndarray) -> int:
            """How many of the plan to keep: the first whose time does not fit in the laxity
            left of an urgent request before it ends the step (``fits``, on the whole plan)."""
            seen.append(pos)
            g = group[pos]
            urgent = ((g == RESCUING) | (g == URGENT)).nonzero()[0]
            if not len(urgent):
                return len(pos)
            rooms = room_at(pos[urgent]).tolist()
            first = int(urgent[0])
            delta = model.marginal_s_array(ns[first + 1:], q.pre[pos[first + 1:]])
            # the spare seconds after each request: one subtraction after another, in plan
            # order, as the loop (subtract.accumulate), min'd with each urgent one's room
            spare, start = rooms[0], first + 1
            for k, end in enumerate([*urgent[1:].tolist(), len(pos) - 1]):
                d = delta[start - first - 1: end - first]  # requests start..end
                chain = np.subtract.accumulate(np.concatenate(((spare,), d)))
                over = (d > chain[:-1]).nonzero()[0]
                if len(over):
                    return start + int(over[0])
                if k + 1 == len(rooms):
                    break
                spare, room = float(chain[-1]), rooms[k + 1]
                spare = room if room < spare else spare  # min(spare, room), as the loop
                start = end + 1
            return len(pos)

        room: dict | None = None  # urgent request -> its room, for ``fits``
        spare: list[float] = []

        def fits(req: R, n: int) -> bool | None:
            """``cut`` request by request (with a step-time budget chunks are sized so)."""
            if spare:
                delta = model.marginal_s(n, req.prefilled_len)
                if delta > spare[0]:
                    return None  # as Kairos's walk: the first that does not fit ends the step
                spare[0] -= delta
            if req in room:
                spare[:] = [min(spare[0], room[req])] if spare else [room[req]]
            return True

        if time_budget_s(self.cfg) is not None:
            rush = ((group == RESCUING) | (group == URGENT)).nonzero()[0]
            room = dict(zip(q.pick(rush), room_at(rush).tolist()))
        plan = self.walk(q, Order(key, group), budget, fits if room else None, now=now, cut=cut)
        # rescuing from now on: urgent ones served before (group RESCUING: all of them) and
        # the urgent ones served now
        urgent = set(q.pick((group == RESCUING).nonzero()[0])) if self._urgent else set()
        if room is not None:
            urgent.update(r for r, _ in plan if r in room)
        elif plan:
            g = group[seen[-1][: len(plan)]]
            urgent.update(r for (r, _), u in zip(plan, ((g == RESCUING) | (g == URGENT)).tolist()) if u)
        self._urgent = urgent
        return plan
