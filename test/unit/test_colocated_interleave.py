"""Colocated servers interleave prefill with running decodes by a time budget
(scheduling/colocated.py): the torch-free Scheduler in virtual time, step times from a fixed
prefill cost model and a linear decode table. Before the rule every waiting prefill ran first:
a burst of 3K-token prompts kept the running decodes waiting for seconds."""

from __future__ import annotations

import pytest

from sglang_pd.core.page_allocator import CountingAllocator
from sglang_pd.core.scheduled_step import ScheduledStep
from sglang_pd.core.scheduler import Scheduler
from sglang_pd.core.step import ForwardMode, StepProfile, StepShape
from sglang_pd.scheduling.colocated import MIN_TOKENS, NO_SLO_TARGET_S, PREFILL_SHARE, ColocatedInterleave
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.cost_model import PrefillCoeffs, PrefillCostModel
from sglang_pd.scheduling.prefill.chunking import largest_chunk
from sglang_pd.scheduling.registry import create_decode_policy, create_prefill_policy
from sglang_pd.sim.request import SimReq

# CPU-like: a 512-token chunk ~0.1 s, a decode step 10 ms + 0.5 ms per request
COEFFS = PrefillCoeffs(launch_s=2e-3, per_req_s=1e-4, a=1e-9, b=2e-4, g_w=0.0, g_r=1e-8)


def drive(prefill: str, decode: str, mixed: bool, slo_tpot_ms: float | None = None, decode_base_s: float = 0.01,
          colocated_decode: str = "interleave"):
    """Four short requests decoding, then a burst of twelve 3K prompts and more shorts.
    A decode step takes ``decode_base_s`` + 0.5 ms per request.
    Returns the steps as (mode, start, duration, prefill seconds, running before the step)."""
    cfg = PolicyConfig(chunked_prefill_size=512, max_prefill_tokens=2048, page_size=16,
                       enable_mixed_chunk=mixed, slo_tpot_ms=slo_tpot_ms, colocated_decode=colocated_decode,
                       prefill_queues="dual" if prefill == "dual" else "single")
    model = PrefillCostModel.fixed(COEFFS)
    sched = Scheduler(CountingAllocator(4000), cfg,
                      create_prefill_policy("fcfs" if prefill == "dual" else prefill, cfg),
                      create_decode_policy(decode, cfg))
    if getattr(sched, "interleave", None) is not None:
        sched.interleave.model = model  # as with a measured profile: predictions are exact
    arrivals = [SimReq(f"d{i}", 0.0, 64, output_len=150, slo_tpot_s=0.1) for i in range(4)]
    arrivals += [SimReq(f"L{i}", 0.3 + 0.01 * i, 3072, output_len=4) for i in range(12)]
    arrivals += [SimReq(f"s{i}", 0.35 + 0.05 * i, 100, output_len=20) for i in range(10)]
    pending, now, steps = sorted(arrivals, key=lambda r: r.arrival), 0.0, []
    for _ in range(100_000):
        while pending and pending[0].arrival <= now:
            sched.add(pending.pop(0))
        if not sched.has_work:
            if not pending:
                return steps, arrivals
            now = pending[0].arrival
            continue
        running = len(sched.running)
        step = sched.schedule(now)
        if step is None:
            now = sched.hold_deadline or (pending[0].arrival if pending else now + 1e-3)
            continue
        pre = model.step_s((n, r.kv_len) for r, n in step.prefill_plan) if step.prefill_plan else 0.0
        if step.mode is ForwardMode.MIXED:
            pre -= COEFFS.launch_s  # one forward: the decode part pays the launch
        dur = pre + (decode_base_s + 5e-4 * step.num_decode if step.num_decode else 0.0)
        steps.append((step.mode, now, dur, pre, running))
        sched.observe(step.profile(total_s=dur), dur, now + dur)
        now += dur
        for r in sched.after_extend(step.prefill_plan):
            r.n_generated, r.first_token_time = 1, now
        decodes = step.decode_reqs
        sched.after_decode(decodes)
        for r in decodes:
            r.n_generated += 1
            if r.done:
                r.finish_time = now
                sched.remove(r)
        for r in list(sched.running):  # prefill-made last token
            if r.done:
                r.finish_time = now
                sched.remove(r)
        sched.check_integrity()
    raise AssertionError("not finished")


