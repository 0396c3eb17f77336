"""The baselines of issue 34 as prefill policies: SGLang's shortest-prefill-first with budget
reserved for shorter requests (``sglang-spf``) and vLLM's long-prefill threshold
(``vllm-threshold``). Plans checked on hand-built queues (the registry-wide progress and
column tests cover them too)."""

from __future__ import annotations

import pytest
from policy_helpers import CountingKV, FakeReq
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.registry import create_prefill_policy
from sglang_pd.scheduling.types import PrefillBudget


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
