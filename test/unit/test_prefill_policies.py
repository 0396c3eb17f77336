"""Prefill policies (issue 20): the papers' worked examples on the real Scheduler with a FIXED
cost model (Medha §4.1, Kairos §3.1 Figure 2), and the shared walk rules on a bare budget."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from policy_helpers import CountingKV, FakeReq
from sglang_pd.core.page_allocator import CountingAllocator
from sglang_pd.core.scheduler import Scheduler
from sglang_pd.core.step import ForwardMode, StepProfile, StepShape
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.cost_model import PrefillCoeffs, PrefillCostModel
from sglang_pd.scheduling.decode.continuous import ContinuousDecodePolicy
from sglang_pd.scheduling.prefill.common import DeadlinePolicy, fcfs_finish
from sglang_pd.scheduling.prefill.edf import EdfPrefillPolicy
from sglang_pd.scheduling.prefill.kairos_plus import KairosPlusPrefillPolicy
from sglang_pd.scheduling.prefill.lars import LarsPrefillPolicy
from sglang_pd.scheduling.registry import PREFILL_POLICIES, create_prefill_policy
from sglang_pd.scheduling.types import PrefillBudget
from sglang_pd.sim.request import SimReq

NEW = ("kairos", "kairos+", "lars", "edf", "lrs", "sjf")
LINEAR_1K = PrefillCoeffs(b=1 / 1024)  # 1,024 tokens per second, exact in binary: 0.5 s = 512 tokens
# Kairos §2.2's times: a 128K prompt prefills in 8.8 s, an 8K one in 0.4 s (a·L^2 + k·L through both)
_A = 2.4 / (131072**2 - 16 * 8192**2)
KAIROS_FIG = PrefillCoeffs(a=_A, b=(0.4 - _A * 8192**2) / 8192)
KAIROS_LINEAR = PrefillCoeffs(b=8.8 / 131072)  # same 8.8 s for 128K, linear: throughput exact


@dataclass
class Run:
    first_token: dict[str, float]  # rid -> time of its first token (end of its prefill)
    steps: list[tuple[float, list[str]]]  # (start time, rids in the step)

    def ttft(self, req: SimReq) -> float:
        return self.first_token[req.rid] - req.arrival

    def met(self, req: SimReq) -> bool:
        return self.ttft(req) <= req.slo_ttft_s + 1e-9


def run(policy: str, reqs: list[SimReq], coeffs: PrefillCoeffs, tokens: int,
        chunk: int | None = None) -> Run:
    """A prefill server in discrete time: the real Scheduler with a counting allocator; each step
    lasts what the fixed cost model says; outputs of one token, so a request is done at its
    first token; ``observe`` after every step as the engine does."""
    cfg = PolicyConfig(max_prefill_tokens=tokens, chunked_prefill_size=chunk or tokens,
                       max_running_requests=1024)
    truth = PrefillCostModel.fixed(coeffs)
    cls = PREFILL_POLICIES[policy]
    pol = cls(cfg, PrefillCostModel.fixed(coeffs)) if issubclass(cls, DeadlinePolicy) else cls(cfg)
    sched = Scheduler(CountingAllocator(1 << 22), cfg, pol, ContinuousDecodePolicy(cfg))
    pending = sorted(reqs, key=lambda r: r.arrival)
    now, out = 0.0, Run({}, [])
    while pending or sched.waiting:
        while pending and pending[0].arrival <= now:
            sched.add(pending.pop(0))
        step = sched.schedule(now)
        if step is None:
            assert pending, "a policy scheduled nothing with work queued"
            now = pending[0].arrival
            continue
        assert step.mode is ForwardMode.EXTEND
        dt = truth.step_s([(n, r.kv_len) for r, n in step.prefill_plan])
        profile = step.profile(dt, dt)
        out.steps.append((now, [r.rid for r in step.reqs]))
        done = sched.after_extend(step.prefill_plan)
        now += dt
        for r in done:
            out.first_token[r.rid] = now
            sched.remove(r)
        sched.observe(profile, dt, now)
    sched.check_integrity()
    return out


def test_registry_builds_every_policy_from_a_config() -> None:
    cfg = PolicyConfig(slo_ttft_ms=2000)
    for name in NEW:
        assert name in PREFILL_POLICIES
        pol = create_prefill_policy(name, cfg)
        assert pol.name == name and pol.cfg is cfg


# ---------------------------------------------------------------- Medha §4.1's example
def medha() -> list[SimReq]:
    """r_L: 10 s of work due 16 s after t=0; r_S1, r_S2: 0.5 s each due 1 s after t=5."""
    return [SimReq("L", 0.0, 10240, 1, slo_ttft_s=16.0),
            SimReq("s1", 5.0, 512, 1, slo_ttft_s=1.0), SimReq("s2", 5.0, 512, 1, slo_ttft_s=1.0)]


def test_medha_fcfs_convoy_both_shorts_miss() -> None:
    reqs = medha()
    r = run("fcfs", reqs, LINEAR_1K, tokens=512)
    assert (r.first_token["L"], r.first_token["s1"], r.first_token["s2"]) == (10.0, 10.5, 11.0)
    assert not r.met(reqs[1]) and not r.met(reqs[2])


def test_medha_lars_relative_slack_at_t5_as_the_paper_says() -> None:
    lars = LarsPrefillPolicy(PolicyConfig(chunked_prefill_size=512), PrefillCostModel.fixed(LINEAR_1K))
    long, s1, s2 = medha()
    long.kv_len = 5120  # 5 s of its 10 s done by t=5
    assert lars.rho(long, 5.0) == pytest.approx(0.6)
    assert lars.rho(s1, 5.0) == pytest.approx(1.0) and lars.rho(s2, 5.0) == pytest.approx(1.0)
    # shorts wait while their rho is above the long one's, then preempt it (t=5.5: rho 0 < 0.6)
    r = run("lars", medha(), LINEAR_1K, tokens=512)
    assert [rids for t, rids in r.steps if t == 5.0] == [["L"]]
    assert r.first_token["s1"] == 6.0 and r.first_token["L"] == 11.0


def test_medha_edf_meets_all_three() -> None:
    reqs = medha()
    r = run("edf", reqs, LINEAR_1K, tokens=512)
    assert (r.first_token["s1"], r.first_token["s2"], r.first_token["L"]) == (5.5, 6.0, 11.0)
    assert all(r.met(q) for q in reqs)


def test_edf_convoy_when_shorts_stream_past_the_long_deadline() -> None:
    """Shorts every 0.5 s from t=5 (a full load): EDF starves r_L until its deadline is the
    earliest, then runs it to completion past that deadline while every short behind it misses."""
    reqs = medha()[:1] + [SimReq(f"s{i}", 5.0 + 0.5 * i, 512, 1, slo_ttft_s=1.0) for i in range(41)]
    r = run("edf", reqs, LINEAR_1K, tokens=512)
    long_steps = [t for t, rids in r.steps if rids == ["L"] and t >= 5.0]
    assert long_steps[0] == 15.0 and long_steps == [15.0 + 0.5 * k for k in range(10)]  # uninterrupted
    assert r.first_token["L"] == 20.0 and not r.met(reqs[0])  # late, yet run to completion
    shorts = reqs[1:]
    assert all(r.met(q) for q in shorts if q.arrival < 15.0)
    assert not any(r.met(q) for q in shorts if q.arrival >= 15.0)  # the convoy (and its backlog)
    # kairos+ on the same stream: the long one is rescued and meets its deadline
    r2 = run("kairos+", reqs, LINEAR_1K, tokens=512)
    assert r2.met(reqs[0])


# ---------------------------------------------------------------- Kairos §3.1 Figure 2
def figure2(long_tokens: int, n_short: int = 6) -> list[SimReq]:
    """A long prompt at t=0, then 8K prompts every 0.5 s from t=0.5; TTFT SLO 8 s (Kairos §4.1)."""
    return [SimReq("L", 0.0, long_tokens, 1, slo_ttft_s=8.0)] + [
        SimReq(f"s{i}", 0.5 * i, 8192, 1, slo_ttft_s=8.0) for i in range(1, n_short + 1)]


def test_figure2_model_times() -> None:
    m = PrefillCostModel.fixed(KAIROS_FIG)
    assert m.request_s(131072, 0, 8192) == pytest.approx(8.8)
    assert m.request_s(8192) == pytest.approx(0.4)


def test_figure2_128k_with_exact_throughput() -> None:
    """Linear model, so kairos's mu is exact. 128K needs 8.8 s against 8 s: late under any order.
    kairos: the long one is late under FCFS (u < 0) and the shorts behind it are later per token
    (u further below 0): it runs first and every short misses, as FCFS. kairos+: the long one is
    lost, the shorts salvageable: all six meet; the long one ends when all work is done."""
    reqs = figure2(131072)
    for policy in ("fcfs", "kairos"):
        r = run(policy, reqs, KAIROS_LINEAR, tokens=8192)
        assert r.first_token["L"] == pytest.approx(8.8)
        assert not any(r.met(q) for q in reqs)
    r = run("kairos+", reqs, KAIROS_LINEAR, tokens=8192)
    assert all(r.met(q) for q in reqs[1:])
    assert r.first_token["L"] == pytest.approx(8.8 + 6 * 0.55)  # no idle time


def test_figure2_128k_with_paper_times() -> None:
    """Quadratic model (8.8 s / 0.4 s). kairos+ as above. kairos measures mu on the long one's
    first chunks, where attention is cheap, so it sees the long one as on time and the shorts
    as on time too: it serves the shorts first here, by underestimating the long one."""
    reqs = figure2(131072)
    for policy in ("kairos+", "kairos"):
        r = run(policy, reqs, KAIROS_FIG, tokens=8192)
        assert all(r.met(q) for q in reqs[1:]), policy
        assert not r.met(reqs[0]) and r.first_token["L"] == pytest.approx(8.8 + 6 * 0.4)


def test_figure2_64k_shorts_first_and_the_long_one_meets() -> None:
    reqs = figure2(65536)  # 3.76 s of work: feasible behind all six shorts
    r = run("kairos+", reqs, KAIROS_FIG, tokens=8192)
    assert all(r.met(q) for q in reqs)
    assert all(r.ttft(q) < 1.0 for q in reqs[1:])  # served ahead of the long one
    fcfs = run("fcfs", reqs, KAIROS_FIG, tokens=8192)
    assert all(fcfs.ttft(q) > 3.0 for q in reqs[1:])  # behind the long one


def test_figure2_64k_stream_kairos_plus_rescues_the_long_one_sjf_starves_it() -> None:
    """Shorts every 0.5 s for 10 s (80% of the time): kairos+ serves them first until the long
    one must start, then runs it to meet its SLO; sjf and kairos (on-time shorts always score
    higher per token) pass it with every short until the stream ends."""
    reqs = figure2(65536, n_short=20)
    r = run("kairos+", reqs, KAIROS_FIG, tokens=8192)
    assert all(r.met(q) for q in reqs)
    assert all(r.ttft(q) < 1.0 for q in reqs[1:7])  # the first shorts went ahead
    for policy in ("sjf", "kairos"):
        r = run(policy, reqs, KAIROS_FIG, tokens=8192)
        assert not r.met(reqs[0]) and r.first_token["L"] > 10.0, policy


# ---------------------------------------------------------------- walk rules, bare budget
def _budget(tokens: int = 100, chunk: int = 64, slots: int = 8, kv: int = 10_000) -> PrefillBudget:
    return PrefillBudget(token_budget=tokens, chunk_size=chunk, new_req_slots=slots, kv=CountingKV(kv))


def _edf(**cfg: object) -> EdfPrefillPolicy:
    return EdfPrefillPolicy(PolicyConfig(**cfg), PrefillCostModel.fixed(LINEAR_1K))


def _plan(plan: list) -> list[tuple[str, int]]:
    return [(r.rid, n) for r, n in plan]


def test_walk_goes_on_after_a_chunk_cap_cut_and_stops_at_the_budget_cut() -> None:
    a = FakeReq("a", 0.0, 200, slo_ttft_s=1.0)  # earliest deadline, longer than the chunk cap
    b = FakeReq("b", 0.0, 20, slo_ttft_s=2.0)
    c = FakeReq("c", 0.0, 30, slo_ttft_s=3.0)
    d = FakeReq("d", 0.0, 5, slo_ttft_s=4.0)
    budget = _budget(tokens=100, chunk=64)
    plan = _edf().schedule([a, b, c, d], 0.0, budget)
    assert _plan(plan) == [("a", 64), ("b", 20), ("c", 16)]  # c cut by the budget: d never asked
    assert _plan(budget.granted) == _plan(plan)  # every grant went through the budget


def test_walk_does_not_backfill_past_a_kv_refusal() -> None:
    big = FakeReq("big", 0.0, 50, slo_ttft_s=1.0)
    small = FakeReq("small", 0.0, 5, slo_ttft_s=2.0)
    assert _edf().schedule([big, small], 0.0, _budget(kv=40)) == []


def test_walk_bounds_partly_prefilled_requests() -> None:
    started = FakeReq("p", 0.0, 300, prefilled_len=64, slo_ttft_s=5.0)
    fresh_long = FakeReq("long", 0.0, 300, slo_ttft_s=1.0)
    fresh_short = FakeReq("short", 0.0, 10, slo_ttft_s=2.0)
    policy = _edf(prefill_max_partial=1)
    plan = policy.schedule([started, fresh_long, fresh_short], 0.0, _budget(tokens=200, chunk=64))
    # the long fresh one would be a second partial prefill: skipped; the short one finishes
    assert _plan(plan) == [("short", 10), ("p", 64)]
    plan = _edf(prefill_max_partial=2).schedule([started, fresh_long, fresh_short], 0.0,
                                                _budget(tokens=200, chunk=64))
    assert _plan(plan) == [("long", 64), ("short", 10), ("p", 64)]


def test_walk_skips_fresh_requests_without_slots_but_continues_started_ones() -> None:
    fresh = FakeReq("f", 0.0, 10, slo_ttft_s=1.0)
    started = FakeReq("s", 0.0, 100, prefilled_len=50, slo_ttft_s=9.0)
    assert _plan(_edf().schedule([fresh, started], 0.0, _budget(slots=0))) == [("s", 50)]


def test_no_slo_deadline_and_pd_margin() -> None:
    r = FakeReq("x", 10.0, 5)
    assert _edf().deadline(r) == pytest.approx(40.0)  # 30 s default for no SLO at all
    # the server default is resolved at entry (test_request_slo), never by a policy
    assert _edf(slo_ttft_ms=2000).deadline(r) == pytest.approx(40.0)
    due_in_1s = FakeReq("y", 0.0, 5, slo_ttft_s=1.0)
    assert _edf(prefill_deadline_margin_ms=250).deadline(due_in_1s) == pytest.approx(0.75)


def test_fcfs_finish_counts_equal_arrivals_together() -> None:
    assert fcfs_finish([0.0, 1.0, 1.0, 2.0], [1.0, 2.0, 3.0, 4.0], now=10.0) == [11.0, 16.0, 16.0, 20.0]


def test_kairos_observe_feeds_its_throughput() -> None:
    pol = create_prefill_policy("kairos", PolicyConfig())
    step = StepProfile(ForwardMode.EXTEND, 1, 1000, 0, 0, StepShape(1, 1000), 0.5, 0.5)
    pol.observe(step, 0.5, 1.0)
    assert pol.mu.tps == pytest.approx(2000.0)
    pol.observe(StepProfile(ForwardMode.DECODE, 8, 8, 800, 100, StepShape(8, 8)), 0.01, 1.1)
    assert pol.mu.tps == pytest.approx(2000.0)  # decode steps are not prefill throughput


def _kplus(**cfg: object) -> KairosPlusPrefillPolicy:
    return KairosPlusPrefillPolicy(PolicyConfig(**cfg), PrefillCostModel.fixed(PrefillCoeffs(b=1e-3)))


def test_kairos_plus_serves_a_starving_request_first() -> None:
    lost = FakeReq("lost", 0.0, 1000, slo_ttft_s=1.0)  # 1 s of work, due at 1 s, now 4 s late
    short = FakeReq("short", 3.5, 10, slo_ttft_s=1.0)  # urgent: would otherwise go first
    for now, first in ((3.9, "short"), (4.0, "lost")):  # waited 4 x its SLO: served first
        pol = _kplus(prefill_starve_factor=4.0)
        plan = pol.schedule([lost, short], now, _budget(tokens=2000, chunk=2000))
        assert _plan(plan)[0][0] == first


def test_kairos_plus_starvation_counts_a_prefill_longer_than_its_slo() -> None:
    """A prompt whose prefill alone (3 s) exceeds its SLO (1 s) starves after 4 x 3 s, not
    4 x 1 s: on a colocated server its own chunks, slowed by the decodes between them, no
    longer put it ahead of every short prompt while it is being served (issue 28, wave 3)."""
    for now, first in ((4.0, "short"), (11.9, "short"), (12.0, "lost")):
        lost = FakeReq("lost", 0.0, 3000, slo_ttft_s=1.0)
        short = FakeReq("short", now - 0.5, 10, slo_ttft_s=1.0)
        plan = _kplus(prefill_starve_factor=4.0).schedule([lost, short], now, _budget(tokens=4000, chunk=4000))
        assert _plan(plan)[0][0] == first, now


def test_kairos_plus_rescue_ends_once_the_request_is_lost() -> None:
    """A rescue whose request turned lost (the model learnt it is slower) stops going first:
    the short prompt behind it, which can still meet its SLO, is served before it."""
    pol = _kplus()
    long = FakeReq("L", 0.0, 1000, slo_ttft_s=1.05)  # 1 s of work: urgent at once
    assert _plan(pol.schedule([long], 0.0, _budget(tokens=200, chunk=200))) == [("L", 200)]
    long.prefilled_len = 200
    short = FakeReq("s", 0.3, 50, slo_ttft_s=2.0)
    pol.model = PrefillCostModel.fixed(PrefillCoeffs(b=2e-3))  # learnt: twice as slow
    plan = pol.schedule([long, short], 0.3, _budget(tokens=200, chunk=200))
    assert _plan(plan)[0] == ("s", 50) and long not in pol._urgent


def test_kairos_plus_urgent_request_limits_what_joins_its_step() -> None:
    """1 ms per token; the urgent request takes a 200-token chunk; others join only within its
    laxity beyond the 10% safety margin, and the first that does not fit ends the step."""
    shorts = [FakeReq(f"s{i}", 0.0, 100, slo_ttft_s=30.0) for i in range(1, 6)]
    for laxity, joined in ((0.05, 0), (0.45, 3)):
        long = FakeReq("L", 0.0, 1000, slo_ttft_s=1.0 + laxity)  # 1 s of work
        plan = _kplus().schedule([long] + shorts, 0.0, _budget(tokens=1000, chunk=200))
        # room = laxity - 0.1 s: 0 -> none join; 0.35 s -> three shorts of 0.1 s, not a fourth
        assert _plan(plan) == [("L", 200)] + [(s.rid, 100) for s in shorts[:joined]], laxity


def test_kairos_plus_rescue_is_sticky() -> None:
    pol = _kplus()
    long = FakeReq("L", 0.0, 1000, slo_ttft_s=1.05)
    plan = pol.schedule([long], 0.0, _budget(tokens=200, chunk=200))
    assert _plan(plan) == [("L", 200)] and long in pol._urgent
    long.prefilled_len = 200
    rival = FakeReq("r", 0.2, 100, slo_ttft_s=0.1)  # urgent too, with less laxity
    plan = pol.schedule([long, rival], 0.2, _budget(tokens=200, chunk=200))
    assert _plan(plan)[0] == ("L", 200)  # the rescue in progress goes on


@pytest.mark.parametrize("name", ["kairos", "kairos+", "lars", "edf", "lrs", "sjf"])
def test_prefix_hits_are_context_not_a_started_prefill(name: str) -> None:
    """A request whose only KV is its prefix-cache hit has not started: it needs a new-request
    slot and counts against no partial-prefill bound (else every cache hit looks half done)."""
    policy = create_prefill_policy(name, PolicyConfig(prefill_max_partial=1, chunked_prefill_size=64))
    hit = FakeReq("hit", 0.0, 300, prefilled_len=200, cached_len=200, slo_ttft_s=1.0)
    no_slot = PrefillBudget(4096, 64, 0, CountingKV(10**6))
    assert policy.schedule([hit], 1.0, no_slot) == []
    # two cache hits, both longer than a chunk: only one may start (max_partial = 1)
    other = FakeReq("other", 0.0, 300, prefilled_len=200, cached_len=200, slo_ttft_s=1.0)
    plan = policy.schedule([hit, other], 1.0, PrefillBudget(4096, 64, 8, CountingKV(10**6)))
    assert len(plan) == 1 and plan[0][1] == 64