@pytest.mark.parametrize("decode_base_s", [0.01, 0.04])
@pytest.mark.parametrize("mixed", [False, True])
@pytest.mark.parametrize("decode", ["continuous", "slack+"])
@pytest.mark.parametrize("prefill", ["fcfs", "kairos+", "dual"])
def test_prefill_never_delays_a_decode_by_more_than_the_budget(prefill: str, decode: str, mixed: bool,
                                                               decode_base_s: float) -> None:
    """With decodes running, the prefill time between two decode steps is at most B (no TPOT
    SLO set): 1.5x the decode step time where decode steps take ~40 ms, 50 ms less the decode
    step where they take ~10 ms; plus one per-request overhead per extra request in the step;
    every request finishes."""
    steps, reqs = drive(prefill, decode, mixed, decode_base_s=decode_base_s)
    assert all(r.finish_time is not None for r in reqs)
    min_decode = min(dur for mode, _, dur, _, _ in steps if mode is ForwardMode.DECODE)
    max_decode = 0.0
    waited = 0.0  # prefill seconds since the last step that decoded
    n_prefill_with_decodes = 0
    for mode, _, dur, pre, running in steps:
        if mode is ForwardMode.DECODE:
            max_decode = max(max_decode, dur)
            waited = 0.0
            continue
        if not running:
            continue
        n_prefill_with_decodes += 1
        waited += pre
        b = max(PREFILL_SHARE * max_decode, NO_SLO_TARGET_S - min_decode)
        bound = b + 8 * (COEFFS.per_req_s + COEFFS.g_r * 3072)
        assert waited <= max(bound, COEFFS.launch_s + 3 * MIN_TOKENS * COEFFS.b), (mode, waited, bound)
        if mode is ForwardMode.MIXED:
            waited = 0.0  # the decodes rode along
    assert n_prefill_with_decodes > 20  # the burst really was prefilled beside running decodes


def test_the_tpot_slo_is_the_step_target() -> None:
    """With a TPOT SLO, a decode waits for at most (SLO - decode step) of prefill: the decode
    requests' inter-token gaps stay within the 100 ms SLO (plus per-request overheads)."""
    steps, _reqs = drive("fcfs", "continuous", mixed=False, slo_tpot_ms=100.0)
    gap, last = 0.0, None
    for mode, start, dur, _, _running in steps:
        if mode is ForwardMode.DECODE:
            if last is not None:
                gap = max(gap, start + dur - last)
            last = start + dur
    assert gap <= 0.1 + 0.005


def test_prefill_first_is_the_old_rule_for_comparisons() -> None:
    """``--colocated-decode prefill-first`` (A/B runs: the rule before the interleave, Medha's
    paper's comparison point): every waiting prefill runs before a decode, so the burst of 3K
    prompts holds the running decodes for seconds; the interleave on the same load keeps the
    gap to one TPOT-SLO step. Both finish every request."""
    def worst_gap(steps) -> float:
        gap, last = 0.0, None
        for mode, start, dur, _, _running in steps:
            if mode is not ForwardMode.EXTEND:
                if last is not None:
                    gap = max(gap, start + dur - last)
                last = start + dur
        return gap

    old, old_reqs = drive("fcfs", "continuous", mixed=False, slo_tpot_ms=100.0, colocated_decode="prefill-first")
    new, new_reqs = drive("fcfs", "continuous", mixed=False, slo_tpot_ms=100.0)
    assert all(r.finish_time is not None for r in old_reqs + new_reqs)
    assert worst_gap(new) <= 0.1 + 0.005
    assert worst_gap(old) > 1.0  # twelve 3K prompts (~1.2 s of prefill) before the next decode
    with pytest.raises(ValueError, match="colocated_decode"):
        PolicyConfig(colocated_decode="decode-first")


