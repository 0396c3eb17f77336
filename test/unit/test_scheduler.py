"""The engine scheduler driven without a model: a fake step appends token 7 to whoever samples.
Every step checks the page conservation invariant and that each request's pages cover its KV."""

from __future__ import annotations

import random

from sglang_pd.core.page_allocator import PageAllocator
from sglang_pd.core.scheduler import Scheduler
from sglang_pd.core.step import ForwardMode
from sglang_pd.engine.request import Req
from sglang_pd.protocol import SamplingParams
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.decode.continuous import ContinuousDecodePolicy
from sglang_pd.scheduling.prefill.fcfs import FcfsPrefillPolicy


def _sched(num_pages: int, page_size: int = 4, chunk: int = 16, max_running: int = 64,
           **cfg_fields: object) -> Scheduler:
    cfg = PolicyConfig(page_size=page_size, chunked_prefill_size=chunk, max_prefill_tokens=chunk,
                       max_running_requests=max_running, **cfg_fields)  # type: ignore[arg-type]
    return Scheduler(PageAllocator(num_pages), cfg, FcfsPrefillPolicy(cfg), ContinuousDecodePolicy(cfg))


def _req(rid: str, prompt_len: int, max_new: int, arrival: float) -> Req:
    return Req(rid=rid, prompt_ids=list(range(prompt_len)), params=SamplingParams(max_new_tokens=max_new),
               arrival=arrival)


def _drive(sched: Scheduler, max_steps: int = 10_000) -> list[tuple[ForwardMode, int]]:
    trace = []
    for _ in range(max_steps):
        step = sched.schedule(now=0.0)
        if step is None:
            break
        trace.append((step.mode, sum(n for _, n in step.plan)))
        if step.mode is ForwardMode.EXTEND:
            sampled = sched.after_extend(step.plan)
        else:
            sched.after_decode(step.reqs)
            sampled = step.reqs
        for r in sampled:
            r.output_ids.append(7)
            if len(r.output_ids) >= r.params.max_new_tokens:
                sched.remove(r)
        sched.check_integrity()
        for r in sched.running + sched.waiting:
            assert len(r.pages) * sched.page_size >= r.kv_len
    return trace


def test_chunked_prefill_then_decode() -> None:
    sched = _sched(num_pages=64)
    r = _req("a", prompt_len=40, max_new=3, arrival=0.0)
    sched.add(r)
    trace = _drive(sched)
    # 40 tokens in chunks of 16, then 2 decode steps (the first token comes from the prefill)
    assert trace == [(ForwardMode.EXTEND, 16), (ForwardMode.EXTEND, 16), (ForwardMode.EXTEND, 8),
                     (ForwardMode.DECODE, 1), (ForwardMode.DECODE, 1)]
    assert r.output_ids == [7, 7, 7]
    assert sched.allocator.num_free == sched.allocator.num_usable


def test_requests_join_while_others_decode() -> None:
    sched = _sched(num_pages=64)
    a = _req("a", 8, 6, 0.0)
    sched.add(a)
    step = sched.schedule(0.0)
    sampled = sched.after_extend(step.plan)
    a.output_ids.append(7)
    assert sampled == [a] and sched.running == [a]
    b = _req("b", 8, 2, 1.0)
    sched.add(b)
    nxt = sched.schedule(1.0)
    assert nxt.mode is ForwardMode.EXTEND and nxt.reqs == [b]  # prefill first, then both decode
    _drive(sched)
    assert len(a.output_ids) == 6 and len(b.output_ids) == 2


def test_retraction_under_memory_pressure_finishes_everything_without_leaks() -> None:
    rng = random.Random(0)
    sched = _sched(num_pages=24, page_size=4, chunk=16)  # 92 usable tokens
    reqs = [_req(str(i), rng.randint(3, 20), rng.randint(5, 30), float(i)) for i in range(12)]
    for r in reqs:
        sched.add(r)
    _drive(sched)
    assert all(len(r.output_ids) == r.params.max_new_tokens for r in reqs)
    assert sched.num_retractions > 0
    assert not sched.has_work
    assert sched.allocator.num_free == sched.allocator.num_usable


