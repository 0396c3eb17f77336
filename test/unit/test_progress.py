"""The progress rule (core/progress.py), each bug of issue 28 as a scenario on the real
torch-free Scheduler in virtual time (test/unit/progress_sim.py checks the invariants)."""

from __future__ import annotations

import pytest

from progress_sim import build, drive
from sglang_pd.core.progress import MAX_PREFILL_PREEMPTIONS, pick_victim
from sglang_pd.scheduling.registry import PREFILL_POLICIES
from sglang_pd.sim.request import SimReq

POOL = dict(page_size=16, chunked_prefill_size=512, max_prefill_tokens=1024)


@pytest.mark.parametrize("queues", ["single", "dual"])
@pytest.mark.parametrize("policy", sorted(PREFILL_POLICIES))
def test_two_prompts_in_a_1600_token_pool_both_finish(policy: str, queues: str) -> None:
    """Issue 28: 100 pages x 16 tokens, two 1,200-token prompts, the newer with a 0.5 s TTFT SLO
    arriving during the older's prefill. edf, lars and lrs threw the newer partial away and
    restarted it for ever (the newer ranked first, took the older's pages, the refusal ended
    the step, unblock preempted the newest partial)."""
    sched = build(policy, "continuous", "colocated", 100, prefill_queues=queues, **POOL)
    old = SimReq("old", 0.0, 1200, 8)
    new = SimReq("new", 0.015, 1200, 8, slo_ttft_s=0.5)  # after the first chunk
    out = drive(sched, [old, new], max_iters=5000)
    assert set(out.finished) == {"old", "new"} and not out.aborted
    assert out.preempted == 0  # nothing thrown away: the newer waits until it fits
    assert out.steps < 40


def test_pd_prefill_never_throws_away_a_partial_holding_all_its_pages() -> None:
    """Issue 28: on a PD prefill server (whole-prompt pages at the first chunk) a fresh prompt
    ranked first that does not fit ended the step; the partial holding all its pages got
    nothing and unblock threw it away."""
    sched = build("edf", "continuous", "prefill", 100, **POOL)
    old = SimReq("old", 0.0, 1200, 1)
    new = SimReq("new", 0.01, 1000, 1, slo_ttft_s=0.1)
    out = drive(sched, [old, new], role="prefill", max_iters=5000)
    assert set(out.finished) == {"old", "new"} and out.preempted == 0


def test_dual_queues_without_a_free_slot_keep_started_long_prefills_going() -> None:
    """Issue 28: with no free request slot the AWD short batch (fresh requests) could not be
    granted, the plan came back empty, started long prefills stalled and one was thrown away."""
    reqs = [SimReq("long0", 0.0, 2000, 4), SimReq("long1", 0.0, 2000, 4)]
    reqs += [SimReq(f"short{i}", 0.001 * i, 64, 4, slo_ttft_s=0.2) for i in range(1, 6)]
    sched = build("edf", "continuous", "colocated", 1000, prefill_queues="dual", max_running_requests=2,
                  page_size=16, chunked_prefill_size=256, max_prefill_tokens=512, prefill_max_partial=2)
    out = drive(sched, reqs, max_iters=5000)
    assert len(out.finished) == len(reqs) and out.preempted == 0
    assert out.first_token["long0"] < out.first_token["short1"]  # the longs were not stalled


def test_pick_victim_follows_the_policy_order_and_the_bound() -> None:
    a, b, c = SimReq("a", 0, 64, 1), SimReq("b", 1, 64, 1), SimReq("c", 2, 64, 1)
    for r in (a, b, c):
        r.pages = [1]
    # the last plan ran c then a; b was left out: b ranks last, then a (c first)
    assert pick_victim([a, b, c], {c: 0, a: 1}, {}, 16) is b
    assert pick_victim([a, b, c], {c: 0, a: 1}, {b: MAX_PREFILL_PREEMPTIONS}, 16) is a
    a.pages = [1, 2, 3, 4]  # holds every page of its prompt: never a victim
    assert pick_victim([a], {}, {}, 16) is None
    assert pick_victim([b], {}, {b: MAX_PREFILL_PREEMPTIONS}, 16, bounded=False) is b


def test_a_hold_due_now_is_a_hold_not_a_stuck_queue() -> None:
    """Found by the property tests: AWD (dual queues) answered at its own dispatch moment with
    ``hold_until == now``; the scheduler read that as no hold, and unblock aborted the request
    as "a policy bug" (a 503 on a real server)."""
    from sglang_pd.scheduling.types import PrefillPolicy

    class DueNow(PrefillPolicy):
        name = "due-now"

        def schedule(self, waiting, now, budget):  # type: ignore[no-untyped-def]
            budget.hold_until(now)
            return []

    sched = build("fcfs", "continuous", "colocated", 10, page_size=16)
    sched.prefill_policy = DueNow()
    sched.add(SimReq("a", 0.0, 16, 1))
    assert sched.schedule(0.5) is None and sched.holding(0.5)
    assert sched.unblock(0.5) == []
