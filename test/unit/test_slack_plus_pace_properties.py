"""Property test of ``slack+``'s promise (scheduling/decode/slack_plus.py, docs/scheduling.md):
when the pace is feasible (the step with every running request within every running request's
TPOT SLO, the step-time table right), every request's k-th token arrives by
t_first + (k-1) T_slo: the cumulative pace, not only on average.

Random request sets (contexts 1..300K, outputs, TPOT SLOs, arrival times) and random monotone
step-time tables drive the real torch-free ``Scheduler`` of a PD decode server (SimReq +
CountingAllocator, virtual time; requests join with their first token when their KV arrives,
as ``DecodeSide`` starts them) with ``SlackPlusDecodePolicy`` reading the same table that times
the steps. The precondition is checked at every decision (an example that breaks it is
discarded, not passed). Profiles as test_progress_properties.py: ``ci`` (derandomized, quick),
``long`` (SGLANG_PD_PROPERTY_LONG=1, SGLANG_PD_PROPERTY_EXAMPLES).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from property_profile import property_profile
from sglang_pd.core.page_allocator import CountingAllocator
from sglang_pd.core.progress import pages_for
from sglang_pd.core.scheduler import Scheduler
from sglang_pd.core.step import ForwardMode
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.decode.pacing import decode_context
from sglang_pd.scheduling.decode.slack_plus import SlackPlusDecodePolicy
from sglang_pd.scheduling.decode_cost_model import DecodeCostModel
from sglang_pd.scheduling.profile import DecodeGrid
from sglang_pd.scheduling.registry import create_prefill_policy
from sglang_pd.sim.request import SimReq

PROFILE = property_profile(ci_examples=40, long_examples=2000)

BATCHES = [1, 2, 4, 8, 16, 32, 64]
CONTEXTS = [0, 8192, 131072, 262144, 1048576]
PAGE = 16
EPS = 1e-9  # float noise of summed step times

# (table: launch s, per-request s, per-1K-context-token s, extra cell s per (batch, ctx) step),
# requests: (arrival ms, context tokens, output tokens, T_slo as a multiple of the precondition's
# bound: the all-request step at everyone's final context)
Table = tuple[float, float, float, tuple[float, ...]]
Spec = tuple[int, int, int, float]


def grid(table: Table) -> DecodeGrid:
    """A table monotone in batch and context (a larger step is never faster): a linear part
    plus non-negative increments accumulated along both axes."""
    launch, per_req, per_k, bumps = table
    seconds: list[list[float | None]] = []
    for i, b in enumerate(BATCHES):
        row: list[float | None] = []
        for j, c in enumerate(CONTEXTS):
            extra = sum(bumps[(ii * len(CONTEXTS) + jj) % len(bumps)]
                        for ii in range(i + 1) for jj in range(j + 1))
            row.append(launch + per_req * b + per_k * c / 1000 + extra)
        seconds.append(row)
    return DecodeGrid(batch_sizes=BATCHES, context_tokens=CONTEXTS, seconds=seconds)


@dataclass
class Run:
    tokens: dict[str, list[float]] = field(default_factory=dict)  # rid -> token times (1st: t_first)
    broke_precondition: bool = False
    joins: list[float] = field(default_factory=list)  # how much each join lengthened the all-step


def drive(model: DecodeCostModel, specs: list[Spec]) -> tuple[Run, dict[str, float]]:
    """Decode ``specs`` to the end on a PD decode Scheduler; return token times and each
    request's T_slo."""
    t_bound = model.batch_s([c + o for _, c, o, _ in specs])  # every request, final contexts
    cfg = PolicyConfig(role="decode", page_size=PAGE, max_running_requests=64)
    pool = sum(pages_for(c + o, PAGE) for _, c, o, _ in specs) + 1
    sched = Scheduler(CountingAllocator(pool + 1), cfg, create_prefill_policy("fcfs", cfg),
                      SlackPlusDecodePolicy(cfg, model), whole_prompt_pages=False)
    reqs = [SimReq(f"r{i}", a / 1e3, c, o, slo_tpot_s=m * t_bound) for i, (a, c, o, m) in enumerate(specs)]
    tpot = {r.rid: r.slo_tpot_s or 0.0 for r in reqs}
    pending = sorted(reqs, key=lambda r: r.arrival)
    run, now = Run(), 0.0
    for _ in range(100_000):
        before = model.batch_s([decode_context(r) for r in sched.running])
        joined = False
        while pending and pending[0].arrival <= now:  # KV arrived: decoding starts now
            joined = True
            r = pending.pop(0)
            sched.park(r, num_pages=pages_for(r.prompt_len, PAGE))
            sched.start_running(r, r.prompt_len)
            r.n_generated, r.first_token_time = 1, now
            run.tokens[r.rid] = [now]
        if not sched.running:
            if not pending:
                return run, tpot
            now = pending[0].arrival
            continue
        t_all = model.batch_s([decode_context(r) for r in sched.running])
        if joined and before > 0:  # requests already running may have reserved ``before``
            run.joins.append(t_all - before)
        if t_all > min(tpot[r.rid] for r in sched.running) + EPS:
            run.broke_precondition = True
        step = sched.schedule(now)
        assert step is not None and step.mode is ForwardMode.DECODE, step
        now += model.batch_s([decode_context(r) for r in step.reqs])  # the table is right
        sched.after_decode(step.reqs)
        for q in step.reqs:
            assert isinstance(q, SimReq)
            q.n_generated += 1
            run.tokens[q.rid].append(now)
            if q.n_generated >= q.output_len:
                sched.remove(q)
        sched.check_integrity()
    raise AssertionError("not finished after 100000 steps")


