"""Dual short/long prefill queues and AWD batching (PLA-Serve Alg. 1), on a fixed cost model."""

from __future__ import annotations

import numpy as np
import pytest

from policy_helpers import CountingKV, FakeReq
from sglang_pd.core.page_allocator import CountingAllocator
from sglang_pd.core.scheduler import Scheduler
from sglang_pd.core.step import ForwardMode
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.cost_model import PrefillCoeffs, PrefillCostModel
from sglang_pd.scheduling.prefill.awd import AwdBatcher
from sglang_pd.scheduling.prefill.chunking import largest_chunk
from sglang_pd.scheduling.prefill.common import Queue
from sglang_pd.scheduling.prefill.dual import DualQueuePrefillPolicy
from sglang_pd.scheduling.registry import create_decode_policy, create_prefill_policy
from sglang_pd.scheduling.types import PrefillBudget
from sglang_pd.sim.request import SimReq

# 10 ms per step + 20 us per new token: a 16-token short costs ~10.3 ms alone, a 4K chunk ~92 ms
COEFFS = PrefillCoeffs(launch_s=0.010, per_req_s=0.0, a=0.0, b=2e-5, g_w=0.0, g_r=0.0)


def _cfg(**kw) -> PolicyConfig:
    base = dict(prefill_queues="dual", slo_ttft_ms=1000.0, awd_w_max_ms=50.0, awd_w_min_ms=0.0,
                awd_sigma_ms=5.0, awd_delta_ms=2.0, awd_t_max_ms=200.0, chunked_prefill_size=4096)
    base.update(kw)
    return PolicyConfig(**base)


def _awd(**kw) -> AwdBatcher:
    return AwdBatcher(_cfg(**kw), PrefillCostModel.fixed(COEFFS))


def _short(rid: str, arrival: float, n: int = 16, slo: float | None = 1.0) -> FakeReq:
    """A short request; its SLO as the entry resolved it (default: _cfg's --slo-ttft-ms 1000)."""
    return FakeReq(rid, arrival, n, slo_ttft_s=slo)


def test_window_shrinks_near_a_deadline() -> None:
    loose = _awd().decide([_short("a", 0.0, slo=1.0)], 0.001, 16384, 64)
    tight = _awd().decide([_short("a", 0.0, slo=0.040)], 0.001, 16384, 64)
    assert not loose.batch and not tight.batch
    assert loose.hold_until == pytest.approx(0.050)  # the whole window (W_max)
    # S_hat ~ 10.3 ms: the SLA window ends at 40 - 10.3 - delta(2) = ~27.7 ms, and the slack
    # rule (slack <= sigma = 5 ms) fires earlier, at ~24.7 ms: the hold ends at the earlier
    assert tight.hold_until == pytest.approx(0.040 - 0.0103 - 0.005, abs=1e-4)
    assert tight.hold_until < loose.hold_until


def test_dispatch_at_depth_and_adaptation_of_w_and_d() -> None:
    awd = _awd()
    awd.depth = 4
    reqs = [_short(f"r{i}", 0.001 * i) for i in range(4)]
    d = awd.decide(reqs, 0.004, 16384, 64)
    assert d.reason == "depth" and len(d.batch) == 4
    awd.dispatched(4, 0.004, d.round_start)
    assert awd.window == pytest.approx(0.004)  # W <- time taken to reach the depth
    assert awd.depth == 8  # ours: a reached depth grows D one grid step
    # a window that expires before the depth: D <- the depth reached, W relaxes back up
    few = [_short("x", 0.010), _short("y", 0.011)]
    d2 = awd.decide(few, 0.030, 16384, 64)
    assert d2.reason == "window" and len(d2.batch) == 2
    awd.dispatched(2, 0.030, d2.round_start)
    assert awd.depth == 2 and awd.window == pytest.approx(0.004 + (0.050 - 0.004) / 2)
    # D grows back when dispatches reach it again
    d3 = awd.decide([_short("p", 0.031), _short("q", 0.031)], 0.032, 16384, 64)
    assert d3.reason == "depth"
    awd.dispatched(2, 0.032, d3.round_start)
    assert awd.depth == 4


def test_tight_deadline_request_is_in_the_batch_it_triggers() -> None:
    awd = _awd()
    # many 16-token requests with loose deadlines, one 200-token request about to miss
    reqs = [_short(f"s{i}", 0.0, 16, slo=5.0) for i in range(6)]
    urgent = _short("urgent", 0.0, 200, slo=0.020)
    d = awd.decide(reqs + [urgent], 0.001, 16384, 64)
    assert d.reason == "slack" and urgent in d.batch
    assert d.batch[0] is urgent  # the batch is built around it (its 256 bucket, shorter ones padded)


