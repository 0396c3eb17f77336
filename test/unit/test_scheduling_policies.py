from __future__ import annotations


from policy_helpers import CountingKV, FakeReq
from sglang_pd.scheduling.prefill.fcfs import FcfsPrefillPolicy
from sglang_pd.scheduling.types import PrefillBudget, SchedReq


def _budget(tokens: int = 100, chunk: int = 64, slots: int = 8, kv: int = 10_000) -> PrefillBudget:
    return PrefillBudget(token_budget=tokens, chunk_size=chunk, new_req_slots=slots, kv=CountingKV(kv))


def test_fake_req_satisfies_protocol() -> None:
    assert isinstance(FakeReq("a", 0.0, 5), SchedReq)


def test_fcfs_packs_in_order_and_chunks_the_long_one() -> None:
    reqs = [FakeReq("a", 0.0, 30), FakeReq("b", 1.0, 200), FakeReq("c", 2.0, 5)]
    plan = FcfsPrefillPolicy().schedule(reqs, now=3.0, budget=_budget(tokens=100, chunk=64))
    # a fits whole; b gets one chunk of 64 and nothing may pass it
    assert [(r.rid, n) for r, n in plan] == [("a", 30), ("b", 64)]


def test_fcfs_head_of_line_blocks_when_kv_is_short() -> None:
    reqs = [FakeReq("a", 0.0, 50), FakeReq("b", 1.0, 5)]
    plan = FcfsPrefillPolicy().schedule(reqs, now=1.0, budget=_budget(kv=40, chunk=64))
    assert plan == []  # strict FCFS: b does not overtake a


def test_budget_counts_new_request_slots() -> None:
    reqs = [FakeReq(str(i), float(i), 4) for i in range(5)]
    plan = FcfsPrefillPolicy().schedule(reqs, now=9.0, budget=_budget(slots=3))
    assert [r.rid for r, _ in plan] == ["0", "1", "2"]


def test_started_request_needs_no_new_slot() -> None:
    started = FakeReq("a", 0.0, 100, prefilled_len=64)
    plan = FcfsPrefillPolicy().schedule([started], now=1.0, budget=_budget(slots=0))
    assert [(r.rid, n) for r, n in plan] == [("a", 36)]