def test_budget_rule() -> None:
    cfg = PolicyConfig(chunked_prefill_size=512)
    lace = ColocatedInterleave(cfg, PrefillCostModel.fixed(COEFFS))
    lace.decode_s = 0.1  # a CPU's decode step: 1.5 of them
    assert lace.budget_s() == pytest.approx(0.15)
    lace.decode_s = 0.004  # a GPU's: 50 ms less the decode step, not 6 ms
    assert lace.budget_s() == pytest.approx(0.046)
    lace.decode_s = 0.02
    assert lace.budget_s() == pytest.approx(0.03)
    n = lace.prefill_tokens(0, 512)
    assert lace.model.step_s([(n, 0)]) <= 0.03 < lace.model.step_s([(n + 1, 0)])
    assert lace.prefill_tokens(3000, 512) < n  # the same budget buys fewer tokens over a long context
    slo = ColocatedInterleave(PolicyConfig(slo_tpot_ms=50.0), PrefillCostModel.fixed(COEFFS))
    slo.decode_s = 0.02
    assert slo.budget_s() == pytest.approx(0.03)
    slo.decode_s = 0.2  # SLO tighter than the decode step: prefill still moves
    assert slo.prefill_tokens(0, 512) == MIN_TOKENS
    assert lace.decode_turn(True) and not lace.decode_turn(False)
    # a launch worth many tokens: no step smaller than the launch's worth (fixed model)
    heavy = ColocatedInterleave(cfg, PrefillCostModel.fixed(PrefillCoeffs(launch_s=0.1, b=1e-3)))
    heavy.decode_s = 0.01
    assert heavy.floor_tokens() == 100 and heavy.prefill_tokens(0, 512) == 100
    mixed = ColocatedInterleave(PolicyConfig(enable_mixed_chunk=True), PrefillCostModel.fixed(COEFFS))
    assert not mixed.decode_turn(True)


def test_measured_ratio_caps_a_prior_that_is_far_off() -> None:
    """The cost model's prior says 25K tokens/s (a GPU); the CPU does 200. After one measured
    prefill step the cap follows the measured/predicted ratio (99x), not the prior's 512-token
    chunks: the prior's launch alone, scaled, is over B, so the step gets the floor."""
    lace = ColocatedInterleave(PolicyConfig(chunked_prefill_size=512))  # the default prior
    lace.decode_s = 0.2
    assert lace.prefill_tokens(0, 512) == 512  # the prior: 300 ms buys every token
    step = StepProfile(ForwardMode.EXTEND, 1, 500, 0, 0, StepShape(1, 500), total_s=2.5)
    lace.observe(step, 2.5)
    assert lace.scale == pytest.approx(2.5 / lace.model.step_s([(500, 0)]))
    assert lace.prefill_tokens(0, 512) == MIN_TOKENS


def test_measured_ratio_is_not_a_long_contexts_token_rate() -> None:
    """A step over 500K tokens of context costs ~25x a short one per token; measuring it (on a
    machine 2x slower than the prior) must not hold a short prompt's chunk to its per-token
    rate (the Medha scenario's regression): the short one's cap is B at 2x its own cost."""
    prior = PrefillCoeffs(launch_s=1e-3, per_req_s=0.0, a=0.0, b=1e-5, g_w=0.0, g_r=5e-7)
    lace = ColocatedInterleave(PolicyConfig(chunked_prefill_size=4096), PrefillCostModel(prior))
    lace.decode_s = 0.02  # B = 30 ms
    long_step = StepProfile(ForwardMode.EXTEND, 1, 125, 500_000, 500_000, StepShape(1, 125))
    truth = 2 * PrefillCostModel.fixed(prior).step_s([(125, 500_000)])
    lace.observe(long_step, truth)
    assert lace.scale == pytest.approx(2.0)
    b = lace.budget_s() - 2 * prior.launch_s
    assert abs(lace.prefill_tokens(0, 4096) - b / (2 * prior.b)) <= 1  # 1,400: at its own cost
    assert lace.prefill_tokens(0, 4096) > 10 * int(b / (truth / 125))  # the old per-token rule: 7