def test_depth_is_capped_by_the_token_budget() -> None:
    awd = _awd()
    reqs = [_short(f"r{i}", 0.0, 200) for i in range(40)]
    d = awd.decide(reqs, 0.3, 1024, 64)  # 256-token padded shape: 4 fit in 1024 tokens
    assert len(d.batch) == 4


def test_deadline_free_mode_dispatches_at_min_tokens() -> None:
    awd = _awd(slo_ttft_ms=None, awd_min_batch_tokens=64)
    three = [_short(f"r{i}", 0.0, 16, slo=None) for i in range(3)]
    held = awd.decide(three, 0.001, 16384, 64)
    assert not held.batch and held.hold_until == pytest.approx(0.200)  # T_max bound
    d = awd.decide(three + [_short("r3", 0.0, 16, slo=None)], 0.001, 16384, 64)
    assert d.reason == "tokens" and len(d.batch) == 4


def test_no_slo_rule_mixed_queue_ages_like_the_deadline_policies() -> None:
    """One rule for every policy (scheduling/slo.py): a request without an SLO, next to ones
    with an SLO, has the far deadline (prefill_no_slo_ttft_ms) and not none: once it has waited
    that long it is the anchor, so AWD dispatches for it at once (slack), as EDF would."""
    awd = _awd(slo_ttft_ms=None, prefill_no_slo_ttft_ms=100.0)
    old = _short("old", 0.0, 16, slo=None)  # due at 0.1 s under the rule (none: never due)
    d = awd.decide([old, _short("new", 0.094, 16, slo=5.0)], 0.095, 16384, 64)
    assert d.reason == "slack" and d.batch[0] is old


def test_largest_chunk_fits_the_time() -> None:
    model = PrefillCostModel.fixed(COEFFS)
    n = largest_chunk(model, 0.030, 0, 8192)  # what it adds to a step: 20 us per token here
    assert model.marginal_s(n, 0) <= 0.030 < model.marginal_s(n + 1, 0) and 1490 < n <= 1500
    assert largest_chunk(model, 1e-6, 0, 8192) == 0


# ---------------------------------------------------------------------------- dual + scheduler
def _run(cfg: PolicyConfig, arrivals: list[SimReq], until: float, long_policy: str = "fcfs"):
    """Drive the real Scheduler on a virtual clock with the fixed model's step times; returns
    (steps as (time, mode, [(rid, n)]), finished prefill times by rid)."""
    model = PrefillCostModel.fixed(COEFFS)
    inner = create_prefill_policy(long_policy, PolicyConfig(**{**cfg.__dict__, "prefill_queues": "single",
                                                              "prefill_role": "both"}))
    policy = DualQueuePrefillPolicy(cfg, inner, model)
    sched = Scheduler(CountingAllocator(100_000), cfg, policy, create_decode_policy("continuous", cfg))
    pending = sorted(arrivals, key=lambda r: r.arrival)
    now, steps, done = 0.0, [], {}
    while now < until and (pending or sched.waiting):
        while pending and pending[0].arrival <= now:
            sched.add(pending.pop(0))
        step = sched.schedule(now)
        if step is None or step.mode is ForwardMode.DECODE:
            assert sched.unblock(now) == []  # a hold aborts nothing
            nxt = [sched.hold_deadline] if sched.hold_deadline else []
            nxt += [pending[0].arrival] if pending else []
            now = max(now + 1e-4, min(nxt)) if nxt else now + 1e-3
            for r in list(sched.running):  # prefill-only view: finished prefills leave
                sched.remove(r)
            continue
        steps.append((now, [(r.rid, n) for r, n in step.plan]))
        dt = model.step_s((n, r.kv_len) for r, n in step.plan)
        profile = step.profile(dt, dt)
        now += dt
        sched.observe(profile, dt, now)
        for r in sched.after_extend(step.plan):
            done[r.rid] = now
        for r in list(sched.running):
            sched.remove(r)
    return steps, done, policy


def _sim(rid: str, arrival: float, n: int, slo: float | None = None) -> SimReq:
    return SimReq(rid, arrival, n, 4, slo_ttft_s=slo)