def lateness(run: Run, tpot: dict[str, float]) -> dict[str, float]:
    """Per request, the most any token came after its pace deadline t_first + (k-1) T_slo."""
    return {rid: max(t - (ts[0] + k * tpot[rid]) for k, t in enumerate(ts)) for rid, ts in run.tokens.items()}


# Found by this test: r3 (164K) joins at 117 ms and lengthens the decode-all step from 59.4 to
# 78.7 ms; r2 had been skipped with 76.1 ms to its deadline (enough for the 59.4 ms step it
# reserved) and gets its token 10.3 ms late. The promise holds for the requests present; a
# join is bounded by how much it lengthens the all-request step (docs/decode_scheduling.md).
JOIN_TABLE: Table = (0.005580029542343801, 0.0007563723404117758, 9.778522089612818e-05,
                     (0.001344974387783177, 0.0025384033484387174, 0.0006361093826605524))
JOIN_REQS: list[Spec] = [(56, 28047, 2, 3.5392658550858425), (0, 1, 28, 2.934927868854502),
                         (0, 68019, 37, 1.177977215866913), (113, 163652, 20, 1.2779458371924777),
                         (0, 234239, 17, 2.649575125589901)]
JOIN_TABLE_2: Table = (0.00857001761143121, 0.0001474229742408062, 0.0004734562508233626, (0.002108104319668986,))
JOIN_REQS_2: list[Spec] = [(0, 1, 8, 0.731293922277527), (0, 1, 4, 3.1186548057523447),
                           (0, 1, 16, 2.627448140739884), (0, 1, 19, 3.969169152539797),
                           (173, 193864, 2, 1.5322394349224422), (0, 269428, 40, 1.629509239402861)]

tables = st.tuples(st.floats(0.001, 0.02), st.floats(0.0, 0.002), st.floats(0.0, 0.0005),
                   st.lists(st.floats(0.0, 0.003), min_size=1, max_size=6).map(tuple))
specs = st.lists(st.tuples(st.one_of(st.just(0), st.integers(0, 400)), st.integers(1, 300_000),
                           st.integers(2, 40), st.floats(0.5, 4.0)), min_size=2, max_size=10)


@settings(PROFILE)
@given(tables, specs)
@example(JOIN_TABLE, JOIN_REQS)
@example(JOIN_TABLE_2, JOIN_REQS_2)
@example(JOIN_TABLE, [(0, c, o, m) for _, c, o, m in JOIN_REQS])  # the same requests, all at once
def test_slack_plus_every_token_on_pace_when_feasible(table: Table, reqs: list[Spec]) -> None:
    """Precondition held at every decision: with no join lengthening the all-request step, no
    token is late at all; a join that lengthens it by D leaves no token more than D late."""
    model = DecodeCostModel.fixed(grid(table))
    run, tpot = drive(model, reqs)
    assume(not run.broke_precondition)
    late = lateness(run, tpot)
    bound = max([0.0, *run.joins])
    assert max(late.values()) <= bound + EPS, ({rid: x for rid, x in late.items() if x > EPS}, run.joins)


def test_a_join_can_make_a_skipped_request_late_within_its_bound() -> None:
    """Why the promise is stated for the requests present: JOIN_REQS's r2 is 10.3 ms late,
    under the 19.4 ms the join added to the all-request step; started together, none is."""
    run, tpot = drive(DecodeCostModel.fixed(grid(JOIN_TABLE)), JOIN_REQS)
    assert not run.broke_precondition
    late = lateness(run, tpot)
    assert 0.010 < late["r2"] <= max(run.joins) and max(run.joins) > 0.019, (late, run.joins)
    run, tpot = drive(DecodeCostModel.fixed(grid(JOIN_TABLE)), [(0, c, o, m) for _, c, o, m in JOIN_REQS])
    assert not run.broke_precondition and run.joins == []
    assert max(lateness(run, tpot).values()) <= EPS