def next_step(sched: Scheduler, now: float) -> ScheduledStep:
    """The next step, past a policy's holds (AWD's batching window under dual queues)."""
    for _ in range(10):
        step = sched.schedule(now)
        if step is not None:
            return step
        assert sched.hold_deadline is not None
        now = sched.hold_deadline
    raise AssertionError("no step")


def decoding_scheduler(policy_name: str, cfg: PolicyConfig, model: PrefillCostModel
                       ) -> tuple[Scheduler, ColocatedInterleave]:
    """A colocated Scheduler on ``model`` with one request already decoding (so the interleave
    applies from the next step on), and its interleave."""
    policy = create_prefill_policy(policy_name, cfg)
    policy.use_cost_model(model)
    sched = Scheduler(CountingAllocator(60_000), cfg, policy, create_decode_policy("continuous", cfg))
    lace = sched.interleave
    assert lace is not None
    lace.model = model
    d0 = SimReq("d0", 0.0, 64, output_len=100, slo_ttft_s=2.0)
    sched.add(d0)
    sched.after_extend(next_step(sched, 0.0).prefill_plan)
    assert d0 in sched.running  # decodes run from now on: the interleave applies
    return sched, lace


@pytest.mark.parametrize("prefill", ["edf", "sjf", "kairos+", "dual"])
def test_a_short_prompt_beside_a_long_partial_gets_a_chunk_for_its_own_context(prefill: str) -> None:
    """Issue 28 (the Medha scenario's regression): with decodes running and a 262K-token
    partial prefill waiting, a short prompt the policy ranks first gets the chunk B buys at ITS
    context (139 tokens here), not the 32-token floor that is all B buys at the long one's
    context (the old step-wide cap); the whole step stays within B."""
    coeffs = PrefillCoeffs(launch_s=2e-3, per_req_s=0.0, a=1e-8, b=2e-4, g_w=0.0, g_r=1e-8)
    model = PrefillCostModel.fixed(coeffs)
    cfg = PolicyConfig(chunked_prefill_size=4096, max_prefill_tokens=8192, page_size=16,
                       slo_ttft_ms=2000.0, prefill_queues="dual" if prefill == "dual" else "single")
    sched, lace = decoding_scheduler("fcfs" if prefill == "dual" else prefill, cfg, model)
    long = SimReq("L", 0.0, 600_000, output_len=4, slo_ttft_s=600.0, kv_len=262_144)
    long.pages = sched.allocator.alloc(262_144 // 16)  # partly prefilled, holding its pages
    short = SimReq("s", 0.01, 200, output_len=4, slo_ttft_s=2.0)
    sched.add(long)
    sched.add(short)
    sched.check_integrity()
    step = next_step(sched, 0.01)
    assert step.mode is ForwardMode.EXTEND
    got = {r.rid: n for r, n in step.prefill_plan}
    assert lace.prefill_tokens(long.kv_len, 200) == MIN_TOKENS  # all B buys at the long one's context
    assert got["s"] == lace.prefill_tokens(0, 200) == 139  # B at its own context
    spent = sum(model.marginal_s(n, r.kv_len) for r, n in step.prefill_plan)
    assert spent <= lace.budget_s() - coeffs.launch_s  # the whole step within B


def test_a_long_partial_ranked_first_leaves_the_short_prompts_behind_it_their_time() -> None:
    """Issue 28 (the Medha scenario, session 5): edf ranks a late 262K-token partial first; its
    chunk over that context could spend the whole step's time (B), and the short prompt behind
    it waited a step (every step, while the long one lasted: short p90 TTFT 1.2 -> 45 s). Now
    the long one leaves the shorts their predicted time, at most 1 - chunk/step tokens (here
    half) of B: both progress, the long one first, the whole step within B."""
    coeffs = PrefillCoeffs(launch_s=2e-3, per_req_s=0.0, a=1e-10, b=2e-5, g_w=0.0, g_r=1e-9)
    model = PrefillCostModel.fixed(coeffs)
    cfg = PolicyConfig(chunked_prefill_size=4096, max_prefill_tokens=8192, page_size=16, slo_ttft_ms=2000.0)
    sched, lace = decoding_scheduler("edf", cfg, model)
    long = SimReq("L", 0.0, 600_000, output_len=4, slo_ttft_s=1.0, kv_len=262_144)  # late: ranked first
    long.pages = sched.allocator.alloc(262_144 // 16)
    short = SimReq("s", 0.01, 200, output_len=4, slo_ttft_s=2.0)
    sched.add(long)
    sched.add(short)
    step = next_step(sched, 5.0)
    assert [r.rid for r, _ in step.prefill_plan] == ["L", "s"]
    got = {r.rid: n for r, n in step.prefill_plan}
    assert got["s"] == 200  # the short prompt whole, in the same step
    b = lace.budget_s() - coeffs.launch_s
    assert lace.prefill_tokens(long.kv_len, 4096) > got["L"] >= largest_chunk(model, b / 2, long.kv_len, 4096)
    spent = sum(model.marginal_s(n, r.kv_len) for r, n in step.prefill_plan)
    assert spent <= b  # the whole step within B


def test_tokens_a_time_cut_leaves_go_to_the_next_requests_of_the_order() -> None:
    """Issue 28 (the Medha scenario, session 6): edf ranks two late long partials first; each
    was planned a full 4K chunk (the step's 8K tokens), the time allowance lets each take a few
    hundred, and the short prompt ranked third was in no step while they lasted (4,869 steps
    at QPS 0.25 held long ones only while shorts waited). The tokens the time cut leaves are
    planned again down the order: the short prompt is granted whole in the same step, the
    long ones still progress, the whole step within B."""
    coeffs = PrefillCoeffs(launch_s=2e-3, per_req_s=0.0, a=1e-10, b=5e-6, g_w=0.0, g_r=1e-9)  # 4K fit at 0
    model = PrefillCostModel.fixed(coeffs)
    cfg = PolicyConfig(chunked_prefill_size=4096, max_prefill_tokens=8192, page_size=16, slo_ttft_ms=2000.0)
    sched, lace = decoding_scheduler("edf", cfg, model)
    longs = []
    for i, ctx in enumerate((262_144, 131_072)):
        r = SimReq(f"L{i}", 0.001 * i, ctx + 40_000, output_len=4, slo_ttft_s=1.0, kv_len=ctx)  # late: first
        r.pages = sched.allocator.alloc(ctx // 16)
        longs.append(r)
        sched.add(r)
    sched.add(SimReq("s", 0.01, 200, output_len=4, slo_ttft_s=2.0))
    step = next_step(sched, 5.0)
    assert lace.prefill_tokens(0, 4096) == 4096  # each long one planned a full chunk: 8K, the step's
    assert [r.rid for r, _ in step.prefill_plan] == ["L0", "L1", "s"]
    got = {r.rid: n for r, n in step.prefill_plan}
    assert got["s"] == 200  # whole, beside the two long ones
    assert got["L0"] > 0 and got["L1"] > 0 and got["L0"] + got["L1"] < 4096  # both cut by time
    spent = sum(model.marginal_s(n, r.kv_len) for r, n in step.prefill_plan)
    assert spent <= lace.budget_s() - coeffs.launch_s  # the whole step within B