def test_no_mixed_batches_and_shorts_do_not_wait_behind_a_long_prompt() -> None:
    cfg = _cfg(chunked_prefill_size=1024)
    reqs = [_sim("long", 0.0, 8000)] + [_sim(f"s{i}", 0.005 + 0.01 * i, 32, slo=0.3) for i in range(20)]
    steps, done, _ = _run(cfg, reqs, 10.0)
    for _, plan in steps:
        classes = {rid == "long" for rid, _ in plan}
        assert len(classes) == 1, plan  # all-short or all-long
    assert set(done) == {r.rid for r in reqs}
    short_ttft = [done[f"s{i}"] - (0.005 + 0.01 * i) for i in range(20)]
    assert max(short_ttft) < 0.3  # every short one meets its SLO despite the 8K prompt
    # and they are batched: fewer short steps than short requests
    assert sum(1 for _, plan in steps if plan[0][0] != "long") < 20


def test_long_queue_wait_is_bounded_under_a_stream_of_shorts() -> None:
    cfg = _cfg(prefill_long_max_wait_ms=300.0, chunked_prefill_size=512, prefill_role="short")
    shorts = [_sim(f"s{i}", 0.002 * i, 32, slo=0.5) for i in range(1500)]  # 3 s of back-to-back shorts
    steps, done, _ = _run(cfg, [_sim("long", 0.0, 2048)] + shorts, 20.0)
    long_steps = [t for t, plan in steps if plan[0][0] == "long"]
    assert len(long_steps) == 4  # 2048 tokens in 512-token chunks
    gaps = [b - a for a, b in zip([0.0] + long_steps, long_steps)]
    assert max(gaps) < 0.300 + 0.2  # the bound plus at most one short step in between
    assert "long" in done and set(done) == {r.rid for r in shorts} | {"long"}


def test_an_urgent_long_prompt_runs_just_in_time_under_a_stream_of_shorts() -> None:
    """A long prompt with a TTFT SLO behind back-to-back shorts (a short-role instance: no filler
    steps while AWD holds, as on a CPU where every short batch is due at once) and a wait bound
    longer than its SLO: the bound alone (each chunk restarting it) let it miss; urgency runs it
    once its slack is down to a short batch, and only then (issue 34, session 13)."""
    cfg = _cfg(prefill_long_max_wait_ms=2000.0, chunked_prefill_size=512, prefill_role="short")
    shorts = [_sim(f"s{i}", 0.002 * i, 32, slo=0.5) for i in range(1500)]  # 3 s of back-to-back shorts
    # 2048 tokens: 4 chunks of ~20 ms; due at 0.5 s
    steps, done, _ = _run(cfg, [_sim("long", 0.0, 2048, slo=0.5)] + shorts, 20.0)
    long_steps = [t for t, plan in steps if plan[0][0] == "long"]
    assert len(long_steps) == 4 and done["long"] <= 0.5  # in time
    assert long_steps[0] > 0.3  # not first: the shorts had its slack
    assert max(b - a for a, b in zip(long_steps, long_steps[1:])) < 0.03  # back to back once urgent
    assert max(done[r.rid] - r.arrival for r in shorts) < 0.5  # and every short still meets its SLO
    # without an SLO (--prefill-no-slo-ttft-ms, 30 s) it is never urgent here: the bound moves it
    steps, done, _ = _run(cfg, [_sim("long", 0.0, 2048)] + shorts, 20.0)
    assert min(t for t, plan in steps if plan[0][0] == "long") > 1.9 and done["long"] > 3.0


def test_urgency_passes_shorts_only_for_a_prompt_it_saves() -> None:
    cfg = _cfg(chunked_prefill_size=512)
    policy = DualQueuePrefillPolicy(cfg, create_prefill_policy("fcfs", _cfg(prefill_queues="single")),
                                    PrefillCostModel.fixed(COEFFS))
    # 2048 tokens left: 4 chunks of 20.24 ms = ~81 ms of work; a short step of 10 ms next
    longs = [FakeReq("tight", 0.0, 2048, slo_ttft_s=0.1),  # slack 19 ms: saved only by going now
             FakeReq("loose", 0.0, 2048, slo_ttft_s=1.0),  # slack 0.9 s: the shorts go first
             FakeReq("late", 0.0, 2048, slo_ttft_s=0.05),  # past saving, not started: the bound moves it
             # started too: a late partial that went first would hold the shorts behind it for
             # all it has left (issue 28's Medha scenario, test_colocated_interleave.py)
             FakeReq("late_started", 0.0, 2560, prefilled_len=512, slo_ttft_s=0.05)]
    urgent = policy.long_urgent(Queue(longs), np.arange(len(longs)), 0.010, 0.0, 512)
    assert [r.rid for r, u in zip(longs, urgent) if u] == ["tight"]