def test_retracted_request_resumes_without_resampling() -> None:
    sched = _sched(num_pages=64)
    r = _req("a", 10, 50, 0.0)
    sched.add(r)
    step = sched.schedule(0.0)
    sched.after_extend(step.plan)
    r.output_ids += [7, 8, 9]  # pretend it decoded two more tokens
    r.kv_len = 12
    sched.retract(r)
    assert r.kv_len == 0 and r.pages == [] and r in sched.waiting
    assert r.prefill_remaining == 12  # prompt + all outputs but the newest
    step = sched.schedule(0.0)
    assert sched.after_extend(step.plan) == []  # no new first token for a resumed request
    assert r in sched.running and r.output_ids == [7, 8, 9]


# ---------------------------------------------------------------- progress, hold, mixed, profile
def test_partial_prefill_waits_until_it_fits_beside_a_running_decode() -> None:
    """Issue 22 item 2: a partly prefilled waiting request held the pages the running request
    needed to decode; nothing was scheduled and the engine spun forever. Since issue 28 (the
    progress rule, core/progress.py) b does not start while its prompt cannot fit beside a's
    headroom, so nothing is thrown away and a's decode always gets its page."""
    sched = _sched(num_pages=9, page_size=4, chunk=8)  # 8 usable pages = 32 tokens
    a = _req("a", 7, 20, 0.0)
    sched.add(a)
    sched.after_extend(sched.schedule(0.0).plan)
    a.output_ids.append(7)  # a runs with 7 tokens of KV in 2 pages
    b = _req("b", 24, 2, 1.0)  # fits the pool alone, not beside a's growing KV
    sched.add(b)
    for _ in range(60):
        step = sched.schedule(1.0)
        if step is None:
            assert sched.unblock(1.0) == []
            continue
        if step.mode is ForwardMode.EXTEND:
            for r in sched.after_extend(step.plan):
                r.output_ids.append(7)
        else:
            assert b.pages == [] or not b.prefill_remaining  # b never sits on pages half-done
            sched.after_decode(step.reqs)
            for r in step.reqs:
                r.output_ids.append(7)
                if len(r.output_ids) >= r.params.max_new_tokens:
                    sched.remove(r)
        sched.check_integrity()
        if not sched.has_work:
            break
    assert len(a.output_ids) == 20 and len(b.output_ids) == 2
    assert sched.num_preempted_prefills == 0


def test_decode_growth_takes_pages_from_the_partial_the_policy_ranked_last() -> None:
    """Progress rule 3: when decodes grew into the reserve, the partial prefill thrown away is
    the one the policy's last plan ranked last (not the newest), and never more than
    MAX_PREFILL_PREEMPTIONS times."""
    from sglang_pd.core.progress import MAX_PREFILL_PREEMPTIONS
    sched = _sched(num_pages=17, page_size=4, chunk=8)
    old, new = _req("old", 16, 4, 0.0), _req("new", 16, 4, 1.0)
    for r in (old, new):
        sched.add(r)
        r.pages = sched.allocator.alloc(2)
        r.kv_len = 8
        sched.waiting.refresh(r)
    sched.last_rank = {new: 0, old: 1}  # the policy ran `new` first in its last plan
    runner = _req("run", 4, 8, 0.0)
    runner.pages = sched.allocator.alloc(sched.allocator.num_free)  # the rest of the pool
    runner.kv_len = len(runner.pages) * 4  # its next token needs a new page
    runner.output_ids.append(7)
    sched.running.append(runner)
    sched.check_integrity()
    assert sched._fit_decode([runner]) == [runner]
    assert old.pages == [] and new.pages != []  # old was ranked last: it gave way
    sched.prefill_preemptions[new] = MAX_PREFILL_PREEMPTIONS
    assert sched._victim_partial() is None  # past the bound: never chosen again
    sched.check_integrity()


