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
    queue shifts), or until it has failed: a request lost (laxity < 0) leaves the rescue for
    good and is ranked as lost (group 5). Wave 3: on the CPU engine the model, learning from
    short prompts, took a 3K-token prompt for salvageable; the rescue then ran its whole
    15 s prefill ahead of every short prompt after it learnt better. At most ``prefill_max_partial`` of them are partly prefilled at a time, so
    they delay group 1 by a bounded amount of work.
  1 starving: waited >= ``prefill_starve_factor`` x max(its TTFT SLO, its whole prefill alone):
    oldest first. With group 0 bounded this bounds every wait: kairos+ never starves a request
    (a lost long prompt included). Under sustained overload this trades a new rescue for a
    bounded wait. The prefill term (issue 28, wave 3): a prompt whose prefill alone outlasts
    its SLO is lost from the start; on a colocated server, where decodes slow its chunks, it
    crossed 4 SLOs while being served and then went ahead of every short prompt (simulated,
    scripts/sim_colocated_knee.py: kairos+ short p90 TTFT 0.9-2.2x fcfs's, now 1.6-3.1x).
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
laxity" is applied to the walk's plan as a whole (``RoomCut``: a short loop, then the running
subtraction as ``np.subtract.accumulate``, exact); with a step-time budget, whose chunker sizes
chunks request by request, it is asked per request (``fits``), as first written. On-time vs late
(groups 3 and 4) is worked out only when the walk reads past groups 0-2 (``_classify``).