def test_role_long_serves_shorts_only_when_no_long_waits_and_never_strands_them() -> None:
    cfg = _cfg(prefill_role="long", chunked_prefill_size=1024, prefill_long_max_wait_ms=1000.0)
    reqs = [_sim("L1", 0.0, 3000), _sim("s1", 0.001, 16, slo=5.0), _sim("L2", 0.002, 3000)]
    steps, done, _ = _run(cfg, reqs, 10.0)
    order = [plan[0][0] for _, plan in steps]
    assert order.index("s1") > max(i for i, rid in enumerate(order) if rid in ("L1", "L2"))
    assert set(done) == {"L1", "L2", "s1"}


def test_role_switch_at_runtime_and_bad_role() -> None:
    """The role is scheduler state (set from the config), handed to the policy in each budget."""
    policy = create_prefill_policy("fcfs", _cfg())
    sched = Scheduler(CountingAllocator(1000), _cfg(), policy, create_decode_policy("continuous", _cfg()))
    assert isinstance(policy, DualQueuePrefillPolicy) and policy.serves_roles and sched.prefill_role == "both"
    sched.set_prefill_role("long")
    assert sched.prefill_role == "long"
    with pytest.raises(ValueError, match="prefill role"):
        sched.set_prefill_role("medium")
    single = _cfg(prefill_queues="single")
    plain = Scheduler(CountingAllocator(1000), single, create_prefill_policy("fcfs", single),
                      create_decode_policy("continuous", single))
    with pytest.raises(ValueError, match="--prefill-queues dual"):  # a single queue has no roles
        plain.set_prefill_role("short")
    assert plain.prefill_role == "both"


def test_classification_key_is_stable_and_auto_threshold_is_pla_boundary() -> None:
    fixed = DualQueuePrefillPolicy(_cfg(short_prefill_threshold=100), create_prefill_policy("fcfs"))
    r = FakeReq("r", 0.0, 150, cached_len=60)  # 90 new tokens: short
    assert fixed.is_short(r)
    r.prefilled_len = 120  # chunks done do not change its class
    assert fixed.is_short(r)
    # auto: L_m = (g_w - b) / a for prefills (PLA-Serve §2.1)
    coeffs = PrefillCoeffs(launch_s=0.001, a=1e-8, b=1e-6, g_w=4e-6, g_r=1e-7)
    auto = DualQueuePrefillPolicy(_cfg(short_prefill_threshold=None), create_prefill_policy("fcfs"),
                                  PrefillCostModel.fixed(coeffs))
    auto.refresh_threshold(0.0)
    assert auto.threshold() == 300
    assert auto.is_short(FakeReq("a", 0.0, 300)) and not auto.is_short(FakeReq("b", 0.0, 301))
    # a re-prefill over a long history: max(L_m, L_m(H)). L_m(H) alone saturates at g_r / 2a
    # (5 tokens here): every re-prefill was long, the opposite of PLA-Serve's short regime
    h = 10_000
    lm = PrefillCostModel.fixed(coeffs).boundary_tokens(h)
    assert int(lm) < 10 and auto.threshold(h) == 300
    assert auto.is_short(FakeReq("re", 0.0, h + 200, cached_len=h))
    big = PrefillCoeffs(launch_s=0.001, a=1e-9, b=1e-6, g_w=1.1e-6, g_r=1e-5)  # L_m(H) > L_m
    auto2 = DualQueuePrefillPolicy(_cfg(short_prefill_threshold=None), create_prefill_policy("fcfs"),
                                   PrefillCostModel.fixed(big))
    auto2.refresh_threshold(0.0)
    lm2 = PrefillCostModel.fixed(big).boundary_tokens(h)
    assert lm2 > auto2.threshold() and auto2.threshold(h) == int(lm2)


def test_chunker_long_is_the_one_threshold_under_auto() -> None:
    """Medha's chunker calls a prompt long by the same boundary the dual queues use: under
    ``auto`` the fitted L_m (300 here), not the fixed default 256; one object for both."""
    from sglang_pd.scheduling.prefill.chunking import TimeBudgetChunker
    coeffs = PrefillCoeffs(launch_s=0.001, a=1e-8, b=1e-6, g_w=4e-6, g_r=1e-7)
    cfg = _cfg(short_prefill_threshold=None, prefill_time_budget_ms=50.0)
    inner = create_prefill_policy("lars", PolicyConfig(**{**cfg.__dict__, "prefill_queues": "single"}))
    inner.model = PrefillCostModel.fixed(coeffs)
    inner.short_threshold.model = inner.model
    dual = DualQueuePrefillPolicy(cfg, inner)
    dual.refresh_threshold(0.0)
    assert dual.threshold() == 300 and dual.short_threshold is inner.short_threshold
    chunker = TimeBudgetChunker.for_config(cfg, inner.model, lambda r: 0.0, (), inner.short_threshold)
    assert not chunker.is_long(FakeReq("a", 0.0, 280)) and chunker.is_long(FakeReq("b", 0.0, 301))