def test_unblock_frees_partial_prefills_before_aborting_a_retracted_head() -> None:
    """Issue 22 item 2: a retracted request (no pages) ahead of a partial one must not be
    aborted as "needs more KV memory than the pool": the partial gives its pages back."""
    sched = _sched(num_pages=9, page_size=4, chunk=16)
    head, partial = _req("head", 20, 4, 0.0), _req("partial", 30, 4, 1.0)
    sched.add(partial)
    sched.after_extend(sched.schedule(0.0).plan)  # partial takes 16 tokens = 4 pages
    head.output_ids.append(7)
    head.num_retractions = 1
    sched.add(head)  # retracted earlier: arrival 0 puts it first; needs 5 pages, 4 free
    sched.allocator.alloc(1)  # pretend a page is taken elsewhere so head cannot fit beside partial
    assert sched.schedule(2.0) is None
    assert sched.unblock(2.0) == [] and partial.pages == []  # the partial gave way, nobody aborted


def test_unblock_waits_for_parked_and_quarantined_pages() -> None:
    """Issue 22 item 3: pages held by transfers come back on their own: never abort for them."""
    sched = _sched(num_pages=9, page_size=4, chunk=32)
    parked = _req("parked", 24, 4, 0.0)
    sched.park(parked, num_pages=6)
    big = _req("big", 20, 4, 1.0)
    sched.add(big)
    assert sched.schedule(1.0) is None
    assert sched.unblock(1.0) == []  # 6 pages are in flight: wait
    sched.remove(parked)
    assert sched.schedule(1.0) is not None  # now it fits
    too_big = _req("too-big", 40, 4, 2.0)
    sched.add(too_big)
    sched.remove(big)
    # its first chunk would fit, the rest never will: it does not start (progress rule 1)
    assert sched.schedule(2.0) is None and too_big.pages == []
    [(victim, why)] = sched.unblock(2.0)
    assert victim is too_big and "pool holds only 32" in why


def test_hold_is_not_stuck() -> None:
    from sglang_pd.scheduling.types import PrefillBudget, PrefillPolicy

    class Hold(PrefillPolicy):
        name = "hold"

        def schedule(self, waiting, now, budget: PrefillBudget):
            budget.hold_until(10.0)
            return []

    sched = _sched(num_pages=16)
    sched.prefill_policy = Hold()
    sched.add(_req("a", 1000, 4, 0.0))  # larger than the pool, but the policy holds
    assert sched.schedule(1.0) is None and sched.holding(1.0) and sched.hold_deadline == 10.0
    assert sched.unblock(1.0) == []
    assert sched.schedule(11.0) is None and not sched.holding(11.0)


def test_mixed_step_carries_decodes_with_a_chunk_and_profiles_it() -> None:
    sched = _sched(num_pages=64, chunk=16, enable_mixed_chunk=True)
    a = _req("a", 8, 10, 0.0)
    sched.add(a)
    sched.after_extend(sched.schedule(0.0).plan)
    a.output_ids.append(7)
    b = _req("b", 30, 2, 1.0)
    sched.add(b)
    step = sched.schedule(1.0)
    assert step.mode is ForwardMode.MIXED and step.prefill_plan == [(b, 16)] and step.decode_reqs == [a]
    prof = step.profile()
    assert (prof.batch_size, prof.new_tokens, prof.num_decode) == (2, 17, 1)
    assert (prof.context_tokens, prof.max_context_tokens) == (8, 8)  # b has no KV yet; a has 8
    assert step.shape.bucket is None  # only pure prefill steps are padded to the grid


def test_extend_step_shape_uses_the_bucket_grid() -> None:
    sched = _sched(num_pages=64, chunk=64)
    sched.add(_req("a", 30, 2, 0.0))
    sched.add(_req("b", 20, 2, 0.0))
    step = sched.schedule(0.0)
    # (L, B): both requests padded to the longest one's length bucket, 30 -> 32
    assert step.shape.num_tokens == 50 and step.shape.batch_size == 2 and step.shape.bucket == (32, 2)
