"""The engine scheduler driven without a model: a fake step appends token 7 to whoever samples.
Every step checks the page conservation invariant and that each request's pages cover its KV."""

from __future__ import annotations

import random

from sglang_pd.engine.forward_batch import ForwardMode
from sglang_pd.engine.page_allocator import PageAllocator
from sglang_pd.engine.request import Req
from sglang_pd.engine.scheduler import Scheduler
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
