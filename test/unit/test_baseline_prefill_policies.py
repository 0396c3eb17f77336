"""The baselines of issue 34 as prefill policies: SGLang's shortest-prefill-first with budget
reserved for shorter requests (``sglang-spf``) and vLLM's long-prefill threshold
(``vllm-threshold``). Plans checked on hand-built queues (the registry-wide progress and
column tests cover them too)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policy_helpers import CountingKV, FakeReq
from property_profile import property_profile
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.prefill import baselines
from sglang_pd.scheduling.registry import create_prefill_policy
from sglang_pd.scheduling.types import PrefillBudget
from sglang_pd.scheduling.waiting import WaitingQueue
from sglang_pd.sim.request import SimReq


def _budget(tokens: int = 512, chunk: int = 512, slots: int = 8, free: int = 100_000) -> PrefillBudget:
    return PrefillBudget(tokens, chunk, slots, CountingKV(free))


def _plan(name: str, waiting: list[FakeReq], budget: PrefillBudget, **cfg: object) -> list[tuple[str, int]]:
    policy = create_prefill_policy(name, PolicyConfig(**cfg))  # type: ignore[arg-type]
    return [(r.rid, n) for r, n in policy.schedule(waiting, 1.0, budget)]


def test_spf_shorter_waiting_requests_go_before_the_continuation() -> None:
    """The continuation of a long prompt gets only what the shorter waiting ones leave."""
    long_ = FakeReq("long", 0.0, 2000, prefilled_len=512)  # part-way: 1,488 left
    shorts = [FakeReq(f"s{i}", 0.1 + i, 100) for i in range(3)]
    assert _plan("sglang-spf", [long_, *shorts], _budget()) == [
        ("s0", 100), ("s1", 100), ("s2", 100), ("long", 212)]
    assert _plan("fcfs", [long_, *shorts], _budget()) == [("long", 512)]  # what it replaces


def test_spf_orders_by_tokens_still_to_prefill_not_prompt_length() -> None:
    nearly_done = FakeReq("big", 0.0, 3000, prefilled_len=2950)  # 50 left
    fresh = FakeReq("mid", 0.5, 80)
    assert _plan("sglang-spf", [nearly_done, fresh], _budget())[0] == ("big", 50)


def test_spf_never_starts_a_second_unfinished_chunk() -> None:
    a = FakeReq("a", 0.0, 1000)
    b = FakeReq("b", 0.1, 1200)
    c = FakeReq("c", 0.2, 60)
    # a starts (cut by the chunk), b would be a second unfinished one: skipped; c still fits
    assert _plan("sglang-spf", [a, b, c], _budget(tokens=2048, chunk=512)) == [("c", 60), ("a", 512)]


def test_spf_skips_a_fresh_request_without_a_slot_but_stops_at_a_kv_refusal() -> None:
    part = FakeReq("part", 0.0, 900, prefilled_len=500)
    fresh = FakeReq("fresh", 0.1, 50)
    assert _plan("sglang-spf", [part, fresh], _budget(slots=0)) == [("part", 400)]
    assert _plan("sglang-spf", [part, fresh], _budget(free=10)) == []


@pytest.mark.parametrize("threshold,expect", [
    (0, [("long", 256), ("s0", 64), ("s1", 64)]),  # 0: the short-prefill threshold (256)
    (128, [("long", 128), ("s0", 64), ("s1", 64)]),
])
def test_vllm_threshold_caps_a_long_prompt_so_shorts_join_the_step(threshold: int, expect: list) -> None:
    long_ = FakeReq("long", 0.0, 3000)
    shorts = [FakeReq(f"s{i}", 0.1 + i, 64) for i in range(2)]
    assert _plan("vllm-threshold", [long_, *shorts], _budget(tokens=2048),
                 long_prefill_token_threshold=threshold) == expect


def test_vllm_threshold_serves_started_prompts_first_then_fcfs_without_passing() -> None:
    fresh = FakeReq("fresh", 0.0, 100)
    started = FakeReq("started", 0.5, 2000, prefilled_len=256)
    later = FakeReq("later", 1.0, 10)
    # budget 300: the started one first (256, its cap), then FCFS: fresh gets the 44 left
    # (a chunk) and later, behind it, nothing
    assert _plan("vllm-threshold", [fresh, started, later], _budget(tokens=300)) == [
        ("started", 256), ("fresh", 44)]
    cfg = {"prefill_max_partial": 1}
    # with one unfinished already, a fresh long may not start; FCFS stops there
    assert _plan("vllm-threshold", [started, FakeReq("long2", 0.6, 900), later], _budget(tokens=2048),
                 **cfg) == [("started", 256)]


# ---------------------------------------------------------------- the columns path (issue 28)
PROFILE = property_profile(ci_examples=150, long_examples=3000)


def _queue(rng: random.Random, n: int, chunk: int, started: float = 0.1, mu: float = 5.0) -> WaitingQueue:
    """The Scheduler's queue: arrivals with ties, long-tailed prompts (median e**mu tokens; some
    exact chunk multiples, some of 1 token), prefix hits, partly prefilled ones (a ``started``
    share), a few of those with nothing left."""
    wq = WaitingQueue(chunk=chunk)
    t = 0.0
    for i in range(n):
        t += rng.choice((0.0, 1e-3, 0.05))
        prompt = min(int(rng.lognormvariate(mu, 1.5)) + 1, 20_000)
        if rng.random() < 0.1:
            prompt = rng.choice((1, chunk, 2 * chunk, chunk + 1))
        r = SimReq(str(i), t, prompt, 8)
        if rng.random() < 0.1 and prompt > 1:
            r.cached_len = rng.randrange(1, prompt)  # prefix hits: not a start
        r.kv_len = r.cached_len
        if rng.random() < started:
            r.kv_len = rng.randrange(r.kv_len, prompt + 1)  # partly prefilled (or nothing left)
        wq.add(r)
    return wq


@pytest.mark.parametrize("name", ["sglang-spf", "vllm-threshold"])
@PROFILE
@given(n=st.sampled_from((0, 1, 3, 20, 80, 300, 1000)), seed=st.integers(0, 2**32 - 1),
       chunk=st.sampled_from((16, 64, 512, 2048)), tokens_x=st.sampled_from((0, 1, 3, 16)),
       slots=st.sampled_from((0, 1, 4, 64, 1024)), free=st.sampled_from((50, 3_000, 10**9)),
       max_partial=st.sampled_from((1, 2, 4)), threshold=st.sampled_from((0, 8, 100, 4096)),
       started=st.sampled_from((0.0, 0.1, 0.4)), mu=st.sampled_from((3.0, 5.0)))
def test_columns_path_plans_as_the_request_by_request_walk(name: str, n: int, seed: int, chunk: int,
                                                           tokens_x: int, slots: int, free: int,
                                                           max_partial: int, threshold: int,
                                                           started: float, mu: float) -> None:
    """From the Scheduler's ``WaitingQueue`` both baselines plan from its columns (the shared
    planner); from a plain list of the same requests they walk request by request, the rules
    as their docstrings state them. Same plan (same objects, same tokens), same budget left."""
    rng = random.Random(seed)
    wq = _queue(rng, n, chunk, started, mu)
    tokens = max(tokens_x * chunk, rng.choice((1, 7, 300)))
    cfg = PolicyConfig(chunked_prefill_size=chunk, max_prefill_tokens=tokens, prefill_max_partial=max_partial,
                       long_prefill_token_threshold=threshold)
    policy = create_prefill_policy(name, cfg)
    kv_a, kv_b = CountingKV(free), CountingKV(free)
    a, b = PrefillBudget(tokens, chunk, slots, kv_a), PrefillBudget(tokens, chunk, slots, kv_b)
    columns, walked = policy.schedule(wq, 1.0, a), policy.schedule(list(wq), 1.0, b)
    assert [(r.rid, k) for r, k in columns] == [(r.rid, k) for r, k in walked]
    assert all(x is y for (x, _), (y, _) in zip(columns, walked))
    assert (a.token_budget, a.new_req_slots, kv_a.free) == (b.token_budget, b.new_req_slots, kv_b.free)


def test_vllm_threshold_columns_stop_at_a_fresh_one_the_budget_would_cut() -> None:
    """A case the random queues rarely reach (the planner's array rules, not its first-block
    pass: a first block of 500): one started request, then fresh ones of 10 tokens; the budget
    runs out 5 tokens into the 200th fresh one, which may not start (one is unfinished), so the
    walk stops there: the 3-token request behind it does not pass it."""
    wq = WaitingQueue(chunk=512)
    head = SimReq("started", 0.0, 1005, 8)
    head.kv_len = 1000  # 5 left
    for r in [head, *(SimReq(str(i), 1.0 + i, 10, 8) for i in range(498)), SimReq("tiny", 600.0, 3, 8)]:
        wq.add(r)
    policy = create_prefill_policy("vllm-threshold", PolicyConfig(prefill_max_partial=1))
    plans = [[(r.rid, k) for r, k in policy.schedule(w, 1.0, _budget(tokens=2000, slots=1024))]
             for w in (wq, list(wq))]
    assert plans[0] == plans[1] == [("started", 5), *((str(i), 10) for i in range(199))]


def test_columns_path_is_taken_from_the_schedulers_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    """The property above compares two paths, not one with itself: a WaitingQueue takes the
    planner, a list and a step with a time allowance do not."""
    calls: list[int] = []
    real = baselines.plan_numbers
    monkeypatch.setattr(baselines, "plan_numbers", lambda *a, **k: calls.append(1) or real(*a, **k))
    wq = _queue(random.Random(3), 50, 512)
    for name in ("sglang-spf", "vllm-threshold"):
        policy = create_prefill_policy(name, PolicyConfig())
        policy.schedule(list(wq), 1.0, _budget())
        assert not calls
        policy.schedule(wq, 1.0, _budget())
        assert calls
        calls.clear()