def test_hold_sets_budget_and_plans_nothing() -> None:
    policy = DualQueuePrefillPolicy(_cfg(), create_prefill_policy("fcfs"), PrefillCostModel.fixed(COEFFS))
    budget = PrefillBudget(16384, 4096, 64, CountingKV(10**6))
    assert policy.schedule([_short("a", 0.0, 16, slo=1.0)], 0.001, budget) == []
    assert budget.hold_deadline == pytest.approx(0.050)


def test_shorts_run_between_long_steps_longer_than_the_wait_bound() -> None:
    """A long chunk (~92 ms) longer than the long queue's wait bound (50 ms): the bound counts
    from the END of the last long step, so short batches still run between long chunks (when it
    counted from the step's start the long queue was overdue again at once and every short
    waited for the whole long prefill: found on the real CPU engine)."""
    cfg = _cfg(prefill_long_max_wait_ms=50.0, chunked_prefill_size=4096)
    shorts = [_sim(f"s{i}", 0.001 + 0.02 * i, 32, slo=0.3) for i in range(20)]
    steps, done, _ = _run(cfg, [_sim("long", 0.0, 16000)] + shorts, 10.0)
    kinds = ["long" if plan[0][0] == "long" else "short" for _, plan in steps]
    first, last = kinds.index("long"), len(kinds) - 1 - kinds[::-1].index("long")
    between = kinds[first:last + 1]
    assert "short" in between  # the long prefill did not run its 4 chunks back to back
    assert max(done[f"s{i}"] - (0.001 + 0.02 * i) for i in range(20)) < 0.3


def test_one_decision_with_a_single_free_slot_does_not_pin_depth() -> None:
    """D is learnt from waits, not from free slots: a decision with one free slot dispatches
    one request but leaves D and W as they were, and a steady stream then fills batches of D
    again. (Clamping D to the slots pinned it at 1: quick dispatches set W to ~0, the next
    lone request went at once, D fell back to 1, and so on for good.)"""
    awd = _awd()
    awd.depth, awd.window = 8, 0.010
    d = awd.decide([_short(f"r{i}", 0.0) for i in range(5)], 0.001, 16384, 1)
    assert d.reason == "depth" and len(d.batch) == 1
    _dispatched(awd, d, 1, 0.001)
    assert awd.depth == 8 and awd.window == pytest.approx(0.010)
    # a stream of one short every 0.5 ms with slots to spare: batches of D form again
    sizes, now, queue, k = [], 0.002, [], 0
    while now < 0.2:
        queue.append(_short(f"s{k}", now))
        k += 1
        d = awd.decide(queue, now, 16384, 64)
        if d.batch:
            _dispatched(awd, d, len(d.batch), now)
            sizes.append(len(d.batch))
            queue = [r for r in queue if r not in d.batch]
        now += 0.0005
    assert max(sizes[-5:]) >= 8 and awd.depth >= 8


def _dispatched(awd: AwdBatcher, d, depth: int, now: float) -> None:
    """What the dual policy reports after a dispatch (``capped`` when the decision says so)."""
    if getattr(d, "capped", False):
        awd.dispatched(depth, now, d.round_start, True)
    else:
        awd.dispatched(depth, now, d.round_start)


def test_filler_long_step_never_overruns_awds_dispatch_moment() -> None:
    """A short waits in AWD's window (until 1.050 s); a long prompt arrives 5 ms before that.
    A filler long step may run only if it ends by 1.050 s: here none fits (a step costs 10 ms
    to launch), so the short batch goes at 1.050 s. Before, the filler had a floor of one
    bucket (256 tokens, ~15 ms) and pushed the short batch past its moment."""
    cfg = _cfg(awd_w_max_ms=50.0)
    steps, _done, _ = _run(cfg, [_sim("s", 1.0, 16, slo=1.0), _sim("long", 1.045, 3000)], 3.0)
    start_short = next(t for t, plan in steps if plan[0][0] == "s")
    assert start_short <= 1.050 + 1e-6
    # with time for a filler it runs, and still ends by the moment
    steps, _done, _ = _run(cfg, [_sim("s", 1.0, 16, slo=1.0), _sim("long", 1.0, 3000)], 3.0)
    fill = [(t, plan) for t, plan in steps if plan[0][0] == "long" and t < 1.050]
    assert fill
    model = PrefillCostModel.fixed(COEFFS)
    for t, plan in fill:
        assert t + model.step_s([(n, 0) for _, n in plan]) <= 1.050 + 1e-6
