"""Progress rule 2b (core/progress.py): bounded backfill after a fresh prompt is refused for
pages. Issue 28, session 7: a fresh long prompt ranked first and refused by rule 1's reservation
ended the policy's walk, and short prompts ranked behind it waited although they fitted (the
Medha scenario's head-of-line wait)."""

from __future__ import annotations

import pytest

from progress_sim import build, drive
from sglang_pd.core.step import ForwardMode
from sglang_pd.sim.request import SimReq

POOL = dict(num_pages=100, chunked_prefill_size=512, max_prefill_tokens=1024)


def _setup(policy: str, long_slo_s: float, role: str = "colocated"):  # type: ignore[no-untyped-def]
    """100 pages of 16 tokens; a running request holds 61 (colocated) or a parked one 60 (PD
    prefill); an 800-token prompt (50 pages) arrived first and does not fit; a 16-token prompt
    behind it does."""
    sched = build(policy, "continuous", role, colocated_decode="prefill-first", **POOL)  # type: ignore[arg-type]
    holder = SimReq("holder", 0.0, 960, 1000)
    if role == "colocated":
        holder.pages = sched.allocator.alloc(61)  # 960 tokens + the next token's page
        sched.start_running(holder, 960)
    else:
        sched.park(holder, num_pages=60)  # its KV in flight to the decode side
    sched.add(SimReq("long", 0.0, 800, 8, slo_ttft_s=long_slo_s))
    sched.add(SimReq("short", 0.5, 16, 8, slo_ttft_s=2.0))
    return sched


def _blocked(policy: str, long_slo_s: float, role: str = "colocated"):  # type: ignore[no-untyped-def]
    """``_setup``'s scheduler and its step at t = 1 s."""
    sched = _setup(policy, long_slo_s, role)
    return sched, sched.schedule(1.0)


@pytest.mark.parametrize("policy", ["fcfs", "edf", "lrs", "lars"])
@pytest.mark.parametrize("role", ["colocated", "prefill"])
def test_a_short_prompt_behind_a_refused_long_one_is_planned(policy: str, role: str) -> None:
    """The head-of-line wait: the long one (within its 1.8 s target) is refused, the short one
    behind it fits and goes on in the same step; the long one took nothing."""
    sched, step = _blocked(policy, long_slo_s=1.8, role=role)
    assert step is not None and [(r.rid, n) for r, n in step.prefill_plan] == [("short", 16)]
    long = next(r for r in sched.waiting if r.rid == "long")
    assert not long.pages


@pytest.mark.parametrize("policy", ["fcfs", "edf"])
def test_an_overdue_refused_prompt_stops_the_backfill(policy: str) -> None:
    """The guard: the long one has waited past its 0.5 s target, so nothing fresh goes on past
    it: the pages freed next go to it (the step only decodes)."""
    _, step = _blocked(policy, long_slo_s=0.5)
    assert step is not None and step.mode is ForwardMode.DECODE and not step.prefill_plan


@pytest.mark.parametrize("policy", ["fcfs", "edf"])
def test_backfill_lets_shorts_pass_a_refused_prompt_and_stops_at_its_target(policy: str) -> None:
    """A pool kept full by a stream of short prompts (one every 10 ms, more than it serves) and a
    long prompt (75 of the 120 pages) arriving among them, ranked first by both policies. Before
    its 1 s target, shorts that fit start past it (without rule 2b none did: it was the head and
    refused); once it is overdue the pages freed go to it, so it starts within its target plus
    the time running shorts take to free its pages (without the guard the shorts kept taking
    them: 1.76 s instead of 1.06 s)."""
    gap, target, arrival = 0.01, 1.0, 0.105
    reqs = [SimReq("long", arrival, 1200, 8, slo_ttft_s=target)]
    reqs += [SimReq(f"s{i}", gap * i, 128, 60, slo_ttft_s=2.0) for i in range(300)]
    sched = build(policy, "continuous", "colocated", 120, chunked_prefill_size=512,
                  max_prefill_tokens=1024, colocated_decode="prefill-first")
    out = drive(sched, reqs)
    assert len(out.finished) == len(reqs) and not out.aborted
    long_start = out.first_token["long"]
    passed = [r.rid for r in reqs[1:] if r.arrival > arrival and out.first_token[r.rid] < long_start]
    assert passed  # backfilled past the refused head
    assert target <= long_start - arrival < target + 0.3  # backfill ran until its target, then stopped


def test_no_backfill_while_the_policy_holds() -> None:
    """A policy that waits (``budget.hold_until``, AWD filling a batch) chose not to run more
    now: a refusal in its walk does not let fresh requests past it."""
    from sglang_pd.scheduling.types import PrefillPolicy

    class HoldAfterRefusal(PrefillPolicy):
        name = "hold-after-refusal"

        def schedule(self, waiting, now, budget):  # type: ignore[no-untyped-def]
            budget.grant(waiting[0])  # the long one: refused for pages
            budget.hold_until(now + 0.5)
            return []

    sched = _setup("fcfs", long_slo_s=1.8)
    sched.prefill_policy = HoldAfterRefusal()
    step = sched.schedule(1.0)
    assert step is not None and step.mode is ForwardMode.DECODE and not step.prefill_plan