Parameters: ``SAFETY`` (0.1, ours: margin against cost-model error, in the request's own work),
``prefill_starve_factor`` (PolicyConfig, 4), and the shared ones in ``common.py``. Every grant
goes through ``budget.grant`` (``common.walk``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.cost_model import PrefillCostModel
from sglang_pd.scheduling.prefill.chunking import time_budget_s
from sglang_pd.scheduling.prefill.common import DeadlinePolicy, Order, Queue, fcfs_finish_array
from sglang_pd.scheduling.types import PrefillBudget, R

RESCUING, STARVING, URGENT, ON_TIME, SALVAGEABLE, LOST = range(6)  # groups (uint8 array)
_NO_POS = np.empty(0, dtype=np.intp)
SHORT_PLAN = 8  # ``cut`` loops over plans this short, and uses array operations on longer ones
GROUPS = ("rescuing", "starving", "urgent", "on_time", "salvageable", "lost")


class KairosPlusPrefillPolicy(DeadlinePolicy):
    name = "kairos+"
    SAFETY = 0.1  # of a request's own work, kept as margin against model error

    def __init__(self, cfg: PolicyConfig | None = None, cost_model: PrefillCostModel | None = None) -> None:
        super().__init__(cfg, cost_model)
        self.starve_factor = self.cfg.prefill_starve_factor
        self._urgent: set[Any] = set()  # requests served as urgent: stay so until their prefill ends
        self._rescuing = _NO_POS  # positions of those still urgent in the last ``classify``

    def classify(self, q: Queue[R], now: float,
                 step_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Every request's group, its key in the group (the order: by group, then key, ties in
        arrival order), laxity and work."""
        group, key, lax, work, refine = self._classify(q, now, step_s)
        refine()
        return group, key, lax, work

    def _classify(self, q: Queue[R], now: float, step_s: float
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, Callable[[], None]]:
        """``classify`` with ON_TIME and SALVAGEABLE not yet told apart (both ON_TIME, keyed by
        work) until ``refine()`` is called, which rewrites them in place.

        Speed (issue 20: each numpy call costs about a microsecond at 1,000 waiting, a masked
        assignment three): groups and keys come from ``putmask`` over masks, the rare groups
        (starving, rescuing) by assignment only when some request may be in them; telling
        on-time from late needs the FCFS simulation (a prefix sum) and u, which the walk needs
        only when it reads past the urgent requests (``Order``'s ``refine``): under overload,
        when decisions matter most, it often does not. ``test_kairos_plus_classify_per_request``
        checks both against the rules applied request by request."""
        work = self.works(q)
        a = q.arrival
        slos = q.slos_read(self.no_slo_s)  # read only (the queue's own column when it keeps one)
        # deadlines: read only too (below and in ``refine``); without a margin the queue's own
        # ``due`` column (arrival + SLO, the same sum), so no array is built for them
        d = q.due if not self.margin_s and q.due is not None and q.due_default == self.no_slo_s \
            else self.deadlines(q)
        lax = d - now
        lax -= work
        limit = work * self.SAFETY
        limit += step_s
        tight = lax <= limit
        lost = lax < 0  # all tight (the limit is >= 0)
        # ON_TIME, URGENT where tight, LOST where lost (lost ones are tight): as arithmetic,
        # ON_TIME + (LOST - URGENT) * lost - tight, which costs less than two masked assignments
        group = lost.astype(np.uint8)
        group *= LOST - URGENT
        group += ON_TIME
        group -= tight
        key = np.where(tight > lost, lax, work)  # URGENT: laxity; others: work (ON_TIME's: below)
        if len(a) and now - q.earliest_arrival() >= self.starve_factor * slos.min():  # else none waited so long
            pos = (now - a >= self.starve_factor * slos).nonzero()[0]
            if len(pos):  # a prefill longer than its SLO: the factor times that prefill instead
                whole = self.model.request_times_array(q.pre[pos] + q.rem[pos] - q.cached[pos], q.cached[pos],
                                                       self.chunk, empty_is_zero=True)
                pos = pos[now - a[pos] >= self.starve_factor * np.maximum(slos[pos], whole)]
                group[pos] = STARVING
                key[pos] = a[pos]  # oldest first
        self._rescuing = _NO_POS
        if self._urgent:  # RESCUING (over STARVING): laxity; a rescue ends once lost
            pos = q.positions(self._urgent)
            if len(pos) <= SHORT_PLAN:  # (a few, as they mostly are: element by element costs
                # less than the four array calls)
                keep = [p for p in pos.tolist() if tight[p] and not lost[p]]
                for p in keep:
                    group[p] = RESCUING
                    key[p] = lax[p]
                self._rescuing = np.array(keep, dtype=np.intp)
            else:
                self._rescuing = pos = pos[tight[pos] > lost[pos]]
                group[pos] = RESCUING
                key[pos] = lax[pos]

        def refine() -> None:
            """ON_TIME (finishing by the deadline under FCFS) keyed by u descending
            (-(d - fin) = fin - d exactly), the others SALVAGEABLE (keyed by work)."""
            fin = fcfs_finish_array(a, work, now, q.distinct)
            pending = group == ON_TIME
            on_time = fin <= d  # none lost (fin >= now + work)
            np.putmask(group, pending > on_time, SALVAGEABLE)
            fin -= d
            fin /= slos
            fin /= np.maximum(work, 1e-12)
            np.putmask(key, pending & on_time, fin)

        return group, key, lax, work, refine

    def schedule(self, waiting: Sequence[R], now: float, budget: PrefillBudget) -> list[tuple[R, int]]:
        q = Queue(waiting)
        model = self.model
        step_s = model.request_s(budget.token_budget)  # the next decision comes after one step
        group, key, laxity, work, refine = self._classify(q, now, step_s)
        safety = self.SAFETY

        cut = RoomCut(model, q.pre, group, laxity, work, safety)
        room_at = cut.rooms

        room: dict[object, float] | None = None  # urgent request -> its room, for ``fits``
        spare: list[float] = []

        def fits(req: R, n: int) -> bool | None:
            """``cut`` request by request (with a step-time budget chunks are sized so)."""
            if spare:
                delta = model.marginal_s(n, req.prefilled_len)
                if delta > spare[0]:
                    return None  # as Kairos's walk: the first that does not fit ends the step
                spare[0] -= delta
            if room is not None and req in room:  # (``fits`` is used only with rooms)
                spare[:] = [min(spare[0], room[req])] if spare else [room[req]]
            return True

        if time_budget_s(self.cfg) is not None:
            rush = ((group == RESCUING) | (group == URGENT)).nonzero()[0]
            room = dict(zip(q.pick(rush), room_at(rush).tolist()))
        plan = self.walk(q, Order(key, group, refine, ON_TIME), budget, fits if room else None, now=now, cut=cut)
        # rescuing from now on: urgent ones served before (group RESCUING: all of them) and
        # the urgent ones served now
        urgent = set(q.pick(self._rescuing)) if len(self._rescuing) else set()
        if room is not None:
            urgent.update(r for r, _ in plan if r in room)
        elif plan:  # (the groups as a list: two array calls, not five, for a plan of a few)
            g = group[cut.last[: len(plan)]].tolist()
            urgent.update(r for (r, _), gj in zip(plan, g) if gj in (RESCUING, URGENT))
        self._urgent = urgent
        return plan


class RoomCut:
    """kairos+'s limit on a plan (``walk.Cut``): once an urgent request is in the step, a later
    request joins only while its time fits in the room left (what every urgent one so far can
    give away: laxity beyond its margin, less the time of those after it); the first that does
    not fit ends the step. ``fits`` in ``schedule`` asks the same rule request by request.

    Speed (issue 20): the plan's first ``SHORT_PLAN`` requests are tried in a loop (the rule
    often ends the step within a few, and a loop over a few costs less than array calls); a
    plan that runs past them goes on with array operations: the spare seconds after each
    request as one subtraction after another (``np.subtract.accumulate``), exactly the loop's
    numbers. A plan that extends the last one seen uncut (the walk asks before and after its
    tail) resumes where that one ended."""

    def __init__(self, model: PrefillCostModel, pre: np.ndarray, group: np.ndarray, laxity: np.ndarray,
                 work: np.ndarray, safety: float) -> None:
        self.model, self.pre, self.group = model, pre, group
        self.laxity, self.work, self.safety = laxity, work, safety
        self.last = _NO_POS  # the plan's positions, as last seen
        self._uncut: tuple[np.ndarray, float | None] | None = None  # the last plan if kept whole,
        # and the room left after it (None: no urgent one in it)

    def rooms(self, pos: np.ndarray) -> np.ndarray:
        """Seconds the urgent requests at ``pos`` can give away: laxity beyond the margin."""
        rooms: np.ndarray = np.maximum(self.laxity[pos] - self.safety * self.work[pos], 0.0)
        return rooms

    def __call__(self, pos: np.ndarray, ns: np.ndarray) -> int:
        """How many of the plan (queue positions, tokens) to keep."""
        start, spare = 0, None
        if self._uncut is not None:
            last = self._uncut[0]
            if len(last) <= len(pos) and np.array_equal(pos[: len(last)], last):
                start, spare = len(last), self._uncut[1]  # its first part passed before
        self.last, self._uncut = pos, None
        g = self.group[pos[start:]]
        m = min(len(pos) - start, SHORT_PLAN)
        lax, work, safety, marginal = self.laxity, self.work, self.safety, self.model.marginal_s
        pre = self.pre[pos[start: start + m]].tolist()
        for j, (p, n, h, gj) in enumerate(zip(pos[start: start + m].tolist(), ns[start: start + m].tolist(),
                                              pre, g[:m].tolist())):
            if spare is not None:
                delta = marginal(n, h)
                if delta > spare:
                    return start + j
                spare -= delta
            if gj in (URGENT, RESCUING):
                room = max(float(lax[p]) - safety * float(work[p]), 0.0)
                spare = room if spare is None or room < spare else spare
        if start + m < len(pos):
            k, spare = self._on_arrays(pos, ns, g[m:], start + m, spare)
            if k < len(pos):
                return k
        self._uncut = (pos, spare)
        return len(pos)

    def _on_arrays(self, pos: np.ndarray, ns: np.ndarray, g: np.ndarray, start: int,
                   spare: float | None) -> tuple[int, float | None]:
        """The loop of ``__call__`` from ``start`` on (``g``: the groups from there), with
        ``spare`` as it left it: how many to keep, and the spare after the last if all."""
        urgent = ((g == RESCUING) | (g == URGENT)).nonzero()[0] + start
        if spare is None:
            if not len(urgent):
                return len(pos), None
            spare = float(self.rooms(pos[urgent[:1]])[0])
            start, urgent = int(urgent[0]) + 1, urgent[1:]
        base = start
        delta = self.model.marginal_s_array(ns[base:], self.pre[pos[base:]])
        rooms = self.rooms(pos[urgent]).tolist()
        for k, end in enumerate([*urgent.tolist(), len(pos) - 1]):
            d = delta[start - base: end - base + 1]  # requests start..end
            chain = np.subtract.accumulate(np.concatenate(((spare,), d)))
            over = (d > chain[:-1]).nonzero()[0]
            if len(over):
                return start + int(over[0]), None
            spare = float(chain[-1])
            if k == len(rooms):
                break
            room = rooms[k]
            spare = room if room < spare else spare  # min(spare, room), as the loop
            start = end + 1
        return len(pos), spare
